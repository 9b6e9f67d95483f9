"""`Codec.roundtrip` returns exactly what `decode(encode(x))` does, and leaves the codec in the
same state: the progress windows and the level trials price levels through it."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from netsense.compression.base import Codec, codec_names, make_codec

SPECS = [
    "fp32",
    "fp16",
    "bf16",
    "none",
    "qsgd:4",
    "qsgd:8",
    "powersgd:1",
    "powersgd:2",
    "powersgd:4+fp16",
    "topk:0.01",
    "topk:0.01+fp16",
    "topk:0.3+q8",
    "topka:0.01+fp16",
    "randk:0.05+fp16",
    "threshold:0.5+fp16",
]
SHAPES = [(64, 300), (300,), (3, 4, 5, 6), (200, 1), (1, 100), (2, 2), (40_000,)]


def test_every_codec_is_covered() -> None:
    """Every codec the product registers (other tests register fakes of their own, in `tests`)."""
    from netsense.compression.base import _REGISTRY

    ours = {name for name in codec_names() if _REGISTRY[name].__module__.startswith("netsense.")}
    assert {spec.partition(":")[0] for spec in SPECS} == ours


def _seeded(codec: Codec, seed: int) -> Codec:
    """Give `codec`'s own random sources a fixed state (torch's default one is seeded by the caller)."""
    if hasattr(codec, "rng"):
        codec.rng = np.random.default_rng(seed)  # type: ignore[attr-defined]
    if hasattr(codec, "seeds"):
        codec.seeds = random.Random(seed)  # type: ignore[attr-defined]
    return codec


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_roundtrip_is_decode_of_encode(spec: str, dtype: torch.dtype) -> None:
    wire, direct = _seeded(make_codec(spec), 1), _seeded(make_codec(spec), 1)
    gen = torch.Generator().manual_seed(7)
    for shape in SHAPES:
        for call in range(3):  # later calls start from a warm basis (PowerSGD)
            x = torch.randn(shape, generator=gen) * (10.0 ** (call - 1))
            if dtype == torch.float32 and x.numel() > 4:
                x.view(-1)[:3] = torch.tensor([1e6, -7e4, 7e4])  # beyond fp16: clamped and counted
            x = x.to(dtype)
            torch.manual_seed(call)
            expected = wire.decode(wire.encode(x))
            torch.manual_seed(call)
            got = direct.roundtrip(x)
            assert got.dtype == expected.dtype and got.shape == expected.shape == x.shape
            assert torch.equal(got, expected), (spec, shape, call)
    assert direct.clamped == wire.clamped


def test_roundtrip_leaves_the_input_alone() -> None:
    x = torch.randn(64, 300)
    before = x.clone()
    for spec in ("topk:0.01+fp16", "powersgd:2", "qsgd:4"):
        make_codec(spec).roundtrip(x)
        assert torch.equal(x, before)
