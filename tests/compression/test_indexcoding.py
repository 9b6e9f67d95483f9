from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from netsense.compression.indexcoding import (
    CHUNK16,
    VARINT,
    chunk16_decode,
    chunk16_encode,
    decode_indices,
    encode_indices,
    varint_decode,
    varint_encode,
)
from netsense.errors import CompressionError


@st.composite
def index_sets(draw: st.DrawFn) -> tuple[torch.Tensor, int]:
    numel = draw(st.integers(1, 300_000))
    values = draw(st.lists(st.integers(0, numel - 1), max_size=200, unique=True))
    return torch.tensor(sorted(values), dtype=torch.int64), numel


@settings(max_examples=60, deadline=None)
@given(index_sets())
def test_both_schemes_round_trip(case: tuple[torch.Tensor, int]) -> None:
    idx, numel = case
    assert torch.equal(varint_decode(varint_encode(idx), idx.numel()), idx)
    assert torch.equal(chunk16_decode(chunk16_encode(idx, numel), idx.numel(), numel), idx)
    data = encode_indices(idx, numel)
    assert torch.equal(decode_indices(data, idx.numel(), numel, "cpu"), idx)


def test_encoder_picks_the_smaller_scheme() -> None:
    numel = 1_000_000
    dense = torch.arange(0, numel, 10)  # gaps of 9: one varint byte each
    sparse = torch.arange(0, numel, 50_000)  # gaps above 2**14: three varint bytes each
    assert encode_indices(dense, numel)[0] == VARINT
    assert len(encode_indices(dense, numel)) == 1 + dense.numel()
    assert encode_indices(sparse, numel)[0] == CHUNK16


def varint_bytes(gaps: list[int]) -> bytes:
    out = bytearray()
    for g in gaps:
        while True:
            byte, g = g & 0x7F, g >> 7
            out.append(byte | (0x80 if g else 0))
            if not g:
                break
    return bytes(out)


@pytest.mark.parametrize(
    ("data", "count", "numel", "match"),
    [
        (b"", 0, 10, "scheme"),
        (bytes([7]), 0, 10, "unknown index scheme"),
        (bytes([VARINT]) + varint_bytes([3, 4]), 2, 5, "outside"),
        (bytes([VARINT, 0x80]), 1, 10, "truncated"),
        (bytes([VARINT, 1, 2]), 3, 10, "cannot hold"),
        (bytes([VARINT, 0x01, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]), 2, 10, "longer than 5"),
        (bytes([VARINT, 0x81, 0x81, 0x01, 0x02]), 3, 100, "found 2 varints"),
        (bytes([CHUNK16]) + (2).to_bytes(4, "little") + bytes([5, 0, 3, 0]), 2, 10, "strictly increasing"),
        (bytes([CHUNK16]) + (3).to_bytes(4, "little") + bytes([5, 0, 6, 0]), 2, 10, "do not add up"),
        (bytes([CHUNK16]) + (1).to_bytes(4, "little") + bytes([50, 0]), 1, 10, "outside"),
        (bytes([CHUNK16, 0, 0]), 1, 10, "expected 6 bytes"),
        (bytes([VARINT, 1]), 11, 10, "11 indices for 10"),
    ],
)
def test_malformed_indices_rejected(data: bytes, count: int, numel: int, match: str) -> None:
    with pytest.raises(CompressionError, match=match):
        decode_indices(data, count, numel, "cpu")


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=64), count=st.integers(0, 40), numel=st.integers(0, 1 << 20))
def test_random_bytes_raise_compression_error_or_valid_indices(data: bytes, count: int, numel: int) -> None:
    try:
        idx = decode_indices(data, count, numel, "cpu")
    except CompressionError:
        return
    assert idx.numel() == count
    if count:
        assert int(idx.min()) >= 0 and int(idx.max()) < numel
        assert bool((idx[1:] > idx[:-1]).all())


@settings(max_examples=80, deadline=None)
@given(gaps=st.lists(st.one_of(st.integers(0, 300), st.integers(0, (1 << 32) - 1)), min_size=1, max_size=60))
def test_varint_bytes_match_a_reference_coder(gaps: list[int]) -> None:
    # Mixed short and long varints (1 to 5 bytes) next to each other, in every order.
    idx = torch.cumsum(torch.tensor(gaps, dtype=torch.int64) + 1, 0) - 1
    coded = varint_encode(idx)
    assert bytes(coded.tolist()) == varint_bytes(gaps)
    assert torch.equal(varint_decode(coded, len(gaps)), idx)


def test_varint_gap_above_32_bits_rejected() -> None:
    data = torch.tensor(list(varint_bytes([1, 1 << 33])), dtype=torch.uint8)
    with pytest.raises(CompressionError, match="gap is above"):
        varint_decode(data, 2)


def test_numel_above_the_decode_limit_rejected() -> None:
    with pytest.raises(CompressionError, match="decode limit"):
        decode_indices(bytes([VARINT, 1]), 1, 1 << 40, "cpu")
