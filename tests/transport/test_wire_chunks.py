"""Framed messages: large byte fields travel after the msgpack header, referenced, never copied by
the sender nor by the receiver, and a frame whose references do not tile the message is refused."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netsense.compression import Payload, make_codec
from netsense.compression.bench import DEFAULT_SPECS
from netsense.errors import ProtocolError
from netsense.transport.channel import _Incoming
from netsense.transport.wire import (
    FRAMED,
    PROTOCOL_VERSION,
    SECTION_EXT,
    Hello,
    Params,
    Probe,
    Push,
    decode_message,
    encode_chunks,
    encode_message,
)

BIG = bytes(range(256)) * 1024  # 256 KiB: above the inline limit
SMALL = Payload("fp32", (2, 3), "float32", (bytes(24),))


def _messages() -> list[object]:
    big = Payload("fp32", (len(BIG) // 4,), "float32", (BIG,))
    many = {f"k{i}": SMALL for i in range(40)}
    return [
        Push(3, 8, 42, {"big": big, **many}),
        Params(2, True, {"a": big, "b": Payload("qsgd:8", (5,), "float32", (BIG, b"yz"), (1.0, 2.5))}),
        Probe(bytes(1 << 17)),
    ]


@pytest.mark.parametrize("msg", _messages(), ids=lambda m: type(m).__name__)
def test_large_fields_are_framed_and_round_trip(msg: object) -> None:
    chunks = encode_chunks(msg)  # type: ignore[arg-type]
    assert chunks[0][0] == FRAMED and len(chunks) >= 2
    assert decode_message(b"".join(chunks)) == msg


def test_sections_are_referenced_not_copied_on_both_sides() -> None:
    msg = _messages()[0]
    chunks = encode_chunks(msg)  # type: ignore[arg-type]
    assert chunks[1] is BIG and len(chunks[0]) < 4096  # the rest is the small header
    wire = bytearray(b"".join(chunks))
    part = decode_message(wire).grads["big"].parts[0]  # type: ignore[attr-defined]
    assert isinstance(part, memoryview) and part.obj is wire and part == BIG


def test_small_messages_stay_plain_msgpack_maps() -> None:
    hello = Hello("w0", 0, bytes(32))
    (only,) = encode_chunks(hello)
    assert msgpack.unpackb(only)["v"] == PROTOCOL_VERSION
    assert decode_message(only) == hello


def test_version_1_plain_messages_are_still_read() -> None:
    assert decode_message(msgpack.packb({"v": 1, "t": "ack", "version": 3})).version == 3  # type: ignore[attr-defined]


@pytest.mark.parametrize("spec", sorted({*DEFAULT_SPECS, "topk:0.01+q8", "topk:0.01", "fp32"}))
def test_every_codec_decodes_parts_read_in_place(spec: str) -> None:
    import torch

    codec = make_codec(spec)
    payload = codec.encode(torch.randn(64, 4096))
    framed = decode_message(encode_message(Push(0, 1, 1, {"w": payload}), inline_max=0)).grads["w"]  # type: ignore[attr-defined]
    assert all(isinstance(p, memoryview) for p in framed.parts if p)
    assert torch.equal(codec.decode(framed), codec.decode(payload))


def _frame(header: object, sections: bytes = b"") -> bytes:
    head = msgpack.packb(header, use_bin_type=True)
    return bytes((FRAMED,)) + len(head).to_bytes(4, "big") + head + sections


def _ref(n: int, code: int = SECTION_EXT, size: int = 8) -> msgpack.ExtType:
    return msgpack.ExtType(code, n.to_bytes(size, "big"))


def _push(part: object) -> dict[str, object]:
    payload = {"c": "fp32", "s": [2], "d": "float32", "p": [part], "m": []}
    return {"v": 2, "t": "push", "step": 0, "samples": 1, "total_keys": 1, "grads": {"a": payload}}


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (bytes((FRAMED, 0, 0)), "no header length"),
        (bytes((FRAMED, 0, 0, 1, 0)) + b"x", "framed header of 256 bytes"),
        (_frame(_push(_ref(8)), bytes(7)), "only 7 left"),
        (_frame(_push(_ref(8)), bytes(9)), "1 bytes after"),
        (_frame(_push(_ref(8, code=2)), bytes(8)), "ext type 2"),
        (_frame(_push(_ref(8, size=4)), bytes(8)), "ext type 1 (4 bytes)"),
        (msgpack.packb(_push(_ref(8))) + bytes(8), "not a valid msgpack"),  # references only in a frame
        (_frame({"v": 2, "t": "hello", "worker_id": "w", "rank": 0, "client_nonce": _ref(32)}, bytes(32)), "client_nonce"),
        (_frame({"v": 2, "t": "ack", "version": _ref(0)}), "version"),
    ],
)
def test_bad_frames_are_malformed(data: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_message(data)
    assert info.value.code == "malformed" and reason in info.value.reason


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_mutated_frames_never_crash(data: st.DataObject) -> None:
    msg = Push(1, 2, 2, {"a": SMALL, "b": Payload("qsgd:8", (5,), "float32", (bytes(40), b"yz"), (1.0,))})
    raw = bytearray(encode_message(msg, inline_max=8))
    assert raw[0] == FRAMED
    for _ in range(data.draw(st.integers(1, 6))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        decode_message(bytes(raw))
    except ProtocolError:
        pass


def test_incoming_pieces_become_one_message(monkeypatch: pytest.MonkeyPatch) -> None:
    one = _Incoming()
    data = b"abc"
    one.add(data)
    assert one.message() is data and one.size == 3
    few = _Incoming()
    for piece in (b"ab", b"", b"cde"):
        few.add(piece)
    assert few.message() == b"abcde"
    monkeypatch.setattr(_Incoming, "HUGE", 1024)  # the huge-page buffer path, on a small message
    wire = encode_message(_messages()[0])  # type: ignore[arg-type]
    large = _Incoming()
    for i in range(0, len(wire), 1000):
        large.add(wire[i : i + 1000])
    joined = large.message()
    assert isinstance(joined, memoryview) and large.size == len(wire) and bytes(joined) == wire
    assert decode_message(joined) == _messages()[0]
