from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compression_fuzz import decode_or_reject, mutated
from netsense.compression import make_codec
from netsense.compression import quantize as Q
from netsense.compression.quantize import BUCKET, QSGD, pack_bits, unpack_bits
from netsense.errors import CompressionError

SHAPES = [(1,), (7,), (513,), (4, 300), (2, 3, 5, 7)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def bucket_steps(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Level spacing of each element's bucket."""
    flat = x.reshape(-1).float()
    nb = math.ceil(flat.numel() / BUCKET)
    padded = torch.nn.functional.pad(flat, (0, nb * BUCKET - flat.numel())).view(nb, BUCKET)
    steps = padded.abs().amax(dim=1) * 2 / ((1 << bits) - 1)
    return steps.repeat_interleave(BUCKET)[: flat.numel()]


@settings(max_examples=25, deadline=None)
@given(bits=st.sampled_from([1, 2, 4, 8]), shape=st.sampled_from(SHAPES), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_round_trip_within_one_level(bits: int, shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> None:
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3).to(dtype)
    codec = make_codec(f"qsgd:{bits}")
    y = codec.decode(codec.encode(x))
    assert y.shape == x.shape and y.dtype == x.dtype
    tol = bucket_steps(x, bits) * 1.001 + x.float().abs().reshape(-1) * 2 * torch.finfo(dtype).eps + 1e-6
    assert bool(((y.float() - x.float()).abs().reshape(-1) <= tol).all())


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_unbiased_and_variance_within_bound(bits: int) -> None:
    x = torch.randn(700, generator=torch.Generator().manual_seed(bits))
    codec = QSGD(bits)
    codec.generator = torch.Generator().manual_seed(100 + bits)
    draws = 600
    total = torch.zeros_like(x)
    sq_err = 0.0
    for _ in range(draws):
        y = codec.decode(codec.encode(x))
        total += y
        sq_err += float((y - x).square().sum())
    step = bucket_steps(x, bits)
    # Stochastic rounding on spacing d has variance <= d^2 / 4 per element.
    bound = float((step.square() / 4).sum())
    assert sq_err / draws <= bound * 1.05
    # Each element's mean over the draws is within 6 standard errors of the truth.
    assert bool(((total / draws - x).abs() <= 6 * step / 2 / math.sqrt(draws) + 1e-6).all())


@pytest.mark.parametrize(("bits", "limit"), [(8, 0.26), (4, 0.13), (2, 0.07), (1, 0.035)])
def test_wire_ratio(bits: int, limit: float) -> None:
    x = torch.randn(1 << 17)
    codec = make_codec(f"qsgd:{bits}")
    ratio = codec.encode(x).wire_size / (4 * x.numel())
    assert ratio <= limit
    assert codec.nominal_ratio(x.numel()) == pytest.approx(ratio, rel=0.01)


def test_zeros_and_empty_decode_exactly() -> None:
    codec = make_codec("qsgd:4")
    for x in (torch.zeros(1000), torch.zeros(0), torch.zeros(3, 0)):
        assert torch.equal(codec.decode(codec.encode(x)), x)


def test_non_finite_input_rejected() -> None:
    with pytest.raises(CompressionError, match="NaN"):
        make_codec("qsgd:8").encode(torch.tensor([1.0, float("nan")]))


@pytest.mark.parametrize("spec", ["qsgd", "qsgd:3", "qsgd:16", "qsgd:x", "qsgd:8+fp16"])
def test_bad_specs(spec: str) -> None:
    with pytest.raises(CompressionError):
        make_codec(spec)


@settings(max_examples=30, deadline=None)
@given(bits=st.sampled_from([1, 2, 4, 8]), codes=st.lists(st.integers(0, 255), max_size=50))
def test_pack_unpack(bits: int, codes: list[int]) -> None:
    c = torch.tensor(codes, dtype=torch.uint8) & ((1 << bits) - 1)
    packed = pack_bits(c, bits)
    assert packed.numel() == math.ceil(len(codes) * bits / 8)
    assert torch.equal(unpack_bits(packed, bits, len(codes)), c)


@settings(max_examples=150, deadline=None)
@given(bits=st.sampled_from([1, 4, 8]), data=st.data())
def test_fuzzed_payloads_raise_compression_error_only(bits: int, data: st.DataObject) -> None:
    codec = make_codec(f"qsgd:{bits}")
    torch.manual_seed(0)  # the payload must not vary between hypothesis runs
    payload = codec.encode(torch.randn(3, 200))
    decode_or_reject(codec, data.draw(mutated(payload)))


@pytest.mark.parametrize("scale", [-1.0, 3e38])
def test_scale_out_of_range_rejected(scale: float) -> None:
    """A negative scale, or one so large that decoding overflows to inf, is refused by the decoder."""
    codec = make_codec("qsgd:8")
    p = codec.encode(torch.randn(10))
    codes = bytes([255]) * len(p.parts[0])  # the top level: code * step would overflow at 3e38
    bad = torch.tensor([scale]).numpy().tobytes()
    with pytest.raises(CompressionError, match="bucket scale outside"):
        codec.decode(type(p)(p.codec, p.shape, p.dtype, (codes, bad)))


def test_huge_input_rejected_at_encode() -> None:
    with pytest.raises(CompressionError, match="bucket scale outside"):
        make_codec("qsgd:4").encode(torch.tensor([3e38, 1.0]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_round_trip(dtype: torch.dtype) -> None:
    x = torch.randn(5, 1000, device="cuda").to(dtype)
    codec = make_codec("qsgd:4")
    payload = codec.encode(x)
    y = codec.decode(payload, device="cuda")
    assert y.device.type == "cuda" and y.dtype == dtype and y.shape == x.shape
    cpu = codec.decode(payload)
    assert torch.equal(cpu, y.cpu())


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("numel", [5, BUCKET, 3 * Q._CHUNK_ROWS * BUCKET + 77])
def test_numpy_kernels_agree_with_the_torch_path(bits: int, numel: int) -> None:
    # The torch path is what CUDA runs; on CPU the numpy kernels on the chunk pool replace it.
    # Same noise stream, same fp32 steps: codes may differ only where fused multiply-adds round
    # a value sitting on a rounding boundary differently.
    x = torch.randn(numel, generator=torch.Generator().manual_seed(bits)) * 3
    codes_t, scales_t = Q._quantize_torch(x, bits, torch.Generator().manual_seed(9))
    codes_n, scales_n = Q._quantize_numpy(x, bits, torch.Generator().manual_seed(9))
    assert torch.equal(scales_t, scales_n)
    diff = (unpack_bits(codes_t, bits, numel).int() - unpack_bits(codes_n, bits, numel).int()).abs()
    assert int(diff.max()) <= 1 and int((diff > 0).sum()) <= max(1, numel // 10_000)
    y_t = Q._dequantize_torch(codes_n, scales_n, bits, numel)
    y_n = Q._dequantize_numpy(codes_n, scales_n, bits, numel)
    assert y_n.shape == (numel,)
    assert float((y_t - y_n).abs().max()) <= 1e-6 * float(scales_n.max())


@pytest.mark.parametrize("bits", [1, 8])
def test_multi_chunk_round_trip_within_one_level(bits: int) -> None:
    x = torch.randn(2 * Q._CHUNK_ROWS * BUCKET + 300, generator=torch.Generator().manual_seed(1))
    x[Q._CHUNK_ROWS * BUCKET + 5] = 40.0  # one loud bucket in the second chunk
    codec = make_codec(f"qsgd:{bits}")
    y = codec.decode(codec.encode(x))
    assert bool(((y - x).abs() <= bucket_steps(x, bits) * 1.001 + 1e-6).all())


def test_non_finite_input_in_a_later_chunk_rejected() -> None:
    x = torch.randn(3 * Q._CHUNK_ROWS * BUCKET)
    x[-10] = float("nan")
    with pytest.raises(CompressionError, match="NaN or infinity"):
        make_codec("qsgd:4").encode(x)
