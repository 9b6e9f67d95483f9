"""Exact top-k selection on CPU in under one memory pass (`topk_indices`), for `sparse.TopK`.

The same set as torch.topk up to ties (ties to the lowest index), from a sampled threshold, one
chunked scan and an O(k) partition of the candidates; docs/BENCHMARKS.md, "Exact top-k".
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .chunks import scratch

_SCAN_CHUNK = 1 << 16

_INT_VIEWS = {2: (torch.int16, 0x7FFF), 4: (torch.int32, 0x7FFFFFFF), 8: (torch.int64, 0x7FFFFFFFFFFFFFFF)}
"""Same-size integer view and sign mask per float width: with the sign bit cleared, the bits of
a float order as its magnitude does (NaN above inf, as torch.topk ranks NaN)."""
_SCAN_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
"""IEEE binary floats, whose sign-cleared bits order as their magnitudes do."""
_SAMPLE_HITS = 256
"""Sample magnitudes expected above the k-th largest: ~6% error on the candidate count."""


def _scan_magnitudes(bits: np.ndarray, mask: int, t: int, strict: bool, cap: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Indices (sorted) and magnitude bits of entries whose magnitude is >= t (> t if `strict`),
    in 64K-element chunks that stay in cache; None as soon as more than `cap` are found."""
    work = scratch("topk", (min(_SCAN_CHUNK, bits.size),), bits.dtype.type)
    hit = scratch("topk-hit", (work.size,), np.bool_)
    compare = np.greater if strict else np.greater_equal
    found: list[np.ndarray] = []
    mags: list[np.ndarray] = []
    total = 0
    for s in range(0, bits.size, _SCAN_CHUNK):
        chunk = bits[s : s + _SCAN_CHUNK]
        m = np.bitwise_and(chunk, mask, out=work[: chunk.size])
        h = np.flatnonzero(compare(m, t, out=hit[: chunk.size]))
        total += h.size
        if total > cap:
            return None
        found.append(h + s)
        mags.append(m[h])
    if not found:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bits.dtype)
    return np.concatenate(found), np.concatenate(mags)


def _first_equal(bits: np.ndarray, mask: int, t: int, need: int) -> np.ndarray:
    """The first `need` indices whose magnitude bits equal t (the ties kept at the k-th value)."""
    found: list[np.ndarray] = []
    for s in range(0, bits.size, _SCAN_CHUNK):
        if need <= 0:
            break
        h = np.flatnonzero((bits[s : s + _SCAN_CHUNK] & mask) == t)[:need]
        found.append(h + s)
        need -= h.size
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def _kth_largest(values: np.ndarray, r: int) -> int:
    """The r-th largest of `values` (1 <= r <= size). numpy's partition runs ~15x slower over
    heavy ties (23 ms against 1.6 on 256K int32 that are 96 % zero), and a sparse tensor's zeros
    (an embedding's untouched rows) are such ties at the least value: the entries above the least
    are partitioned alone where they are r or more, else the r-th largest is the least."""
    least = values.min()
    above = values > least
    count = int(np.count_nonzero(above))
    if count < r:
        return int(least)
    if 2 * count < values.size:  # mostly ties at the least: partition the rest alone
        values = values[above]
    return int(np.partition(values, values.size - r)[values.size - r])


def _pick_k(idx: np.ndarray, mags: np.ndarray, k: int) -> np.ndarray:
    """The k of `idx` (sorted, >= k of them) with the largest `mags`, ties to the lowest index;
    a mask keeps them sorted, so no sort follows the selection."""
    kth = np.partition(mags, mags.size - k)[mags.size - k]
    keep = mags > kth
    need = k - int(np.count_nonzero(keep))
    keep[np.flatnonzero(mags == kth)[:need]] = True
    return idx[keep]


def _at_threshold(bits: np.ndarray, mask: int, t: int, k: int) -> np.ndarray | None:
    """Top-k when at least k magnitudes are >= t: the ones above t, then ties at t by index;
    None when too many lie above t for the candidate path."""
    above = _scan_magnitudes(bits, mask, t, True, max(4 * k, 1 << 16))
    if above is None:
        return None
    idx, mags = above
    if idx.size >= k:
        return _pick_k(idx, mags, k)
    return np.sort(np.concatenate([idx, _first_equal(bits, mask, t, k - idx.size)]))


def topk_indices(flat: torch.Tensor, k: int, rng: np.random.Generator) -> torch.Tensor:
    """Sorted indices of the k largest magnitudes of a CPU tensor, exactly (ties to the lowest
    index): the set torch.topk selects up to ties, at under one memory pass instead of ~15.

    A random sample of magnitudes gives a threshold a little below the k-th largest; one scan
    keeps the ~1.3k entries at or above it, and an O(k) partition of those picks the k. The
    sample only steers the speed: a threshold above the k-th largest (too few found) is lowered,
    then replaced by the exact k-th value (`np.partition` of every magnitude); one far below it
    (too many, or heavy ties such as an all-zero tensor) is handled by ties at that value.
    Integer bits with the sign cleared stand for magnitudes, so NaN ranks above inf as in torch.
    """
    if flat.dtype not in _SCAN_DTYPES or flat.device.type != "cpu" or not 1 <= k <= flat.numel():
        raise ValueError(f"topk_indices: a CPU float tensor and 1 <= k <= numel, got {flat.dtype}, {flat.device}, k={k}")
    view, mask = _INT_VIEWS[flat.element_size()]
    bits = flat.detach().reshape(-1).contiguous().view(view).numpy()
    n = bits.size
    s = min(n, max(4096, math.ceil(_SAMPLE_HITS * n / k)))
    sample = np.bitwise_and(bits.take(rng.integers(0, n, s)), mask)
    expected = k * s / n
    cap = 4 * k + 4096
    for hits in (expected + 4 * math.sqrt(expected) + 1, 4 * expected + 16):
        t = _kth_largest(sample, min(s, math.ceil(hits)))
        found = _scan_magnitudes(bits, mask, t, False, cap)
        if found is None:
            picked = _at_threshold(bits, mask, t, k)
            if picked is not None:
                return torch.from_numpy(picked)
            break
        if found[0].size >= k:
            return torch.from_numpy(_pick_k(found[0], found[1], k))
    kth = _kth_largest(np.bitwise_and(bits, mask), k)
    picked = _at_threshold(bits, mask, kth, k)
    assert picked is not None  # fewer than k magnitudes lie above the k-th largest
    return torch.from_numpy(picked)


SCAN_FROM = 1 << 14
"""Smaller tensors take `torch.topk`: sampling and scanning would not pay."""


def scans(flat: torch.Tensor, k: int) -> bool:
    """Whether `topk_indices` serves a selection: a CPU float tensor large enough to pay, k at most
    a quarter of it (beyond, the candidates would be most of the tensor)."""
    return (
        flat.device.type == "cpu"
        and flat.dtype in _SCAN_DTYPES
        and flat.numel() >= SCAN_FROM
        and 4 * k <= flat.numel()
    )


def largest_indices(flat: torch.Tensor, k: int, rng: np.random.Generator, *, scan: bool = True) -> torch.Tensor:
    """Sorted indices of the k largest magnitudes of a 1-D tensor (1 <= k <= numel): `topk_indices`
    where it serves (and `scan`), else torch.topk's: `sparse.TopK`'s selection and the gradient
    downlink's drain (ps/store/gradient.py)."""
    if scan and scans(flat, k):
        return topk_indices(flat, k, rng)
    return torch.topk(flat.abs(), k, sorted=False).indices.sort().values
