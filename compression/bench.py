"""Codec micro-benchmark: encode/decode time of every codec family against one memory pass.

docs/ARCHITECTURE.md ("Codecs") asks that encode cost be a small fraction of step time, measured against one memory
pass; `clone_s` is that pass, timed in the same run so that machine load affects both alike.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch

from netsense.errors import CompressionError

from .base import Codec, make_codec
from .sparse import TopK

DEFAULT_SPECS: tuple[str, ...] = (
    "fp32",
    "fp16",
    "bf16",
    "qsgd:8",
    "qsgd:4",
    "qsgd:2",
    "qsgd:1",
    "topk:0.01",
    "topk:0.01+fp16",
    "topk:0.01+q8",
    "topka:0.1+fp16",
    "topka:0.01+fp16",
    "topka:0.001+fp16",
    "randk:0.01+fp16",
    "threshold:2.5+fp16",
    "powersgd:4",
    "powersgd:4+fp16",
)
"""One or more specs of every codec family; threshold 2.5 keeps ~1.2% of a standard normal."""
REFERENCE = "@torch"
"""Suffix of a top-k spec that times its `torch.topk` selection, the reference the CPU scan
replaced (`topk:0.01@torch`): old and new selection side by side in one run."""


def make_bench_codec(spec: str) -> Codec:
    """The codec of `spec`, which may end in `REFERENCE` if it names a top-k codec."""
    base, at, tail = spec.partition("@")
    codec = make_codec(base)
    if at:
        if "@" + tail != REFERENCE or not isinstance(codec, TopK):
            raise CompressionError(f"bench spec {spec!r}: only a top-k spec takes a suffix, and only {REFERENCE}")
        codec.cpu_scan = False
    return codec


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _interleaved_times(fns: list[Callable[[], object]], repeats: int, device: torch.device) -> list[list[float]]:
    """Seconds of each of `fns` per repeat, the functions run in turn within each repeat.

    On a shared machine the speed of memory and cores drifts by 2-4x within a minute (other
    processes, page-fault cost); timing the clone right next to each codec makes both see the
    same conditions, so their ratio stays meaningful where absolute times do not.
    """
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, samples in zip(fns, times):
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            samples.append(time.perf_counter() - start)
    return times


def matrix_shape(numel: int) -> tuple[int, int]:
    """A near-square [rows, cols] with rows * cols == numel, so low-rank codecs see a matrix."""
    rows = max((d for d in range(1, math.isqrt(numel) + 1) if numel % d == 0), default=1)
    return rows, numel // rows


def run_codec_bench(
    numel: int = 11_000_000, specs: list[str] | None = None, repeats: int = 3, device: str = "cpu", rows: float = 1.0
) -> dict:
    """Median encode/decode seconds, wire ratio (wire_size / fp32 bytes) and the median of one
    clone timed alongside, per codec spec (`make_bench_codec`); `clone_s` is the median over every
    clone timed. `rows` < 1 keeps that share of the matrix's rows and zeroes the others, as in an
    embedding's gradient (its untouched rows), where selection costs differ from a dense tensor."""
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    tensor = torch.randn(matrix_shape(numel), generator=gen)
    if rows < 1.0:
        tensor[torch.randperm(tensor.shape[0], generator=gen)[round(rows * tensor.shape[0]) :]] = 0.0
    tensor = tensor.to(dev)
    _interleaved_times([tensor.clone], 3, dev)  # warm-up: the first fresh pages cost more
    clones: list[float] = []
    result: dict = {"numel": numel, "rows": rows, "clone_s": 0.0, "codecs": {}}
    for spec in specs if specs is not None else DEFAULT_SPECS:
        codec = make_bench_codec(spec)
        payload = codec.encode(tensor)  # warm-up: allocator, low-rank basis
        codec.decode(payload, device=dev)
        clone_t, encode_t, decode_t = _interleaved_times(
            [tensor.clone, lambda: codec.encode(tensor), lambda: codec.decode(payload, device=dev)], repeats, dev
        )
        clones += clone_t
        result["codecs"][spec] = {
            "encode_s": statistics.median(encode_t),
            "decode_s": statistics.median(decode_t),
            "clone_s": statistics.median(clone_t),
            "ratio": payload.wire_size / (4 * numel),
        }
    result["clone_s"] = statistics.median(clones) if clones else 0.0
    return result
