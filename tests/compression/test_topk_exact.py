"""Exact top-k on CPU (`topk_indices`, behind `topk:` since issue #15) against `torch.topk`.

The scan is steered by a random sample, so these tests hold the selected set to torch.topk's (up
to ties) for every sample, not only for lucky ones: a stand-in generator aims the threshold too
high, too low and into ties, and hypothesis picks the sample as well as the data.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from netsense.compression import make_codec
from netsense.compression import topkscan
from netsense.compression.limits import k_for
from netsense.compression.topkscan import SCAN_FROM, topk_indices

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def assert_top_k(x: torch.Tensor, idx: torch.Tensor, k: int) -> None:
    """`idx` is sorted, unique and selects k of the largest magnitudes of `x`: the magnitudes
    torch.topk selects (as a multiset), and none left out is above one taken."""
    mags = x.reshape(-1).abs().double()  # exact for every float dtype
    n = mags.numel()
    assert idx.dtype == torch.int64 and tuple(idx.shape) == (k,)
    assert bool((idx[1:] > idx[:-1]).all()) and int(idx[0]) >= 0 and int(idx[-1]) < n
    chosen = mags[idx]
    assert torch.equal(chosen.sort().values, torch.topk(mags, k).values.sort().values)
    left = torch.ones(n, dtype=torch.bool)
    left[idx] = False
    if k < n:
        assert float(chosen.min()) >= float(mags[left].max())


def assert_ties_to_lowest_index(x: torch.Tensor, idx: torch.Tensor) -> None:
    """Among the magnitudes equal to the smallest one taken, the lowest indices are the ones taken
    (what `topk_indices` promises beyond torch.topk, which leaves ties unspecified)."""
    mags = x.reshape(-1).abs().double()
    kth = mags[idx].min()
    tied = torch.nonzero(mags == kth).squeeze(1)
    taken = idx[mags[idx] == kth]
    assert torch.equal(taken, tied[: taken.numel()])


class FixedSample:
    """Stands in for the sample's generator: it 'draws' the given indices, cycled, so that a test
    can aim the sampled threshold anywhere."""

    def __init__(self, picks: list[int] | np.ndarray) -> None:
        self.picks = np.asarray(picks, dtype=np.int64)

    def integers(self, low: int, high: int, size: int) -> np.ndarray:
        return np.resize(self.picks % high, size)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _signed_zeros_and_extremes(n: int, g: torch.Generator) -> torch.Tensor:
    pool = torch.tensor([0.0, -0.0, 1e-45, -1e-45, 1e-40, float("inf"), -float("inf"), 1.0, -1.0])
    return pool[torch.randint(len(pool), (n,), generator=g)]


def _block_of_giants(n: int, g: torch.Generator) -> torch.Tensor:
    # The largest values sit together in one block a sparse sample easily misses.
    x = torch.randn(n, generator=g) * 1e-3
    x[n // 3 : n // 3 + max(1, n // 100)] = 1e3
    return x


DISTRIBUTIONS: dict[str, Callable[[int, torch.Generator], torch.Tensor]] = {
    "normal": lambda n, g: torch.randn(n, generator=g),
    "uniform": lambda n, g: torch.rand(n, generator=g) - 0.5,
    "cauchy-like": lambda n, g: torch.randn(n, generator=g) ** 5,
    "small-integers": lambda n, g: torch.randint(-3, 4, (n,), generator=g).float(),
    "two-levels": lambda n, g: torch.where(torch.rand(n, generator=g) < 0.3, 2.0, 1.0) * torch.randn(n, generator=g).sign(),
    "all-zero": lambda n, g: torch.zeros(n),
    "constant-mixed-signs": lambda n, g: torch.ones(n) * (torch.arange(n) % 2 * 2 - 1),
    "mostly-zero": lambda n, g: torch.randn(n, generator=g) * (torch.rand(n, generator=g) < 0.004),
    "ascending": lambda n, g: torch.linspace(-1.0, 2.0, n),
    "signed-zeros-and-extremes": _signed_zeros_and_extremes,
    "block-of-giants": _block_of_giants,
}
SIZES = [1, 3, 1000, 5000, 20_000, 100_000]
"""100000 passes both candidate caps (4k + 4096 and 65536) at k = 1 %."""


def _ks(n: int) -> list[int]:
    ks = {1, 2, k_for(n, 0.01), max(1, n // 4)} | ({n - 1, n} if n <= 20_000 else set())
    return sorted(ks & set(range(1, n + 1)))


@pytest.mark.parametrize("dist", sorted(DISTRIBUTIONS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_same_set_as_torch_topk(n: int, dtype: torch.dtype, dist: str) -> None:
    x = DISTRIBUTIONS[dist](n, _gen(n)).to(dtype)
    for k in _ks(n):
        idx = topk_indices(x, k, np.random.default_rng(k))
        assert_top_k(x, idx, k)
        assert_ties_to_lowest_index(x, idx)


@pytest.mark.parametrize("aim", ["smallest", "median", "largest", "kth", "ties-at-kth"])
@pytest.mark.parametrize("dist", ["normal", "small-integers", "two-levels", "block-of-giants", "all-zero"])
def test_a_sample_that_misses_still_gives_the_exact_set(aim: str, dist: str) -> None:
    n, k = 300_000, 3000
    x = DISTRIBUTIONS[dist](n, _gen(7))
    order = torch.argsort(x.abs(), stable=True).numpy()
    pick = {"smallest": order[0], "median": order[n // 2], "largest": order[-1], "kth": order[n - k]}
    picks = order[n - k - 50 : n - k + 50] if aim == "ties-at-kth" else [pick[aim]]
    idx = topk_indices(x, k, FixedSample(picks))  # type: ignore[arg-type]
    assert_top_k(x, idx, k)
    assert_ties_to_lowest_index(x, idx)


def test_a_threshold_above_the_kth_value_falls_back_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # Sample only the largest magnitude: both sampled thresholds find too few, and the last scan
    # must run at the exact k-th magnitude (the full partition), not at a sampled one.
    n, k = 50_000, 500
    x = torch.randn(n, generator=_gen(3))
    thresholds: list[int] = []
    scan = topkscan._scan_magnitudes

    def spy(bits: np.ndarray, mask: int, t: int, strict: bool, cap: int) -> object:
        thresholds.append(t)
        return scan(bits, mask, t, strict, cap)

    monkeypatch.setattr(topkscan, "_scan_magnitudes", spy)
    idx = topk_indices(x, k, FixedSample([int(x.abs().argmax())]))  # type: ignore[arg-type]
    assert_top_k(x, idx, k)
    kth = torch.topk(x.abs(), k).values.min().view(torch.int32).item()
    assert len(thresholds) == 3 and thresholds[-1] == kth


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_any_sample_any_data_gives_the_exact_set(data: st.DataObject) -> None:
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    if data.draw(st.booleans(), label="drawn values"):
        values = data.draw(st.lists(st.floats(allow_nan=False, width=32), min_size=1, max_size=300))
        x = torch.tensor(values, dtype=torch.float32).to(dtype)  # fp16 may round to inf: allowed
    else:
        n = data.draw(st.integers(1, 12_000), label="n")
        dist = data.draw(st.sampled_from(sorted(DISTRIBUTIONS)), label="dist")
        x = DISTRIBUTIONS[dist](n, _gen(data.draw(st.integers(0, 2**16), label="seed"))).to(dtype)
    n = x.numel()
    k = data.draw(st.integers(1, n), label="k")
    picks = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=16), label="sample")
    idx = topk_indices(x, k, FixedSample(picks))  # type: ignore[arg-type]
    assert_top_k(x, idx, k)
    assert_ties_to_lowest_index(x, idx)


def test_non_contiguous_views() -> None:
    base = torch.randint(-20, 21, (600, 500), generator=_gen(5)).float()
    for view in (base[::3], base.reshape(-1)[1::2], base.t()[::2]):
        assert not view.is_contiguous()
        idx = topk_indices(view, 700, np.random.default_rng(0))
        assert_top_k(view, idx, 700)
    codec, reference = make_codec("topk:0.01"), make_codec("topk:0.01")
    reference.cpu_scan = False  # type: ignore[attr-defined]
    x = torch.randn(400, 300, generator=_gen(6)).t()
    assert not x.is_contiguous()
    assert torch.equal(codec.decode(codec.encode(x)), reference.decode(reference.encode(x)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("spec", ["topk:0.01", "topk:0.01+fp16", "topk:0.2+q8"])
def test_codec_sends_what_torch_topk_sends(spec: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    scan = topkscan.topk_indices
    monkeypatch.setattr(topkscan, "topk_indices", lambda flat, k, rng: calls.append(k) or scan(flat, k, rng))
    x = torch.randn(100_000, generator=_gen(8)).to(dtype)
    codec, reference = make_codec(spec), make_codec(spec)
    reference.cpu_scan = False  # type: ignore[attr-defined]
    a, b = codec.encode(x), reference.encode(x)
    k = k_for(x.numel(), codec.density)  # type: ignore[attr-defined]
    assert calls == [k]  # the scan served the codec, the reference did not use it
    assert_top_k(x, codec.select(x), k)  # type: ignore[attr-defined]
    if dtype.itemsize >= 4:  # 16-bit randn has ties at the k-th value: the sets may differ there
        assert a.parts[0] == b.parts[0] and a.meta == b.meta  # the index sets (q8 values are stochastic)
    assert codec.decode(a).dtype == dtype


class OnCuda:
    """What the scan's gate reads of a large fp32 CUDA tensor (no GPU needed, no device init)."""

    device = torch.device("cuda")
    dtype = torch.float32

    def numel(self) -> int:
        return 100_000


def test_other_devices_and_small_tensors_keep_torch_topk(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(flat: torch.Tensor, k: int, rng: object) -> torch.Tensor:
        raise AssertionError("topk_indices is for CPU float tensors")

    monkeypatch.setattr(topkscan, "topk_indices", fail)
    codec = make_codec("topk:0.01")
    assert not topkscan.scans(OnCuda(), 1000)  # type: ignore[arg-type]
    small = torch.randn(SCAN_FROM - 1, generator=_gen(9))
    assert_top_k(small, codec.select(small), k_for(small.numel(), 0.01))  # type: ignore[attr-defined]
    dense = torch.randn(100_000, generator=_gen(9))
    assert_top_k(dense, make_codec("topk:0.3").select(dense), 30_000)  # type: ignore[attr-defined]


def test_refuses_what_it_cannot_rank() -> None:
    rng = np.random.default_rng(0)
    for x, k in ((torch.arange(10), 3), (torch.randn(10), 0), (torch.randn(10), 11), (OnCuda(), 3)):
        with pytest.raises(ValueError, match="topk_indices"):
            topk_indices(x, k, rng)  # type: ignore[arg-type]


@pytest.mark.parametrize("zeros", [0.0, 0.5, 0.96, 1.0])
def test_the_kth_largest_over_ties_at_the_least(zeros: float) -> None:
    """`topkscan._kth_largest` partitions the entries above the least alone where most tie at it (numpy's
    partition is ~15x slower over such ties): the same value as a full sort, for r on both sides
    of the count above the least."""
    rng = np.random.default_rng(3)
    values = rng.integers(1, 1 << 30, 5000).astype(np.int32)
    values[rng.random(5000) < zeros] = 7  # the least: every other entry is larger
    values[0] = 7
    ordered = np.sort(values)[::-1]
    above = int(np.count_nonzero(values > 7))
    for r in sorted({1, 2, max(1, above // 2), max(1, above), above + 1, 5000} & set(range(1, 5001))):
        assert topkscan._kth_largest(values, r) == int(ordered[r - 1]), r


@pytest.mark.parametrize("n,k", [(100_000, 100), (100_000, 50_000), (10, 3)])
def test_largest_indices_scans_or_falls_back_to_the_same_set(n: int, k: int) -> None:
    """`largest_indices`: the scan where it serves (k <= n / 4), torch.topk beyond; the same set."""
    x = DISTRIBUTIONS["normal"](n, _gen(n))
    got = topkscan.largest_indices(x, k, np.random.default_rng(0))
    assert set(got.tolist()) == set(torch.topk(x.abs(), k).indices.tolist())
