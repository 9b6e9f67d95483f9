from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compression_fuzz import decode_or_reject, mutated
from netsense.compression import make_codec
from netsense.compression.limits import k_for
from netsense.compression.sparse import RandomK
from netsense.errors import CompressionError

SHAPES = [(1,), (10,), (257,), (8, 33), (2, 3, 4, 5)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def sample(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@settings(max_examples=30, deadline=None)
@given(
    shape=st.sampled_from(SHAPES),
    dtype=st.sampled_from(DTYPES),
    density=st.sampled_from([0.01, 0.1, 0.5, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_exact_topk_keeps_the_k_largest(shape: tuple[int, ...], dtype: torch.dtype, density: float, seed: int) -> None:
    x = sample(shape, dtype, seed)
    codec = make_codec(f"topk:{density}")
    y = codec.decode(codec.encode(x))
    assert y.shape == x.shape and y.dtype == x.dtype
    k = k_for(x.numel(), density)
    sent = y.reshape(-1) != 0
    assert int(sent.sum()) == int((x.reshape(-1)[sent] != 0).sum()) <= k
    kept = x.reshape(-1).abs().float()
    # Every kept magnitude is >= every dropped one, and kept values are exact (raw values).
    threshold = torch.topk(kept, k).values.min()
    assert bool((kept[sent] >= threshold).all())
    assert bool((kept[~sent] <= threshold).all())
    assert torch.equal(y.reshape(-1)[sent], x.reshape(-1)[sent])


@settings(max_examples=20, deadline=None)
@given(dtype=st.sampled_from(DTYPES), suffix=st.sampled_from(["+fp16", "+q8"]), seed=st.integers(0, 2**16))
def test_value_suffixes_within_their_precision(dtype: torch.dtype, suffix: str, seed: int) -> None:
    x = sample((40, 50), dtype, seed)
    codec = make_codec(f"topk:0.1{suffix}")
    y = codec.decode(codec.encode(x))
    sent = y != 0
    assert y.dtype == dtype and int(sent.sum()) == 200
    xs, ys = x[sent].float(), y[sent].float()
    if suffix == "+fp16":
        tol = xs.abs() * (torch.finfo(torch.float16).eps + torch.finfo(dtype).eps)
    else:
        tol = torch.full_like(xs, 2 * float(xs.abs().max()) / 255 * 1.01) + xs.abs() * torch.finfo(dtype).eps
    assert bool(((ys - xs).abs() <= tol).all())


@pytest.mark.parametrize("density", [0.1, 0.01, 0.001])
def test_approximate_topk_count_within_20_percent(density: float) -> None:
    codec = make_codec(f"topka:{density}")
    k = k_for(100_000, density)
    for seed in range(5):
        x = sample((100_000,), torch.float32, seed) * (1 + seed)
        payload = codec.encode(x)
        count = int(payload.meta[0])
        assert 0.8 * k <= count <= 1.2 * k
        y = codec.decode(payload)
        sent = y != 0
        # Whatever was kept is among the largest: nothing kept is below the (1.2k)-th magnitude.
        floor = torch.topk(x.abs(), math.ceil(1.2 * k)).values.min()
        assert bool((x[sent].abs() >= floor).all())


def test_approximate_topk_heavy_ties_and_zeros() -> None:
    for x in (torch.zeros(50_000), torch.ones(50_000), torch.cat([torch.zeros(49_000), torch.randn(1000)])):
        codec = make_codec("topka:0.01")
        payload = codec.encode(x)
        assert 400 <= int(payload.meta[0]) <= 600
        codec.decode(payload)


@pytest.mark.parametrize("dtype", DTYPES)
def test_approximate_topk_small_tensor_is_exact(dtype: torch.dtype) -> None:
    x = sample((30, 30), dtype, 1)
    a = make_codec("topka:0.05")
    b = make_codec("topk:0.05")
    assert torch.equal(a.decode(a.encode(x)), b.decode(b.encode(x)))


@settings(max_examples=20, deadline=None)
@given(shape=st.sampled_from(SHAPES), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_randk_regenerates_indices_from_the_seed(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> None:
    x = sample(shape, dtype, seed)
    codec = make_codec("randk:0.2")
    payload = codec.encode(x)
    assert len(payload.parts) == 1 and len(payload.meta) == 2  # values only: no index part
    y = codec.decode(payload)
    idx = RandomK.indices(int(payload.meta[0]), x.numel(), k_for(x.numel(), 0.2))
    expect = torch.zeros(x.numel(), dtype=dtype)
    expect[idx] = x.reshape(-1)[idx]
    assert torch.equal(y.reshape(-1), expect)


def test_randk_wrong_seed_rejected() -> None:
    codec = make_codec("randk:0.5")
    payload = codec.encode(torch.randn(1000))
    for seed in range(20):
        bad = dataclasses.replace(payload, meta=(float(seed), payload.meta[1]))
        if RandomK.indices(seed, 1000, 500).numel() != int(payload.meta[1]):
            with pytest.raises(CompressionError, match="yields"):
                codec.decode(bad)
            return
    pytest.fail("no seed with a different count found")


@settings(max_examples=20, deadline=None)
@given(shape=st.sampled_from(SHAPES), dtype=st.sampled_from(DTYPES), tau=st.sampled_from([0.0, 0.5, 1.5, 10.0]))
def test_threshold_sends_entries_at_or_above_tau(shape: tuple[int, ...], dtype: torch.dtype, tau: float) -> None:
    x = sample(shape, dtype, 3)
    codec = make_codec(f"threshold:{tau}")
    y = codec.decode(codec.encode(x))
    assert torch.equal(y, torch.where(x.abs() >= tau, x, torch.zeros_like(x)))


@pytest.mark.parametrize(
    ("spec", "limit"),
    [("topk:0.01+fp16", 0.0125), ("topka:0.01+fp16", 0.0125), ("topk:0.01+q8", 0.0075), ("randk:0.01+fp16", 0.0051)],
)
def test_wire_ratio(spec: str, limit: float) -> None:
    x = torch.randn(1 << 18)
    codec = make_codec(spec)
    ratio = codec.encode(x).wire_size / (4 * x.numel())
    assert ratio <= limit
    assert codec.nominal_ratio(x.numel()) == pytest.approx(ratio, rel=0.15)


def test_empty_tensor() -> None:
    for spec in ("topk:0.1", "topka:0.1", "randk:0.1", "threshold:1"):
        codec = make_codec(spec)
        x = torch.zeros(0, 4)
        assert codec.decode(codec.encode(x)).shape == (0, 4)


@pytest.mark.parametrize("spec", ["topk", "topk:0", "topk:1.5", "topk:x", "topk:0.1+q4", "topk:0.1+", "threshold:-1", "randk:nan"])
def test_bad_specs(spec: str) -> None:
    with pytest.raises(CompressionError):
        make_codec(spec)


@settings(max_examples=60, deadline=None)
@given(spec=st.sampled_from(["topk:0.1", "topka:0.05+fp16", "randk:0.1+q8", "threshold:1.0+fp16"]), data=st.data())
def test_fuzzed_payloads_raise_compression_error_only(spec: str, data: st.DataObject) -> None:
    codec = make_codec(spec)
    if isinstance(codec, RandomK):
        codec.seeds.seed(0)
    torch.manual_seed(0)  # the payload must not vary between hypothesis runs
    payload = codec.encode(torch.randn(30, 20))
    decode_or_reject(codec, data.draw(mutated(payload)))


def test_huge_shape_with_tiny_parts_rejected() -> None:
    codec = make_codec("threshold:1.0")
    payload = codec.encode(torch.randn(100))
    with pytest.raises(CompressionError, match="decode limit"):
        codec.decode(dataclasses.replace(payload, shape=(1 << 40,)))
    topk = make_codec("topk:0.1")
    payload = topk.encode(torch.randn(100))
    with pytest.raises(CompressionError, match="index count"):
        topk.decode(dataclasses.replace(payload, shape=(1 << 20,)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("spec", ["topk:0.01+fp16", "topka:0.01+q8", "randk:0.01", "threshold:2.0"])
def test_cuda_round_trip(spec: str) -> None:
    x = torch.randn(300, 1000, device="cuda")
    codec = make_codec(spec)
    payload = codec.encode(x)
    y = codec.decode(payload, device="cuda")
    assert y.device.type == "cuda" and y.shape == x.shape
    assert torch.equal(codec.decode(payload), y.cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_scan_over_several_pool_tasks_matches_torch(dtype: torch.dtype) -> None:
    from netsense.compression.sparse import _SCAN_TASK, indices_at_or_above

    x = torch.randn(2 * _SCAN_TASK + 12_345, generator=torch.Generator().manual_seed(3)).to(dtype)
    x[5] = float("nan")
    x[_SCAN_TASK + 7] = float("inf")
    t = torch.tensor(2.0, dtype=dtype)
    expected = torch.nonzero((x >= t) | (x <= -t)).squeeze(1)
    got = indices_at_or_above(x, t)
    assert torch.equal(got, expected)
    assert int(got[0]) != 5 and _SCAN_TASK + 7 in got.tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_fp16_values_clamp_instead_of_overflowing(dtype: torch.dtype) -> None:
    x = torch.zeros(100, dtype=dtype)
    x[3], x[70] = 1e5 if dtype != torch.float16 else 6e4, -3.0
    codec = make_codec("topk:0.02+fp16")
    y = codec.decode(codec.encode(x))
    assert y.dtype == dtype
    expected_big = min(float(x[3]), 65504.0)
    assert float(y[3]) == pytest.approx(expected_big, rel=1e-2) and float(y[70]) == -3.0
    assert int((y != 0).sum()) == 2


@pytest.mark.parametrize("suffix", ["", "+fp16"])
@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_non_finite_values_on_the_wire_rejected(suffix: str, bad: float) -> None:
    codec = make_codec(f"topk:0.5{suffix}")
    p = codec.encode(torch.arange(1.0, 9.0))
    wire = torch.float16 if suffix else torch.float32
    values = torch.frombuffer(bytearray(p.parts[1]), dtype=wire).clone()
    values[1] = bad
    bad_payload = dataclasses.replace(p, parts=(p.parts[0], values.numpy().tobytes()))
    with pytest.raises(CompressionError, match="NaN or infinity"):
        codec.decode(bad_payload)


@pytest.mark.parametrize(("numel", "k"), [(5, 10), (1000, 10), (11_000, 2_000)])
def test_randk_index_set_is_torch_unique_of_the_seeded_draw(numel: int, k: int) -> None:
    # The seed -> index set mapping is the wire's meaning: it must not change with the dedup method.
    for seed in (0, 1, 12345):
        draw = torch.randint(numel, (k,), generator=torch.Generator().manual_seed(seed))
        assert torch.equal(RandomK.indices(seed, numel, k), torch.unique(draw))


def test_q8_values_overflowing_fp32_rejected() -> None:
    codec = make_codec("topk:0.5+q8")
    p = codec.encode(torch.arange(1.0, 9.0))
    huge = torch.full((1,), 3e38).numpy().tobytes()  # code 255 * step = 2 * scale: inf
    with pytest.raises(CompressionError, match="bucket scale outside"):
        codec.decode(dataclasses.replace(p, parts=(p.parts[0], p.parts[1], huge)))


@pytest.mark.reliability
@pytest.mark.parametrize("spec", ["topk:0.02+fp16", "threshold:0.5+fp16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fp16_values_count_what_they_clamp(spec: str, dtype: torch.dtype) -> None:
    x = torch.zeros(100, dtype=dtype)
    x[3], x[70] = 1e5, -2e5
    codec = make_codec(spec)
    y = codec.decode(codec.encode(x))
    big = float(torch.tensor(65504.0).to(dtype))
    assert float(y[3]) == big and float(y[70]) == -big and codec.clamped == 2


@pytest.mark.reliability
def test_fp16_values_leave_inf_to_the_decoder() -> None:
    """An inf value is not clamped into a plausible 65504: it travels and the decoder refuses it."""
    codec = make_codec("topk:0.5+fp16")
    x = torch.tensor([1.0, math.inf, 2.0, 0.0])
    with pytest.raises(CompressionError, match="NaN or infinity"):
        codec.decode(codec.encode(x))
    assert codec.clamped == 0
