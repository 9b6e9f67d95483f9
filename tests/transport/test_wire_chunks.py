"""Chunked encoding: the pieces are the msgpack message byte for byte, and large tensor sections
are the payload's own objects (referenced, not copied)."""

from __future__ import annotations

import msgpack
import pytest

from netsense.compression import Payload
from netsense.transport.channel import _Incoming
from netsense.transport.wire import Hello, Params, Probe, Push, _body, decode_message, encode_chunks, encode_message

BIG = bytes(range(256)) * 1024  # 256 KiB: above the inline threshold
SMALL = Payload("fp32", (2, 3), "float32", (bytes(24),))


def _messages() -> list[object]:
    big = Payload("fp32", (len(BIG) // 4,), "float32", (BIG,))
    many = {f"k{i}": SMALL for i in range(40)}  # a map16 header
    return [
        Hello("w0", 0, bytes(32)),
        Push(3, 8, 42, {"big": big, **many}),
        Params(2, True, {"a": big, "b": Payload("qsgd:8", (5,), "float32", (BIG, b"yz"), (1.0, 2.5))}),
        Probe(bytes(70_000)),
        Probe(bytes(1 << 17)),
    ]


@pytest.mark.parametrize("msg", _messages(), ids=lambda m: type(m).__name__)
def test_chunks_are_the_msgpack_message(msg: object) -> None:
    chunks = encode_chunks(msg)  # type: ignore[arg-type]
    assert b"".join(chunks) == msgpack.packb(_body(msg), use_bin_type=True)  # type: ignore[arg-type]
    assert decode_message(encode_message(msg)) == msg  # type: ignore[arg-type]


def test_large_sections_are_referenced_not_copied() -> None:
    msg = _messages()[1]
    chunks = encode_chunks(msg)  # type: ignore[arg-type]
    assert any(c is BIG for c in chunks)
    assert sum(len(c) for c in chunks if c is not BIG) < 4096  # the rest is the small header


def test_small_message_is_one_chunk() -> None:
    assert len(encode_chunks(Hello("w0", 0, bytes(32)))) == 1


def test_incoming_joins_pieces_and_keeps_a_single_piece() -> None:
    one = _Incoming()
    data = b"abc"
    one.add(data)
    assert one.message() is data and one.size == 3
    many = _Incoming()
    for piece in (b"ab", b"", b"cde"):
        many.add(piece)
    assert many.message() == b"abcde" and many.size == 5
