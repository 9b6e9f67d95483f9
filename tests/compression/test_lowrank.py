from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compression_fuzz import decode_or_reject, mutated
from netsense.compression import make_codec
from netsense.compression.lowrank import DENSE, FACTORS
from netsense.errors import CompressionError


def low_rank(rows: int, cols: int, rank: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, rank, generator=gen) @ torch.randn(rank, cols, generator=gen)


@settings(max_examples=20, deadline=None)
@given(
    rows=st.integers(20, 80), cols=st.integers(20, 80), true_rank=st.integers(1, 4), seed=st.integers(0, 2**16)
)
def test_reconstructs_low_rank_matrices(rows: int, cols: int, true_rank: int, seed: int) -> None:
    m = low_rank(rows, cols, true_rank, seed)
    codec = make_codec("powersgd:4")
    payload = codec.encode(m)
    assert payload.meta == (float(FACTORS),)
    err = (codec.decode(payload) - m).norm() / m.norm()
    # fp32 round-off, amplified by how well the random start Q spans M's rows: 1.2e-4 was drawn
    # (42x52, rank 4, seed 18500); a wrong basis errs by O(1)
    assert err < 1e-3


def test_conv_weight_viewed_as_matrix() -> None:
    m = low_rank(16, 27, 2, 0).reshape(16, 3, 3, 3)
    codec = make_codec("powersgd:2+fp16")
    y = codec.decode(codec.encode(m))
    assert y.shape == m.shape
    assert (y - m).norm() / m.norm() < 2e-3


def test_error_decreases_with_rank() -> None:
    gen = torch.Generator().manual_seed(1)
    # Decaying spectrum, as gradients have: column scale 1/i.
    m = torch.randn(200, 120, generator=gen) * (1.0 / torch.arange(1, 121)) @ torch.randn(120, 120, generator=gen)
    errors = []
    for rank in (1, 2, 4, 8, 16):
        codec = make_codec(f"powersgd:{rank}")
        for _ in range(4):  # warm-started power iterations refine the basis
            payload = codec.encode(m)
        errors.append(float((codec.decode(payload) - m).norm() / m.norm()))
    assert all(a > b for a, b in zip(errors, errors[1:])), errors


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(50,), (3, 3), (4, 100), (0, 5)])
def test_vectors_and_tiny_matrices_fall_back_to_lossless_dense(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = torch.randn(shape).to(dtype)
    codec = make_codec("powersgd:4")
    payload = codec.encode(x)
    assert payload.meta == (float(DENSE),)
    assert torch.equal(codec.decode(payload), x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dtype_preserved(dtype: torch.dtype) -> None:
    m = low_rank(40, 60, 1, 2).to(dtype)
    codec = make_codec("powersgd:2")
    y = codec.decode(codec.encode(m))
    assert y.dtype == dtype
    assert float((y.float() - m.float()).norm() / m.float().norm()) < 4 * torch.finfo(dtype).eps


def test_wire_ratio_and_nominal() -> None:
    m = torch.randn(1000, 1000)
    codec = make_codec("powersgd:4+fp16")
    assert codec.encode(m).wire_size / (4 * m.numel()) < 0.0041
    assert codec.nominal_ratio(m.numel()) == pytest.approx(0.004)


def test_factor_mode_for_a_shape_that_takes_no_factors_rejected() -> None:
    codec = make_codec("powersgd:4")
    payload = codec.encode(torch.randn(40, 40))
    with pytest.raises(CompressionError, match="does not take"):
        codec.decode(dataclasses.replace(payload, shape=(1600,)))


@pytest.mark.parametrize("spec", ["powersgd", "powersgd:0", "powersgd:1000", "powersgd:2+q8", "powersgd:a"])
def test_bad_specs(spec: str) -> None:
    with pytest.raises(CompressionError):
        make_codec(spec)


@settings(max_examples=80, deadline=None)
@given(shape=st.sampled_from([(30, 40), (100,)]), data=st.data())
def test_fuzzed_payloads_raise_compression_error_only(shape: tuple[int, ...], data: st.DataObject) -> None:
    codec = make_codec("powersgd:2")
    payload = codec.encode(torch.randn(shape, generator=torch.Generator().manual_seed(0)))
    decode_or_reject(codec, data.draw(mutated(payload)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_round_trip() -> None:
    m = low_rank(64, 128, 2, 3).cuda()
    codec = make_codec("powersgd:2")
    payload = codec.encode(m)
    y = codec.decode(payload, device="cuda")
    assert y.device.type == "cuda"
    assert (y - m).norm() / m.norm() < 1e-4


@pytest.mark.reliability
def test_fp16_factors_clamp_and_count() -> None:
    m = 1e6 * torch.randn(64, 48, generator=torch.Generator().manual_seed(0))
    codec = make_codec("powersgd:2+fp16")
    y = codec.decode(codec.encode(m))
    assert bool(torch.isfinite(y).all()) and codec.clamped > 0
    fp32 = make_codec("powersgd:2")
    fp32.decode(fp32.encode(m))
    assert fp32.clamped == 0
