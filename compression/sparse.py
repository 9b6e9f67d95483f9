"""Sparsifying codecs: exact and approximate top-k, random-k with a shared seed, threshold.

All send (index part, value parts) with meta ``(count,)`` (random-k: ``(seed, count)`` and no
index part, because the receiver regenerates the indices from the seed). Values travel in the
dense dtype, or as fp16 (``+fp16``: clamped to its finite range, counted in `clamped`), or 8-bit
QSGD-quantized (``+q8``). Unsent mass is meant to be carried by `ErrorFeedback`, so values are not
rescaled.

Over 400 lines on purpose: each codec's torch path sits next to its numpy fast path for CPU
(single-threaded, no thread barriers), which must give the same result. The exact top-k selection
on CPU lives in `topkscan`.
"""

from __future__ import annotations

import math
import random
import warnings

import numpy as np
import torch

from netsense.errors import CompressionError

from .base import (
    DTYPE_NAMES,
    Codec,
    Payload,
    bytes_to_tensor,
    check_payload_header,
    expect_bytes,
    register_codec,
    tensor_to_bytes,
)
from .chunks import run_chunks, scratch
from .indexcoding import decode_indices, encode_indices
from .limits import cast_clamped, checked_numel, k_for, parse_density, require_finite, split_suffix
from .quantize import decode_quantized, quantize, quantized_wire_size
from .topkscan import _SCAN_CHUNK, largest_indices

VALUE_MODES = ("raw", "fp16", "q8")
"""How sparse values travel: the dense dtype, fp16, or 8-bit stochastic quantization."""
_FP16_MAX = 65504.0
_SEED_LIMIT = 1 << 48  # seeds travel as float64 meta: keep them exactly representable
_NUMPY_DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}


def _value_mode(suffix: str | None) -> str:
    if suffix is None:
        return "raw"
    if suffix not in ("fp16", "q8"):
        raise ValueError(f"value suffix must be +fp16 or +q8, got +{suffix}")
    return suffix


def encode_values(values: torch.Tensor, mode: str) -> tuple[tuple[bytes, ...], int]:
    """Byte parts of the sent values under `mode`, and how many values the fp16 cast clamped."""
    if mode == "fp16":
        # Clamp rather than overflow to inf: error feedback carries what the clamp cut off.
        if values.device.type == "cpu" and values.dtype in _NUMPY_DTYPES:  # numpy: no thread barriers
            return _fp16_numpy(values.numpy())
        wire, cut = cast_clamped(values, torch.float16)
        return (tensor_to_bytes(wire),), cut
    if mode == "q8":
        codes, scales = quantize(values, 8)
        return (tensor_to_bytes(codes), tensor_to_bytes(scales)), 0
    return (tensor_to_bytes(values),), 0


def _fp16_numpy(values: np.ndarray) -> tuple[tuple[bytes, ...], int]:
    """`cast_clamped` to fp16 for a host array: finite values beyond fp16 become +-65504, counted;
    NaN and inf stay (the decoder refuses them)."""
    with np.errstate(over="ignore"):
        wire = values.astype(np.float16)
    if not np.isinf(wire).any():
        return (wire.tobytes(),), 0
    over = np.isinf(wire) & np.isfinite(values)
    wire[over] = np.copysign(np.float16(_FP16_MAX), values[over]).astype(np.float16)
    return (wire.tobytes(),), int(np.count_nonzero(over))


def gather(flat: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``flat[idx]``; on CPU through numpy (single-threaded: no thread barrier to stall on)."""
    if flat.device.type == "cpu" and flat.dtype in _NUMPY_DTYPES:
        return torch.from_numpy(np.take(flat.contiguous().numpy(), idx.numpy()))
    return flat[idx]


def value_part_count(mode: str) -> int:
    """Number of byte parts `encode_values` produces."""
    return 2 if mode == "q8" else 1


def value_bytes_per_element(mode: str, dtype: torch.dtype = torch.float32) -> float:
    """Approximate wire bytes per sent value, for nominal ratios."""
    return {"fp16": 2.0, "q8": 1.0 + 4 / 512}.get(mode, float(dtype.itemsize))


def decode_values(
    parts: tuple[bytes, ...], mode: str, count: int, dtype: torch.dtype, device: torch.device | str, what: str
) -> torch.Tensor:
    """Validate untrusted value parts (sizes first) and return `count` finite values in `dtype`;
    where no conversion is needed the result reads the part's bytes in place (read-only)."""
    np_dtype = _NUMPY_DTYPES.get(dtype)
    on_cpu = torch.device(device).type == "cpu" and np_dtype is not None
    if mode == "q8":
        values = decode_quantized(parts[0], parts[1], 8, count, device, f"{what} values").to(dtype)
        if on_cpu:  # a huge scale can still overflow code * step
            _require_finite_np(values.numpy(), what)
            return values
    elif on_cpu:
        # numpy on CPU: single-threaded, no per-op thread barrier to stall on a busy machine.
        wire = np.float16 if mode == "fp16" else np_dtype
        expect_bytes(parts[0], count * np.dtype(wire).itemsize, f"{what} values")
        array = np.frombuffer(parts[0], dtype=wire, count=count)
        if wire != np_dtype:
            array = array.astype(np_dtype)
        _require_finite_np(array, what)
        return torch.from_numpy(array) if array.flags.writeable else _read_only(array)
    else:
        wire = torch.float16 if mode == "fp16" else dtype
        expect_bytes(parts[0], count * wire.itemsize, f"{what} values")
        # Read in place: the conversion (or the caller's scatter) is the only copy.
        values = bytes_to_tensor(parts[0], wire, count, device, copy=False).to(dtype)
    require_finite(values, f"{what} values")  # fp16 inf stays inf in any wider dtype
    return values


def _require_finite_np(values: np.ndarray, what: str) -> None:
    """`require_finite` for a host array, in numpy."""
    if values.size and not np.isfinite(values).all():
        raise CompressionError(f"{what} values: contains NaN or infinity")


def _read_only(array: np.ndarray) -> torch.Tensor:
    """A tensor over a read-only array (torch warns on those; its callers here only read)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def check_values_size(parts: tuple[bytes, ...], mode: str, count: int, dtype: torch.dtype, what: str) -> None:
    """Reject value parts whose length does not match `count` before anything is allocated."""
    if mode == "q8":
        size, expected = len(parts[0]) + len(parts[1]), quantized_wire_size(count, 8)
        if size != expected:  # lengths only: parts may be memoryviews of a framed message (no `+`)
            raise CompressionError(f"{what} values: expected {expected} bytes, got {size}")
    else:
        wire = torch.float16 if mode == "fp16" else dtype
        expect_bytes(parts[0], count * wire.itemsize, f"{what} values")


def meta_int(value: float, low: int, high: int, what: str) -> int:
    """An integer carried in float meta, checked to be integral and in [low, high]."""
    if not (math.isfinite(value) and float(value).is_integer() and low <= value <= high):
        raise CompressionError(f"{what} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


def expected_index_bytes(density: float) -> float:
    """Expected bytes per index of the smaller index coding for uniformly spread indices."""
    # Geometric gaps: a varint needs byte j+1 when the gap is >= 2**(7j).
    varint = 1.0 + sum((1.0 - density) ** (1 << (7 * j)) for j in range(1, 5))
    return min(varint, 2.0)


_SCAN_TASK = 1 << 20
"""Elements per task on the chunk pool: each task scans its range in `_SCAN_CHUNK` pieces."""


def indices_at_or_above(flat: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Sorted indices of entries with |x| >= t, in one pass over `flat`.

    On CPU the scan runs in numpy over 64K-element chunks that stay in cache: `np.flatnonzero`
    is ~4x faster than `torch.nonzero`, which dominated this pass (measured on 11M floats, one
    thread: 0.65x a clone against 2.6x). Ranges of 1M elements are shared out on the chunk pool
    (numpy releases the GIL while it scans). NaN never compares >= t, in both paths.
    """
    np_dtype = _NUMPY_DTYPES.get(flat.dtype)
    if flat.device.type != "cpu" or np_dtype is None:
        return torch.nonzero((flat >= t).logical_or_(flat <= -t)).squeeze(1)
    values = flat.contiguous().numpy()
    threshold = np_dtype(t.item())
    found: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * ((values.size + _SCAN_TASK - 1) // _SCAN_TASK)

    def scan(start: int, stop: int) -> None:
        work = scratch("scan", (min(_SCAN_CHUNK, stop - start),), np_dtype)
        hits = []
        for s in range(start, stop, _SCAN_CHUNK):
            chunk = values[s : min(stop, s + _SCAN_CHUNK)]
            magnitude = np.abs(chunk, out=work[: chunk.size])
            hits.append(np.flatnonzero(magnitude >= threshold) + s)
        found[start // _SCAN_TASK] = np.concatenate(hits)

    run_chunks(scan, values.size, _SCAN_TASK)
    return torch.from_numpy(np.concatenate(found)) if found else torch.zeros(0, dtype=torch.int64)


def dense_zeros(numel: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A zero tensor for a sparse decode to scatter into.

    On CPU, numpy's zeros come from calloc: fresh pages arrive zeroed from the kernel, so the
    memset pass of `torch.zeros` (about one clone on 11M floats, most of a sparse decode) is skipped.
    """
    np_dtype = _NUMPY_DTYPES.get(dtype)
    if torch.device(device).type != "cpu" or np_dtype is None:
        return torch.zeros(numel, dtype=dtype, device=device)
    return torch.from_numpy(np.zeros(numel, dtype=np_dtype))


def scatter_dense(numel: int, idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """A dense flat tensor of `numel` zeros with `values` at `idx` (on their device).

    On CPU the scatter runs in numpy (one thread, no per-op thread barrier to stall on when
    other processes hold the cores) into calloc'd memory (`dense_zeros`)."""
    out = dense_zeros(numel, values.dtype, values.device)
    if values.device.type == "cpu" and values.dtype in _NUMPY_DTYPES:
        out.numpy()[idx.numpy()] = values.numpy()
    else:
        out[idx] = values
    return out


class SparseCodec(Codec):
    """Sends the values at a chosen index set; subclasses choose the set."""

    lossless = False
    name = ""

    def __init__(self, spec: str, value_mode: str) -> None:
        self.spec = spec
        self.value_mode = value_mode

    def select(self, flat: torch.Tensor) -> torch.Tensor:
        """Sorted unique int64 indices of the entries to send."""
        raise NotImplementedError

    def count_bounds(self, numel: int) -> tuple[int, int]:
        """Inclusive range of index counts this codec can produce for `numel` elements."""
        return 0, numel

    def encode(self, tensor: torch.Tensor) -> Payload:
        flat, idx, values = self._pick(tensor)
        parts = (encode_indices(idx, flat.numel()), *values)
        meta = (float(idx.numel()),)
        return Payload(self.spec, tuple(tensor.shape), DTYPE_NAMES[tensor.dtype], parts, meta)

    def roundtrip(self, tensor: torch.Tensor) -> torch.Tensor:
        """The decoded tensor without coding the indices (most of an encode and a decode of a
        small tensor): the same selection and values, scattered directly."""
        flat, idx, values = self._pick(tensor)
        sent = decode_values(values, self.value_mode, idx.numel(), tensor.dtype, tensor.device, self.spec)
        return scatter_dense(flat.numel(), idx, sent).reshape(tensor.shape)

    def _pick(self, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[bytes, ...]]:
        """`tensor` flat, the sorted indices to send and their values' wire parts (counting what
        the value cast clamped)."""
        flat = tensor.detach().reshape(-1)
        idx = self.select(flat)
        values, cut = encode_values(gather(flat, idx), self.value_mode)
        self.clamped += cut
        return flat, idx, values

    def decode(self, payload: Payload, *, device: torch.device | str = "cpu") -> torch.Tensor:
        nv = value_part_count(self.value_mode)
        dtype = check_payload_header(payload, codec=self.spec, parts=1 + nv, meta=1)
        n = checked_numel(payload, self.spec)
        lo, hi = self.count_bounds(n)
        count = meta_int(payload.meta[0], lo, hi, f"{self.spec} index count")
        check_values_size(payload.parts[1:], self.value_mode, count, dtype, self.spec)
        idx = decode_indices(payload.parts[0], count, n, device)
        values = decode_values(payload.parts[1:], self.value_mode, count, dtype, device, self.spec)
        return scatter_dense(n, idx, values).reshape(payload.shape)


class TopK(SparseCodec):
    """Exact top-k by magnitude: `topk_indices` on CPU (under one memory pass for the selection),
    `torch.topk` elsewhere."""

    name = "topk"

    def __init__(self, spec: str, density: float, value_mode: str) -> None:
        super().__init__(spec, value_mode)
        self.density = density
        self.rng = np.random.default_rng()
        """Sample source of `topk_indices`; it steers only the speed, never the selected set."""
        self.cpu_scan = True
        """False: `torch.topk` on CPU too (the reference the bench's ``@torch`` rows time)."""

    def count_bounds(self, numel: int) -> tuple[int, int]:
        k = k_for(numel, self.density)
        return k, k

    def select(self, flat: torch.Tensor) -> torch.Tensor:
        k = k_for(flat.numel(), self.density)
        if k == flat.numel():
            return torch.arange(k, device=flat.device)
        return largest_indices(flat, k, self.rng, scan=self.cpu_scan)

    def nominal_ratio(self, numel: int) -> float:
        per = value_bytes_per_element(self.value_mode) + expected_index_bytes(self.density)
        return min(1.0, self.density * per / 4)

    def nominal_progress(self, numel: int) -> float:
        # Top-k keeps at least a k/d share of the energy (equality when every magnitude is the
        # same): the contraction bound delta = k/d of Stich et al. (2018).
        return self.density


class TopKApprox(TopK):
    """Top-k through a threshold estimated from a random sample of magnitudes.

    One compare pass and one `nonzero` replace the partial sort. The count lands within
    `TOLERANCE` of k: above it, the candidates (a superset of the true top-k) are trimmed with an
    exact top-k over them alone; below it, a lower threshold is tried, then exact top-k.
    """

    name = "topka"
    TOLERANCE = 0.2
    MIN_SAMPLE_HITS = 400
    """Sample enough magnitudes that ~400 fall above the threshold: ~5% error on the count."""
    EXACT_BELOW = 4096
    """Tensors this small go straight to exact top-k: sampling would not pay."""

    def __init__(self, spec: str, density: float, value_mode: str) -> None:
        super().__init__(spec, density, value_mode)
        self.generator: torch.Generator | None = None

    def count_bounds(self, numel: int) -> tuple[int, int]:
        k = k_for(numel, self.density)
        return math.floor(k * (1 - self.TOLERANCE)), math.ceil(k * (1 + self.TOLERANCE))

    def select(self, flat: torch.Tensor) -> torch.Tensor:
        n = flat.numel()
        k = k_for(n, self.density)
        if n < self.EXACT_BELOW or k * 4 > n:
            return super().select(flat)
        lo, hi = self.count_bounds(n)
        s = min(n, max(n // 100, math.ceil(self.MIN_SAMPLE_HITS / self.density)))
        pick = torch.randint(n, (s,), device=flat.device, generator=self._generator(flat.device))
        sample = flat[pick].float().abs_()
        for widen in (1, 2):
            hits = min(s, max(1, round(widen * k * s / n)))
            t = sample.kthvalue(s - hits + 1).values.to(flat.dtype)
            idx = indices_at_or_above(flat, t)
            if idx.numel() > hi:
                keep = torch.topk(flat[idx].abs(), k, sorted=False).indices
                return idx[keep].sort().values
            if idx.numel() >= lo:
                return idx
        return super().select(flat)

    def _generator(self, device: torch.device) -> torch.Generator | None:
        if self.generator is not None and self.generator.device == device:
            return self.generator
        return None


class Threshold(SparseCodec):
    """Sends every entry with magnitude >= tau: the count follows the data."""

    name = "threshold"

    def __init__(self, spec: str, tau: float, value_mode: str) -> None:
        super().__init__(spec, value_mode)
        self.tau = tau

    def select(self, flat: torch.Tensor) -> torch.Tensor:
        return indices_at_or_above(flat, torch.tensor(self.tau, dtype=flat.dtype, device=flat.device))


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values (the set torch.unique returns), by one sort and a neighbour
    compare: 1.1 ms CPU on 110K int64 where np.unique took 27 ms (numpy 2.4) and torch.unique 4."""
    ordered = np.sort(values)
    keep = np.empty(ordered.size, dtype=bool)
    keep[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


class RandomK(SparseCodec):
    """k uniformly random entries; the receiver regenerates their indices from a shared seed.

    Indices are drawn with replacement on a seeded CPU generator and deduplicated: O(k) work,
    where a permutation would cost O(numel). The count is therefore slightly below k.
    """

    name = "randk"

    def __init__(self, spec: str, density: float, value_mode: str) -> None:
        super().__init__(spec, value_mode)
        self.density = density
        self.seeds = random.Random()
        """Seed source; reseed it for reproducible runs."""

    @staticmethod
    def indices(seed: int, numel: int, k: int) -> torch.Tensor:
        """The sorted index set of `seed` (CPU, deterministic for a given torch version)."""
        if k == 0:
            return torch.zeros(0, dtype=torch.int64)
        gen = torch.Generator().manual_seed(seed)
        return torch.from_numpy(_sorted_unique(torch.randint(numel, (k,), generator=gen).numpy()))

    roundtrip = Codec.roundtrip  # its indices come from a seed, not `select`

    def count_bounds(self, numel: int) -> tuple[int, int]:
        k = k_for(numel, self.density)
        return min(1, k), k

    def encode(self, tensor: torch.Tensor) -> Payload:
        flat = tensor.detach().reshape(-1)
        seed = self.seeds.getrandbits(48)
        idx = self.indices(seed, flat.numel(), k_for(flat.numel(), self.density)).to(flat.device)
        parts, cut = encode_values(gather(flat, idx), self.value_mode)
        self.clamped += cut
        meta = (float(seed), float(idx.numel()))
        return Payload(self.spec, tuple(tensor.shape), DTYPE_NAMES[tensor.dtype], parts, meta)

    def decode(self, payload: Payload, *, device: torch.device | str = "cpu") -> torch.Tensor:
        dtype = check_payload_header(payload, codec=self.spec, parts=value_part_count(self.value_mode), meta=2)
        n = checked_numel(payload, self.spec)
        lo, k = self.count_bounds(n)
        seed = meta_int(payload.meta[0], 0, _SEED_LIMIT - 1, f"{self.spec} seed")
        count = meta_int(payload.meta[1], lo, k, f"{self.spec} index count")
        check_values_size(payload.parts, self.value_mode, count, dtype, self.spec)
        idx = self.indices(seed, n, k)
        if idx.numel() != count:
            raise CompressionError(f"{self.spec}: seed {seed} yields {idx.numel()} indices, payload has {count}")
        values = decode_values(payload.parts, self.value_mode, count, dtype, device, self.spec)
        return scatter_dense(n, idx.to(device), values).reshape(payload.shape)

    def nominal_ratio(self, numel: int) -> float:
        return min(1.0, self.density * value_bytes_per_element(self.value_mode) / 4)

    def nominal_progress(self, numel: int) -> float:
        return self.density  # k random entries carry a k/d share of the energy in expectation


def _density_factory(cls: type[TopK] | type[RandomK]) -> object:
    def factory(arg: str | None) -> Codec:
        text, suffix = split_suffix(arg, cls.name)
        density = parse_density(text, cls.name)
        return cls(f"{cls.name}:{arg}", density, _value_mode(suffix))

    return factory


def _threshold(arg: str | None) -> Codec:
    text, suffix = split_suffix(arg, "threshold")
    tau = float(text)
    if not (math.isfinite(tau) and tau >= 0):
        raise ValueError(f"threshold tau must be finite and >= 0, got {text!r}")
    return Threshold(f"threshold:{arg}", tau, _value_mode(suffix))


register_codec("topk", _density_factory(TopK))  # type: ignore[arg-type]
register_codec("topka", _density_factory(TopKApprox))  # type: ignore[arg-type]
register_codec("randk", _density_factory(RandomK))  # type: ignore[arg-type]
register_codec("threshold", _threshold)
