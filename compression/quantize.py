"""QSGD-style stochastic uniform quantization with a per-bucket scale, bit-packed.

Each bucket of `BUCKET` elements is scaled by its max magnitude into [-1, 1] and rounded
stochastically onto 2**bits evenly spaced levels, so E[decode(encode(x))] == x. A per-bucket scale
(rather than one norm for the whole tensor) keeps the error local: one large gradient entry only
coarsens its own bucket. Scales travel as fp32: an fp16 scale rounded down would clip and bias.

Over 400 lines on purpose: the torch kernels (any device) and the numpy kernels (CPU, chunk pool)
compute the same fp32 steps and must agree bit for bit, so they are kept side by side.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from netsense.errors import CompressionError

from .base import (
    DTYPE_NAMES,
    Codec,
    Payload,
    bytes_to_tensor,
    check_payload_header,
    empty_dense,
    expect_bytes,
    register_codec,
    tensor_to_bytes,
)
from .chunks import run_chunks, scratch
from .limits import checked_numel, require_finite

BUCKET = 512
"""Elements per scale. 512 keeps the fp32 scale overhead at 1/128 byte per element."""
BITS = (1, 2, 4, 8)
"""Supported widths: each divides 8, so packing never straddles a byte."""


def packed_size(numel: int, bits: int) -> int:
    """Bytes of `numel` codes of `bits` bits each."""
    return math.ceil(numel * bits / 8)


MAX_SCALE = float(np.finfo(np.float32).max) / 2
"""Largest bucket scale: decoding computes code * (2 * scale / levels) - scale, and 2 * scale must
stay finite in fp32. A larger scale (an absurd gradient, or a crafted payload) would decode to inf."""


def require_scales(scales: torch.Tensor, what: str) -> None:
    """Raise `CompressionError` unless every bucket scale is finite and within [0, MAX_SCALE]."""
    require_finite(scales, what)
    if scales.numel() and bool(((scales < 0) | (scales > MAX_SCALE)).any()):
        raise CompressionError(f"{what}: bucket scale outside [0, {MAX_SCALE:.3g}]")


def bucket_count(numel: int) -> int:
    """Number of scales for `numel` elements."""
    return math.ceil(numel / BUCKET)


_CHUNK_ROWS = 512
"""Buckets per chunk: 256K elements (1 MiB of fp32) stay in L2 across the passes of a chunk
kernel; whole-tensor ops would stream each intermediate through DRAM (measured ~2x slower on
11M floats), and much smaller chunks drown in per-op dispatch cost."""
_NOISE_SCALE = 2.0**-16
"""Rounding noise has 16 bits: the rounding-up probability is frac(u) to within 2**-17 of a level,
below fp32's own resolution of u for 8-bit codes, so the bias is negligible at every width."""
_MAGIC = float(1 << 23)
"""Adding 2**23 to a float in [0, 2**23) rounds it to an integer held in the low mantissa bits."""


class RoundingNoise:
    """A stream of uniform int16 rounding noise, drawn chunk by chunk so that each chunk's noise
    is used while it is still in cache (drawn for the whole tensor at once, 22 MB of it went
    through DRAM twice).

    On CPU, numpy's PCG64 makes it ~8x faster than torch's mt19937 (`torch.rand` alone cost 3x a
    clone on 11M floats); its seed comes from `generator` (or torch's default one), so
    `torch.manual_seed` still makes the codes reproducible.
    """

    def __init__(self, device: torch.device, generator: torch.Generator | None) -> None:
        self.device = device
        self.generator = generator
        self.bits: np.random.BitGenerator | None = None
        if device.type == "cpu":
            self.bits = np.random.PCG64(int(torch.randint(1 << 62, (1,), generator=generator)))

    def draw(self, count: int) -> torch.Tensor:
        """The next `count` values (int16) of the stream."""
        if self.bits is None:
            words = torch.empty((count + 3) // 4, dtype=torch.int64, device=self.device)
            return words.random_(-(1 << 63), None, generator=self.generator).view(torch.int16)[:count]
        return torch.from_numpy(self.bits.random_raw((count + 3) // 4).view(np.int16)[:count])


def bucket_scales(flat: torch.Tensor) -> torch.Tensor:
    """Max magnitude of each bucket (fp32); the tail bucket covers the last ``numel % BUCKET``."""
    n = flat.numel()
    full = n // BUCKET
    body = flat[: full * BUCKET].view(full, BUCKET)
    # amax and -amin read the input twice but write nothing as large as abs() would.
    scales = torch.maximum(body.amax(dim=1), body.amin(dim=1).neg_()) if full else flat.new_zeros(0)
    if full * BUCKET != n:
        scales = torch.cat([scales, flat[full * BUCKET :].abs().amax().reshape(1)])
    return scales


def _round_rows(rows: torch.Tensor, noise: torch.Tensor, a: torch.Tensor, b: torch.Tensor, levels: int,
                work: torch.Tensor, out: torch.Tensor) -> None:
    """codes = round(rows * a + b + noise) clamped to [0, levels], into uint8 `out`.

    The affine map takes each bucket onto [0, levels]; adding `_MAGIC` leaves the rounded code in
    the low byte of the float's bits, which a strided byte copy extracts (cheaper than a
    float->uint8 conversion). The clamp guards the two ends against fp32 rounding of the map.
    """
    torch.add(b, noise, alpha=_NOISE_SCALE, out=work)
    work.addcmul_(rows, a).add_(_MAGIC).clamp_(_MAGIC, _MAGIC + levels)
    out.copy_(work.view(torch.int32).view(torch.uint8)[..., ::4])


def quantize(flat: torch.Tensor, bits: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Stochastically quantize a flat tensor; returns (packed uint8 codes, fp32 scales per bucket).

    On CPU the numpy kernels run on the chunk pool (`chunks.py`); elsewhere torch ops over the
    whole tensor. Both take the same noise stream and the same fp32 steps, so they agree."""
    x = flat.detach()
    if x.dtype != torch.float32:
        x = x.float()
    x = x.contiguous()
    if x.device.type == "cpu":
        return _quantize_numpy(x, bits, generator)
    return _quantize_torch(x, bits, generator)


def _quantize_torch(x: torch.Tensor, bits: int, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize` in torch ops, for any device (CPU ones in chunks of `_CHUNK_ROWS` buckets)."""
    n = x.numel()
    nb = bucket_count(n)
    scales = bucket_scales(x)
    require_scales(scales, f"qsgd:{bits} input")
    levels = (1 << bits) - 1
    step_inv = torch.where(scales > 0, levels / (2 * scales), torch.zeros_like(scales))
    # round(u + (k + 0.5) / 2**16 - 0.5) with u = (x + scale) * step_inv in [0, levels] and k
    # uniform in [0, 2**16) rounds u up with probability frac(u): E[code] == u, unbiased.
    a = step_inv[:, None]
    b = (scales * step_inv).add_(_NOISE_SCALE / 2)[:, None]
    noise = RoundingNoise(x.device, generator)
    packed = empty_dense(packed_size(nb * BUCKET, bits), torch.uint8, x.device)
    full = n // BUCKET
    rows = x[: full * BUCKET].view(full, BUCKET)
    chunk = _CHUNK_ROWS if x.device.type == "cpu" else max(1, full)
    work = torch.empty(min(chunk, max(1, full)), BUCKET, device=x.device)
    # Codes of one chunk; at 8 bits they are the packed bytes themselves.
    codes = None if bits == 8 else torch.empty(work.numel(), dtype=torch.uint8, device=x.device)
    per_row = BUCKET * bits // 8
    for r0 in range(0, full, chunk):
        r1 = min(full, r0 + chunk)
        out = packed[r0 * per_row : r1 * per_row]
        rounded = out if codes is None else codes[: (r1 - r0) * BUCKET]
        _round_rows(rows[r0:r1], noise.draw((r1 - r0) * BUCKET).view(-1, BUCKET), a[r0:r1], b[r0:r1], levels,
                    work[: r1 - r0], rounded.view(-1, BUCKET))
        pack_bits(rounded, bits, out=out)
    if full < nb:
        tail = F.pad(x[full * BUCKET :], (0, nb * BUCKET - n)).view(1, BUCKET)
        out = packed[full * per_row :]
        rounded = out if codes is None else codes[:BUCKET]
        _round_rows(tail, noise.draw(BUCKET).view(1, BUCKET), a[full:], b[full:], levels, work[:1],
                    rounded.view(1, BUCKET))
        pack_bits(rounded, bits, out=out)
    return packed[: packed_size(n, bits)], scales


def dequantize(packed: torch.Tensor, scales: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """Inverse of `quantize` (up to the rounding noise), as a flat fp32 tensor."""
    if packed.device.type == "cpu":
        return _dequantize_numpy(packed, scales, bits, numel)
    return _dequantize_torch(packed, scales, bits, numel)


def _dequantize_torch(packed: torch.Tensor, scales: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """`dequantize` in torch ops, for any device."""
    nb = scales.numel()
    step = scales * (2.0 / ((1 << bits) - 1))
    neg_scales = scales.neg()
    out = empty_dense(nb * BUCKET, torch.float32, packed.device)
    rows = out.view(nb, BUCKET)
    chunk = _CHUNK_ROWS if packed.device.type == "cpu" else max(1, nb)
    per_row = BUCKET * bits // 8
    unpacker = _Unpacker(bits, min(chunk, max(1, nb)) * per_row, packed.device)
    work = torch.empty(min(chunk, max(1, nb)) * BUCKET, device=packed.device)
    # Per chunk, the codes and their fp32 conversion stay in cache; one fused multiply-add writes
    # the output (a mixed-dtype addcmul over the whole tensor measured 3x slower than this).
    for r0 in range(0, nb, chunk):
        r1 = min(nb, r0 + chunk)
        codes = unpacker.unpack(packed[r0 * per_row : r1 * per_row])
        w = work[: (r1 - r0) * BUCKET]
        if codes.numel() < w.numel():  # the packed tail is not padded on the wire
            w[codes.numel() :].zero_()
            w = w[: codes.numel()]
        w.copy_(codes)
        torch.addcmul(neg_scales[r0:r1, None], work[: (r1 - r0) * BUCKET].view(-1, BUCKET),
                      step[r0:r1, None], out=rows[r0:r1])
    return out[:numel]


_PACK_SHIFTS = {4: (torch.int16, (4,)), 2: (torch.int32, (6, 12)), 1: (torch.int64, (7, 14, 28))}
"""Per width: a word holding `8 // bits` codes, one per byte, and the shift-ors that gather them
into its low byte (bits 1: byte j moves down by 7j through shifts of 7, 14, 28)."""


def pack_bits(codes: torch.Tensor, bits: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Pack uint8 codes < 2**bits, little end first, `8 // bits` per byte."""
    if bits == 8:
        return codes if out is None or out.data_ptr() == codes.data_ptr() else out.copy_(codes)
    per = 8 // bits
    n = codes.numel()
    if n % per:
        codes = F.pad(codes, (0, per - n % per))
    word_dtype, shifts = _PACK_SHIFTS[bits]
    words = codes.contiguous().view(word_dtype)
    for s in shifts:
        words = words | (words >> s)
    return words.to(torch.uint8) if out is None else out.copy_(words)


_SPREAD = {
    4: (torch.int16, ((4, 0x0F0F),)),
    2: (torch.int32, ((12, 0x000F000F), (6, 0x03030303))),
    1: (torch.int64, ((28, 0x0000000F0000000F), (14, 0x0003000300030003), (7, 0x0101010101010101))),
}
"""Per width: the inverse of `_PACK_SHIFTS`. A packed byte, widened to a word of `8 // bits`
bytes, has its code groups moved apart by shift-or-mask steps until each code sits alone in its
own byte (bits 2: groups of two codes to bytes 0 and 2, then single codes to bytes 0-3)."""


class _Unpacker:
    """Unpacks codes through word buffers reused across chunks.

    Each step is a contiguous whole-word op (vectorised); a broadcast ``packed[:, None] >> shifts``
    has an inner loop of only `8 // bits` elements and measured ~3x slower per chunk.
    """

    def __init__(self, bits: int, max_bytes: int, device: torch.device) -> None:
        self.bits = bits
        if bits != 8:
            word_dtype, self.steps = _SPREAD[bits]
            self.word = torch.empty(max_bytes, dtype=word_dtype, device=device)
            self.shifted = torch.empty_like(self.word)

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """Codes of `packed` (at most `max_bytes` bytes) as uint8, `8 // bits` per byte; the
        result is a view of the word buffer, valid until the next call."""
        if self.bits == 8:
            return packed
        m = packed.numel()
        word, shifted = self.word[:m], self.shifted[:m]
        word.copy_(packed)
        for shift, mask in self.steps:
            torch.bitwise_left_shift(word, shift, out=shifted)
            word.bitwise_or_(shifted).bitwise_and_(mask)
        return word.view(torch.uint8)


def unpack_bits(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """Inverse of `pack_bits`: the first `numel` codes as uint8."""
    return _Unpacker(bits, packed.numel(), packed.device).unpack(packed)[:numel]


# --- CPU: numpy kernels per chunk of buckets, on the chunk pool ---------------------------------

_NP_PACK = {4: (np.int16, (4,)), 2: (np.int32, (6, 12)), 1: (np.int64, (7, 14, 28))}
"""`_PACK_SHIFTS` with numpy word types."""
_NP_SPREAD = {4: (np.int16, _SPREAD[4][1]), 2: (np.int32, _SPREAD[2][1]), 1: (np.int64, _SPREAD[1][1])}
"""`_SPREAD` with numpy word types."""


def _noise_rows(seed: int, row0: int, rows: int) -> np.ndarray:
    """Rounding noise of buckets [row0, row0 + rows): the `RoundingNoise` stream of `seed` at that
    offset (PCG64 advances in O(log n)), so chunks may run in any order on any thread."""
    bits = np.random.PCG64(seed)
    bits.advance(row0 * BUCKET // 4)
    return bits.random_raw(rows * BUCKET // 4).view(np.int16).reshape(rows, BUCKET)


def _quantize_rows(x: np.ndarray, bits: int, noise: np.ndarray, scales: np.ndarray, packed: np.ndarray) -> None:
    """Quantize full buckets `x` (rows, BUCKET) into `scales` and `packed`: the same fp32 steps
    as `bucket_scales` + `_round_rows` + `pack_bits`, all on this chunk while it is in cache."""
    rows = x.shape[0]
    levels = (1 << bits) - 1
    np.maximum(x.max(axis=1), -x.min(axis=1), out=scales)
    with np.errstate(all="ignore"):  # non-finite input: the caller raises on the scales
        step_inv = np.divide(np.float32(levels), 2 * scales, out=np.zeros_like(scales), where=scales > 0)
        b = scales * step_inv + np.float32(_NOISE_SCALE / 2)
        work = scratch("work", (rows, BUCKET), np.float32)
        prod = scratch("prod", (rows, BUCKET), np.float32)
        np.multiply(noise, np.float32(_NOISE_SCALE), out=work)
        work += b[:, None]
        np.multiply(x, step_inv[:, None], out=prod)
        work += prod
        work += np.float32(_MAGIC)
        np.clip(work, np.float32(_MAGIC), np.float32(_MAGIC + levels), out=work)
    if bits == 8:
        np.copyto(packed.reshape(rows, BUCKET), work.view(np.int32), casting="unsafe")  # low byte
        return
    codes = scratch("codes", (rows * BUCKET,), np.uint8)
    np.copyto(codes.reshape(rows, BUCKET), work.view(np.int32), casting="unsafe")
    word_dtype, shifts = _NP_PACK[bits]
    words = codes.view(word_dtype)
    shifted = scratch(f"shifted{bits}", words.shape, word_dtype)
    for s in shifts:
        np.right_shift(words, s, out=shifted)
        words |= shifted
    np.copyto(packed, words, casting="unsafe")


def _quantize_numpy(x: torch.Tensor, bits: int, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize` on CPU: `_quantize_rows` over chunks of `_CHUNK_ROWS` buckets on the pool."""
    n = x.numel()
    nb, full = bucket_count(n), n // BUCKET
    seed = int(torch.randint(1 << 62, (1,), generator=generator))  # as `RoundingNoise` draws it
    values = x.numpy()
    scales = np.empty(nb, dtype=np.float32)
    packed = empty_dense(packed_size(nb * BUCKET, bits), torch.uint8, "cpu")
    out = packed.numpy()
    per_row = BUCKET * bits // 8

    def kernel(r0: int, r1: int) -> None:
        rows = values[r0 * BUCKET : r1 * BUCKET].reshape(r1 - r0, BUCKET)
        _quantize_rows(rows, bits, _noise_rows(seed, r0, r1 - r0), scales[r0:r1], out[r0 * per_row : r1 * per_row])

    run_chunks(kernel, full, _CHUNK_ROWS)
    if full < nb:  # the tail bucket, zero-padded (zeros change neither its scale nor the codes sent)
        tail = np.zeros((1, BUCKET), dtype=np.float32)
        tail[0, : n - full * BUCKET] = values[full * BUCKET :]
        _quantize_rows(tail, bits, _noise_rows(seed, full, 1), scales[full:], out[full * per_row :])
    scale_t = torch.from_numpy(scales)
    require_scales(scale_t, f"qsgd:{bits} input")
    return packed[: packed_size(n, bits)], scale_t


def _dequantize_rows(packed: np.ndarray, bits: int, scales: np.ndarray, out: np.ndarray) -> None:
    """Dequantize the packed codes of `out.shape[0]` buckets into `out` (rows, BUCKET); `packed`
    may be short (the wire's last bucket is not padded): missing codes decode as code 0."""
    rows = out.shape[0]
    if bits == 8 and packed.size == rows * BUCKET:
        codes = packed.reshape(rows, BUCKET)
    else:
        m = rows * BUCKET * bits // 8
        if bits == 8:
            codes = scratch("codes", (m,), np.uint8)
            codes[packed.size :] = 0
            codes[: packed.size] = packed
        else:
            word_dtype, steps = _NP_SPREAD[bits]
            word = scratch(f"word{bits}", (m,), word_dtype)
            shifted = scratch(f"shifted{bits}", (m,), word_dtype)
            word[packed.size :] = 0
            np.copyto(word[: packed.size], packed)
            for shift, mask in steps:
                np.left_shift(word, shift, out=shifted)
                word |= shifted
                word &= mask
            codes = word.view(np.uint8)
        codes = codes.reshape(rows, BUCKET)
    with np.errstate(over="ignore", invalid="ignore"):  # a scale near fp32's max overflows: the caller checks
        step = scales * np.float32(2.0 / ((1 << bits) - 1))
        np.multiply(codes, step[:, None], out=out)  # as torch's addcmul: one rounding, then one more
        out -= scales[:, None]


def _dequantize_numpy(packed: torch.Tensor, scales: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """`dequantize` on CPU: `_dequantize_rows` over chunks of `_CHUNK_ROWS` buckets on the pool."""
    nb = scales.numel()
    out = empty_dense(nb * BUCKET, torch.float32, "cpu")
    rows, codes, s = out.numpy().reshape(nb, BUCKET), packed.numpy(), scales.numpy()
    per_row = BUCKET * bits // 8

    def kernel(r0: int, r1: int) -> None:
        _dequantize_rows(codes[r0 * per_row : r1 * per_row], bits, s[r0:r1], rows[r0:r1])

    run_chunks(kernel, nb, _CHUNK_ROWS)
    return out[:numel]


def quantized_wire_size(numel: int, bits: int) -> int:
    """Bytes of codes plus scales for `numel` elements."""
    return packed_size(numel, bits) + 4 * bucket_count(numel)


def decode_quantized(codes: bytes, scales: bytes, bits: int, numel: int, device: torch.device | str, what: str) -> torch.Tensor:
    """Validate and dequantize untrusted parts into a flat fp32 tensor on `device`."""
    nb = bucket_count(numel)
    expect_bytes(codes, packed_size(numel, bits), f"{what} codes")
    expect_bytes(scales, 4 * nb, f"{what} scales")
    scale_t = bytes_to_tensor(scales, torch.float32, nb, device)
    require_scales(scale_t, f"{what} scales")
    packed = bytes_to_tensor(codes, torch.uint8, len(codes), device, copy=False)  # only read
    return dequantize(packed, scale_t, bits, numel)


class QSGD(Codec):
    """Unbiased `bits`-bit stochastic quantization with one fp32 scale per `BUCKET` elements."""

    lossless = False
    unbiased = True

    def __init__(self, bits: int) -> None:
        if bits not in BITS:
            raise ValueError(f"qsgd bits must be one of {BITS}, got {bits}")
        self.bits = bits
        self.spec = f"qsgd:{bits}"
        # Stochastic rounding moves an element to one of the two levels around it, so its error is
        # below one step, 2 * scale / levels, with scale its bucket's max magnitude. From 2 bits
        # (levels >= 3) that is at most 2/3 of the largest input: the residual's max magnitude
        # contracts and error feedback keeps it bounded (2 / (levels - 2) times the largest
        # gradient entry). At 1 bit every element is sent as +-scale: the error reaches 2 * scale,
        # nothing contracts, and the measured residual grew 1000x per 10 steps to inf.
        self.feedback_safe = bits > 1
        self.generator: torch.Generator | None = None
        """Source of rounding noise; None uses torch's default generator of the tensor's device."""

    def encode(self, tensor: torch.Tensor) -> Payload:
        packed, scales = quantize(tensor.reshape(-1), self.bits, self.generator)
        parts = (tensor_to_bytes(packed), tensor_to_bytes(scales))
        return Payload(self.spec, tuple(tensor.shape), DTYPE_NAMES[tensor.dtype], parts)

    def decode(self, payload: Payload, *, device: torch.device | str = "cpu") -> torch.Tensor:
        dtype = check_payload_header(payload, codec=self.spec, parts=2, meta=0)
        n = checked_numel(payload, self.spec)
        flat = decode_quantized(payload.parts[0], payload.parts[1], self.bits, n, device, self.spec)
        return flat.to(dtype).reshape(payload.shape)

    def nominal_ratio(self, numel: int) -> float:
        return quantized_wire_size(numel, self.bits) / max(1, 4 * numel)

    def nominal_progress(self, numel: int) -> float:
        # Unbiased, variance E||C(x) - x||^2 <= omega ||x||^2 with omega = d / levels^2 for a bucket
        # of d elements (each rounding error <= half a step of 2 max|x| / levels, and ||x||^2 >=
        # max|x|^2): the worst case. An unbiased compressor's noise costs ~(1 + omega)x the steps.
        levels = (1 << self.bits) - 1
        omega = min(BUCKET, max(1, numel)) / (levels * levels)
        return 1.0 / (1.0 + omega)


def _qsgd(arg: str | None) -> Codec:
    if not arg or not arg.isdigit():
        raise ValueError(f"qsgd needs a bit width, one of {BITS}, e.g. qsgd:8; got {arg!r}")
    return QSGD(int(arg))


register_codec("qsgd", _qsgd)
