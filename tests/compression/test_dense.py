from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compression_fuzz import decode_or_reject, mutated
from netsense.compression import make_codec
from netsense.errors import CompressionError

SHAPES = [(0,), (1,), (7, 3), (2_100_000,)]  # the last one is above the huge-page allocation size


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_fp32_is_lossless(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = torch.randn(shape).to(dtype)
    codec = make_codec("fp32")
    y = codec.decode(codec.encode(x))
    assert y.dtype == dtype and torch.equal(y, x)


@pytest.mark.parametrize("spec", ["fp16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_half_casts_round_once_and_own_their_output(spec: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = torch.randn(shape).to(dtype)
    codec = make_codec(spec)
    payload = codec.encode(x)
    y = codec.decode(payload)
    wire = torch.float16 if spec == "fp16" else torch.bfloat16
    assert y.shape == x.shape and y.dtype == dtype
    assert torch.equal(y, x.to(wire).to(dtype))
    y.fill_(7)  # a writable tensor of its own: the payload is untouched
    assert torch.equal(codec.decode(payload), x.to(wire).to(dtype))


@pytest.mark.parametrize("spec", ["fp32", "fp16", "bf16"])
def test_wrong_size_rejected(spec: str) -> None:
    codec = make_codec(spec)
    p = codec.encode(torch.randn(10))
    with pytest.raises(CompressionError, match="expected"):
        codec.decode(type(p)(p.codec, p.shape, p.dtype, (p.parts[0][:-2],)))


@settings(max_examples=60, deadline=None)
@given(spec=st.sampled_from(["fp32", "fp16", "bf16"]), data=st.data())
def test_fuzzed_payloads_raise_compression_error_only(spec: str, data: st.DataObject) -> None:
    codec = make_codec(spec)
    payload = codec.encode(torch.linspace(-3, 3, 600).reshape(3, 200))
    decode_or_reject(codec, data.draw(mutated(payload)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("spec", ["fp32", "fp16", "bf16"])
def test_cuda_round_trip(spec: str) -> None:
    x = torch.randn(5, 1000, device="cuda")
    codec = make_codec(spec)
    y = codec.decode(codec.encode(x), device="cuda")
    assert y.device.type == "cuda" and y.shape == x.shape
    assert torch.equal(y.cpu(), codec.decode(codec.encode(x.cpu())))


@pytest.mark.reliability
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fp16_clamps_finite_overflow_and_counts_it(dtype: torch.dtype) -> None:
    x = torch.tensor([1.0, 1e5, -1e5, 6e4, 3.0], dtype=dtype)
    codec = make_codec("fp16")
    y = codec.decode(codec.encode(x))
    expected = torch.tensor([1.0, 65504.0, -65504.0, float(x[3].half()), 3.0], dtype=torch.float16).to(dtype)
    assert y.dtype == dtype and torch.equal(y, expected)
    assert codec.clamped == 2
    codec.encode(x)
    assert codec.clamped == 4  # counts every clamped value since the codec was made


@pytest.mark.reliability
def test_bf16_clamps_the_top_of_fp32() -> None:
    x = torch.tensor([3.4e38, -3.4e38, 1.0])
    codec = make_codec("bf16")
    y = codec.decode(codec.encode(x))
    big = float(torch.finfo(torch.bfloat16).max)
    assert y.tolist() == [big, -big, 1.0] and codec.clamped == 2


@pytest.mark.reliability
@pytest.mark.parametrize("spec", ["fp16", "bf16"])
def test_half_casts_leave_nan_and_inf_alone(spec: str) -> None:
    """Clamping is for finite values beyond the wire's range; a non-finite input is the caller's
    poison to catch (error feedback refuses it before encoding), not something to hide."""
    x = torch.tensor([math.nan, math.inf, -math.inf, 2.0])
    codec = make_codec(spec)
    y = codec.decode(codec.encode(x))
    assert math.isnan(y[0]) and y[1:].tolist() == [math.inf, -math.inf, 2.0] and codec.clamped == 0
