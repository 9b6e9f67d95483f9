"""Shared hypothesis strategies for the codec tests: malformed variants of a valid payload."""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import strategies as st

from netsense.compression import Codec, Payload
from netsense.errors import CompressionError


@st.composite
def mutated(draw: st.DrawFn, payload: Payload) -> Payload:
    """One hostile change to `payload`: random/truncated/extended parts, bad meta, shape or dtype."""
    kind = draw(st.sampled_from(["bytes", "truncate", "extend", "meta", "shape", "huge", "dtype", "parts", "codec"]))
    parts = list(payload.parts)
    if kind in ("bytes", "truncate", "extend") and parts:
        i = draw(st.integers(0, len(parts) - 1))
        if kind == "bytes":
            parts[i] = draw(st.binary(min_size=len(parts[i]), max_size=len(parts[i])))
        elif kind == "truncate":
            parts[i] = parts[i][: draw(st.integers(0, max(0, len(parts[i]) - 1)))]
        else:
            parts[i] = parts[i] + draw(st.binary(min_size=1, max_size=16))
        return dataclasses.replace(payload, parts=tuple(parts))
    if kind == "meta":
        value = draw(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**60), 2**60).map(float)))
        meta = list(payload.meta) or [0.0]
        meta[draw(st.integers(0, len(meta) - 1))] = value
        return dataclasses.replace(payload, meta=tuple(meta))
    if kind == "shape":
        shape = tuple(draw(st.lists(st.integers(0, 300), min_size=0, max_size=4)))
        return dataclasses.replace(payload, shape=shape)
    if kind == "huge":
        return dataclasses.replace(payload, shape=(draw(st.integers(2**28, 2**62)), draw(st.integers(1, 8))))
    if kind == "dtype":
        return dataclasses.replace(payload, dtype=draw(st.sampled_from(["int64", "float8", "", "uint8"])))
    if kind == "parts":
        extra = draw(st.lists(st.binary(max_size=32), max_size=3))
        return dataclasses.replace(payload, parts=tuple(parts[: draw(st.integers(0, len(parts)))]) + tuple(extra))
    return dataclasses.replace(payload, codec=draw(st.sampled_from(["fp32", "qsgd:3", "topk:0.5", "x"])))


def decode_or_reject(codec: Codec, payload: Payload) -> None:
    """Decoding hostile input raises CompressionError or yields a tensor matching the header."""
    try:
        out = codec.decode(payload)
    except CompressionError:
        return
    assert isinstance(out, torch.Tensor)
    assert tuple(out.shape) == payload.shape
