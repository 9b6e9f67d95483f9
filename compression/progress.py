"""Progress efficiency q_l: how much optimisation progress one step at a level makes (docs/POLICIES.md).

A lossless step applies the whole error-feedback-corrected update v = g + r. A lossy level applies
C(v) and keeps v - C(v) for later, so the share of v's energy that arrives now,

    q = 1 - ||v - C(v)||^2 / ||v||^2        (for biased codecs: the contraction delta),
    q = 1 / (1 + ||v - C(v)||^2 / ||v||^2)  (for unbiased codecs: 1 / (1 + omega)),

is the quantity that the convergence bounds of compressed SGD scale with: with error feedback a
delta-contraction slows the leading terms by up to 1/delta (Stich et al. 2018; Karimireddy et al.
2019), an unbiased compressor of variance omega by ~(1 + omega) (Alistarh et al. 2017). We use
1/q as a planning figure for "steps per unit of progress", not as a proven rate: in the asymptotic
regime error feedback recovers most of the delay, so 1/q errs on the side of sending more.

`measure_progress` measures a codec on a few gradient tensors (subsampled); error feedback uses
`progress_from_error` on the sums it keeps. What a policy makes of it (one EWMA per ladder level,
seeded with the codec's conservative prior) is `netsense.compression.policy.progress`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from .base import Codec
from .lowrank import PowerSGD

DEFAULT_SAMPLE_NUMEL = 1 << 16
"""Elements per candidate measurement: enough for top-k 0.1% to keep 65 entries, cheap to encode."""
WARM_UP_NUMEL = 1024
"""Elements of a warm-up call: a codec's first call pays lazy set-up (~20 ms for qsgd:8 on loaded
cores, 2-10x its later calls) whatever the size, so a small sample warms it up cheaply."""


def codec_clock() -> Callable[[], float]:
    """The clock every codec timing that prices a level is read on (candidate rounds and the real
    sends alike, so that they compare): this thread's CPU time while torch runs this thread's
    kernels on it alone (`torch.get_num_threads() == 1`, as every bench process and the window
    thread do) and CUDA is not in use, else wall time (a kernel spread over a pool, or on a GPU,
    works where `thread_time` does not look). Wall time on a side thread charges a codec the GIL
    waits that another thread's Python imposes at each of its kernel calls: beside a 30-60 % busy
    event loop a powersgd:4 round on wide-mlp read 2.25 ms for 0.53 ms of work
    (docs/POLICIES.md, "Measured costs")."""
    cpu_only = torch.get_num_threads() == 1 and not torch.cuda.is_initialized()
    return time.thread_time if cpu_only else time.perf_counter


def progress_from_error(energy: float, error: float, *, unbiased: bool) -> float | None:
    """q from ||v||^2 = `energy` and ||v - C(v)||^2 = `error`; None when v is zero (no evidence)."""
    if not energy > 0:
        return None
    ratio = max(0.0, error / energy)
    return 1.0 / (1.0 + ratio) if unbiased else max(0.0, 1.0 - ratio)


@dataclass(frozen=True)
class LevelSample:
    """One candidate measurement of a codec on a gradient sample: its q and what it cost."""

    progress: float | None
    """q of the codec on the sample (None when the sample was all zeros)."""
    encode_s: float
    """Seconds spent encoding the sample (every key's share, one call per key as the uplink does)."""
    decode_s: float
    """Seconds spent decoding it."""
    dense_bytes: int
    """fp32 bytes of the sample actually encoded (4 x elements), the unit costs are quoted in."""


def sender_encode_s(codec: Codec, sample: LevelSample) -> float:
    """What the sender pays to send `codec` per `sample`: a lossy level's encode plus one decode,
    since error feedback decodes what it sent to keep the residual (as the PS does to update its
    shadow); a lossless level's encode alone. Compares a candidate's timing with a step's `encode_s`."""
    return sample.encode_s if codec.lossless else sample.encode_s + sample.decode_s


def subsample(tensors: Iterable[torch.Tensor], max_numel: int) -> list[torch.Tensor]:
    """Dense fp32 copies of the non-empty `tensors`, whole while their total fits `max_numel`;
    beyond that each keeps an evenly spaced subsample of its share (rows of a matrix, elements of a
    vector; see `measure_level`). The same shapes always give the same positions, so a stream of
    gradients subsampled step after step is one fixed set of coordinates (`netsense.compression.window`)."""
    items = [t.detach().float() for t in tensors if t.numel() > 0]
    total = sum(t.numel() for t in items)
    out = []
    for x in items:
        share = max(1, x.numel() * max_numel // total)
        if x.numel() > share:
            if x.dim() >= 2:
                rows = max(1, x.shape[0] * share // x.numel())
                x = x[:: max(1, x.shape[0] // rows)][:rows]
            else:
                x = x.reshape(-1)[:: x.numel() // share][:share]
        # Dense strides, not just `contiguous()`: a one-element subsample keeps its stride (16 seen),
        # which `is_contiguous` accepts and a codec's byte view of the cast does not.
        out.append(x.clone(memory_format=torch.contiguous_format))
    return out


def measure_progress(codec: Codec, tensors: Iterable[torch.Tensor], *, max_numel: int = DEFAULT_SAMPLE_NUMEL) -> float | None:
    """q of `codec` applied to each tensor on its own (as the uplink applies it per key); see
    `measure_level`, which also times it."""
    sample = measure_level(codec, tensors, max_numel=max_numel)
    return None if sample is None else sample.progress


def measure_level(
    codec: Codec,
    tensors: Iterable[torch.Tensor],
    *,
    max_numel: int = DEFAULT_SAMPLE_NUMEL,
    whole_keys: bool | None = None,
    weights: Sequence[torch.Tensor] | None = None,
) -> LevelSample | None:
    """q of `codec` on `tensors`, and its encode and decode time on them; None for no elements.

    Tensors are used whole while their total fits `max_numel`; beyond that each keeps an evenly
    spaced subsample of its share: rows of a matrix (so that shape-aware codecs still see one), or
    elements of a vector (top-k's energy share at a density is a property of the magnitude
    distribution, which a spread subsample preserves). Encode cost is O(max_numel). The timings
    are the codec's own (no error feedback), per key like the real send: a cost sample for levels
    the policy has not sent, on `codec_clock`.

    `whole_keys` (default: for low-rank codecs) takes every key whole, each from a fresh basis (one
    power iteration from a random start; `PowerSGD.reset`), whatever `max_numel`: a rank-r fit to a
    row subsample keeps more of a matrix than the fit to the matrix (rank 1 on wide-mlp's first
    update: 0.58 against 0.35, above rank 2's 0.53), and a basis kept from another key, or from a
    round `progress_every` steps ago, is no warm start. A fresh basis prices a candidate somewhat
    below what the level sent gets from its warm start (rank 4 on wide-mlp's downlink, updates
    0-40: 0.34-0.70 against 0.49-0.72), the side that compresses less (`scripts/candidate_q.py`).

    `weights` (one per tensor, of its shape, >= 0) takes both energies in a diagonal metric,
    sum_i w_i x_i^2: the downlink's on an Adam job (`netsense.ps.optim.adam_metric`).
    """
    low_rank = isinstance(codec, PowerSGD)
    whole = low_rank if whole_keys is None else whole_keys
    fresh_basis = whole and low_rank
    tensors = list(tensors)
    if weights is not None and [w.shape for w in weights] != [t.shape for t in tensors]:
        raise ValueError("measure_level: one weight tensor per tensor, of its shape")
    items = subsample(tensors, 1 << 62 if whole else max_numel)
    if not items:
        return None
    # The same shapes give the same positions (`subsample`), so each weight lines up with its item.
    metric = subsample(weights, 1 << 62 if whole else max_numel) if weights is not None else [None] * len(items)
    clock = codec_clock()
    energy = error = encode_s = decode_s = 0.0
    numel = 0
    for x, w in zip(items, metric, strict=True):
        if fresh_basis:
            codec.reset()
        t0 = clock()
        payload = codec.encode(x)
        t1 = clock()
        decoded = codec.decode(payload)
        t2 = clock()
        encode_s, decode_s, numel = encode_s + t1 - t0, decode_s + t2 - t1, numel + x.numel()
        diff = (x - decoded.float()).reshape(-1)
        flat = x.reshape(-1)
        if w is None:
            energy += float(torch.dot(flat, flat))
            error += float(torch.dot(diff, diff))
        else:
            w = w.reshape(-1)
            energy += float(torch.dot(flat * w, flat))
            error += float(torch.dot(diff * w, diff))
    q = progress_from_error(energy, error, unbiased=codec.unbiased)
    return LevelSample(q, encode_s, decode_s, 4 * numel)
