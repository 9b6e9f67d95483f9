"""Codec micro-benchmark: encode/decode time of every codec family against one memory pass.

DESIGN.md §6 asks that encode cost be a small fraction of step time, measured against one memory
pass; `clone_s` is that pass, timed in the same run so that machine load affects both alike.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch

from .base import make_codec

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


def _median_time(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matrix_shape(numel: int) -> tuple[int, int]:
    """A near-square [rows, cols] with rows * cols == numel, so low-rank codecs see a matrix."""
    rows = max((d for d in range(1, math.isqrt(numel) + 1) if numel % d == 0), default=1)
    return rows, numel // rows


def run_codec_bench(
    numel: int = 11_000_000, specs: list[str] | None = None, repeats: int = 3, device: str = "cpu"
) -> dict:
    """Median encode/decode seconds and wire ratio (wire_size / fp32 bytes) per codec spec."""
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    tensor = torch.randn(matrix_shape(numel), generator=gen).to(dev)
    result: dict = {"numel": numel, "clone_s": _median_time(tensor.clone, repeats, dev), "codecs": {}}
    for spec in specs if specs is not None else DEFAULT_SPECS:
        codec = make_codec(spec)
        payload = codec.encode(tensor)  # warm-up: allocator, low-rank basis
        encode_s = _median_time(lambda: codec.encode(tensor), repeats, dev)
        decode_s = _median_time(lambda: codec.decode(payload, device=dev), repeats, dev)
        result["codecs"][spec] = {
            "encode_s": encode_s,
            "decode_s": decode_s,
            "ratio": payload.wire_size / (4 * numel),
        }
    return result
