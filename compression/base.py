"""Codec interface, the payload that travels, and the registry that maps spec strings to codecs.

A codec turns one dense tensor into a `Payload` (raw byte sections plus a few scalars) and back.
Decoding is stateless given the payload, because the parameter server decodes bytes from many
peers; encoding may keep state (a warm-started low-rank basis, a random generator).
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from netsense.errors import CompressionError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}
"""Dense dtypes a payload may describe (the wire's allow-list)."""

DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}

# Fixed per-payload framing on the wire (msgpack map keys, shape ints, codec name): an estimate
# used only for size accounting; the transport measures real bytes.
_FRAMING_BYTES = 16


@dataclass(frozen=True)
class Payload:
    """One encoded tensor as it travels: what the decoder needs and nothing else."""

    codec: str
    """Canonical spec of the codec that produced it, e.g. ``"fp16"`` or ``"topk:0.01+q8"``."""
    shape: tuple[int, ...]
    """Shape of the dense tensor."""
    dtype: str
    """Name of the dense tensor's dtype (a key of `DTYPES`)."""
    parts: tuple[bytes | memoryview, ...]
    """Raw byte sections, codec-defined (values, indices, scales ...). The wire decoder hands
    in-place sections of a received message as byte-format (`"B"`) memoryviews, so `len` is bytes."""
    meta: tuple[float, ...] = ()
    """Small codec-defined scalars (seed, norm, counts); 8 bytes each on the wire."""

    @property
    def numel(self) -> int:
        """Elements of the dense tensor."""
        return math.prod(self.shape)

    @property
    def wire_size(self) -> int:
        """Bytes this payload occupies on the wire, framing included."""
        return (
            sum(len(p) for p in self.parts)
            + 8 * len(self.meta)
            + 4 * len(self.shape)
            + len(self.codec)
            + _FRAMING_BYTES
        )


class Codec(ABC):
    """Encodes a dense tensor to a `Payload` and decodes it back (same shape and dtype)."""

    spec: str = ""
    """Canonical spec string; `make_codec(spec)` builds an equivalent codec."""
    lossless: bool = False
    """True when decode(encode(x)) == x exactly."""
    unbiased: bool = False
    """True when E[decode(encode(x))] == x (stochastic quantization): its error is variance."""
    feedback_safe: bool = True
    """False when error feedback around this codec lets the residual grow without bound (no
    contraction: what it leaves out can exceed what it was given); `ErrorFeedback` refuses it."""
    clamped: int = 0
    """Finite values this encoder clamped to a 16-bit wire type's range instead of sending inf,
    since it was made (an instance counter; see `limits.cast_clamped`)."""

    @abstractmethod
    def encode(self, tensor: torch.Tensor) -> Payload:
        """Encode `tensor` (any shape, a dtype in `DTYPES`, CPU or CUDA)."""

    @abstractmethod
    def decode(self, payload: Payload, *, device: torch.device | str = "cpu") -> torch.Tensor:
        """Rebuild the dense tensor on `device`; raise `CompressionError` on malformed input."""

    def roundtrip(self, tensor: torch.Tensor) -> torch.Tensor:
        """What ``decode(encode(tensor))`` returns, on `tensor`'s device, with the same effect on
        the codec's state (a warm-start basis, `clamped`, a generator's draws). For callers that
        need only what a receiver would apply, not the bytes: the progress windows run every
        candidate level this way each step. Codecs override it where skipping the wire format is
        cheaper (top-k 1 % on digits-cnn's window subsample: 0.48 ms against 1.58, docs/history/BENCHMARKS-2026.md,
        "Window steps without the wire format"), and must return exactly the same values."""
        return self.decode(self.encode(tensor), device=tensor.device)

    def follow(self, previous: Codec) -> None:
        """Take over what `previous` knows of this key, where this codec can use it: `previous` is
        the codec the same key last went out with, at another level (`KeyCodecs`). A stateful codec
        resumed after others ran would otherwise start from its own stale state. Default: nothing
        to take."""

    def nominal_ratio(self, numel: int) -> float:
        """Expected wire size relative to fp32 dense, for planning before anything is measured."""
        return 1.0

    def nominal_progress(self, numel: int) -> float:
        """Prior progress efficiency q in (0, 1]: the share of a vector's energy that survives a
        round trip, 1 - ||x - C(x)||^2 / ||x||^2, as a conservative bound for planning before it
        is measured on real gradients (docs/POLICIES.md). Lossless: 1; unknown lossy codecs: a low
        guess, so that they are chosen only once measured."""
        return 1.0 if self.lossless else 0.05

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec}>"


CodecFactory = Callable[[str | None], Codec]
_REGISTRY: dict[str, CodecFactory] = {}


def register_codec(name: str, factory: CodecFactory) -> None:
    """Register `factory(arg)` under `name`; `arg` is the text after ``name:`` or None."""
    if not name or ":" in name or "+" in name:
        raise ValueError(f"codec name {name!r} must be non-empty without ':' or '+'")
    _REGISTRY[name] = factory


def codec_names() -> list[str]:
    """Names of every registered codec."""
    return sorted(_REGISTRY)


def make_codec(spec: str) -> Codec:
    """Build a codec from its spec string, e.g. ``"fp16"``, ``"qsgd:4"``, ``"topk:0.01+q8"``.

    A ``+suffix`` is handed to the factory together with its argument (``"0.01+q8"``), so
    composite codecs (sparse values quantized) parse their own suffixes.
    """
    if not isinstance(spec, str) or not spec or len(spec) > 64:
        raise CompressionError(f"codec spec must be a non-empty string of <= 64 chars, got {spec!r}")
    name, sep, arg = spec.partition(":")
    if not sep:
        name, plus, rest = spec.partition("+")
        arg = f"+{rest}" if plus else ""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise CompressionError(f"unknown codec {name!r} in {spec!r}; known: {', '.join(codec_names())}")
    try:
        return factory(arg or None)
    except CompressionError:
        raise
    except (ValueError, TypeError) as exc:
        raise CompressionError(f"bad codec spec {spec!r}: {exc}") from exc


def check_payload_header(payload: Payload, *, codec: str, parts: int, meta: int) -> torch.dtype:
    """Common checks every decoder runs first on untrusted input; returns the dense dtype."""
    if payload.codec != codec:
        raise CompressionError(f"payload is for codec {payload.codec!r}, not {codec!r}")
    dtype = DTYPES.get(payload.dtype)
    if dtype is None:
        raise CompressionError(f"dtype {payload.dtype!r} not allowed; allowed: {sorted(DTYPES)}")
    if any((not isinstance(d, int)) or d < 0 for d in payload.shape):
        raise CompressionError(f"shape {payload.shape!r} must be non-negative ints")
    if len(payload.parts) != parts or len(payload.meta) != meta:
        raise CompressionError(
            f"{codec}: expected {parts} parts and {meta} meta, got {len(payload.parts)} and {len(payload.meta)}"
        )
    return dtype


def expect_bytes(part: bytes, size: int, what: str) -> None:
    """Raise unless `part` has exactly `size` bytes (checked before any allocation)."""
    if len(part) != size:
        raise CompressionError(f"{what}: expected {size} bytes, got {len(part)}")


def tensor_to_bytes(tensor: torch.Tensor) -> bytes:
    """Contiguous CPU bytes of `tensor` (copies to host once if it lives on a GPU)."""
    t = tensor.detach().contiguous()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def bytes_to_tensor(
    data: bytes, dtype: torch.dtype, numel: int, device: torch.device | str, *, copy: bool = True
) -> torch.Tensor:
    """Inverse of `tensor_to_bytes` for a flat tensor; the caller has checked the length.

    ``copy=False`` returns a tensor over `data` itself (no copy of the tensor bytes, the hot path
    of a PUSH): only for callers that never write to the result, or convert it right away."""
    if numel == 0:
        return torch.empty(0, dtype=dtype, device=device)
    if copy:
        flat = torch.frombuffer(bytearray(data), dtype=dtype, count=numel)
    else:
        with warnings.catch_warnings():  # read-only buffer: the caller promised not to write
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            flat = torch.frombuffer(data, dtype=dtype, count=numel)
    return flat.to(device) if torch.device(device).type != "cpu" else flat


_HUGE_PAGE_MIN = 1 << 22
"""Allocations from this size (4 MiB) go through numpy, which asks the kernel for huge pages."""
_ALIGN = 64


def empty_dense(numel: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """An uninitialised flat tensor for a decoder to write its output into.

    A fresh 44 MB tensor from `torch.empty` takes ~10K 4 KiB page faults on first write, which
    cost more than the copy itself (measured: a clone of 11M floats 24 ms, a copy into an
    already-touched tensor 8 ms). numpy madvises large arrays for transparent huge pages (2 MiB
    pages, 512x fewer faults), so decoders that write every element allocate through it on CPU.
    """
    nbytes = numel * dtype.itemsize
    if torch.device(device).type != "cpu" or nbytes < _HUGE_PAGE_MIN:
        return torch.empty(numel, dtype=dtype, device=device)
    raw = np.empty(nbytes + _ALIGN, dtype=np.uint8)
    skip = -raw.ctypes.data % _ALIGN  # torch's own allocator aligns to 64 bytes: keep SIMD loads aligned
    return torch.from_numpy(raw[skip : skip + nbytes]).view(dtype)
