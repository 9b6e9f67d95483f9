"""QSGD-style stochastic uniform quantization with a per-bucket scale, bit-packed.

Each bucket of `BUCKET` elements is scaled by its max magnitude into [-1, 1] and rounded
stochastically onto 2**bits evenly spaced levels, so E[decode(encode(x))] == x. A per-bucket scale
(rather than one norm for the whole tensor) keeps the error local: one large gradient entry only
coarsens its own bucket. Scales travel as fp32: an fp16 scale rounded down would clip and bias.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

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
from .limits import checked_numel, require_finite

BUCKET = 512
"""Elements per scale. 512 keeps the fp32 scale overhead at 1/128 byte per element."""
BITS = (1, 2, 4, 8)
"""Supported widths: each divides 8, so packing never straddles a byte."""


def packed_size(numel: int, bits: int) -> int:
    """Bytes of `numel` codes of `bits` bits each."""
    return math.ceil(numel * bits / 8)


def bucket_count(numel: int) -> int:
    """Number of scales for `numel` elements."""
    return math.ceil(numel / BUCKET)


def quantize(flat: torch.Tensor, bits: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Stochastically quantize a flat tensor; returns (packed uint8 codes, fp32 scales per bucket)."""
    n = flat.numel()
    nb = bucket_count(n)
    x = flat.detach().float()
    if nb * BUCKET != n:
        x = F.pad(x, (0, nb * BUCKET - n))
    xb = x.view(nb, BUCKET)
    scales = xb.abs().amax(dim=1) if nb else x.new_zeros(0)
    require_finite(scales, f"qsgd:{bits} input")
    levels = (1 << bits) - 1
    step_inv = torch.where(scales > 0, levels / (2 * scales), torch.zeros_like(scales))
    # u in [0, levels]; floor(u + U[0,1)) rounds up with probability frac(u): unbiased.
    u = (xb + scales[:, None]).mul_(step_inv[:, None])
    u.add_(torch.rand(u.shape, generator=generator, device=u.device)).floor_().clamp_(0, levels)
    codes = u.view(-1)[:n].to(torch.uint8)
    return pack_bits(codes, bits), scales


def dequantize(packed: torch.Tensor, scales: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """Inverse of `quantize` (up to the rounding noise), as a flat fp32 tensor."""
    nb = scales.numel()
    codes = unpack_bits(packed, bits, numel).float()
    if nb * BUCKET != numel:
        codes = F.pad(codes, (0, nb * BUCKET - numel))
    step = scales * (2.0 / ((1 << bits) - 1))
    out = codes.view(nb, BUCKET).mul_(step[:, None]).sub_(scales[:, None])
    return out.view(-1)[:numel]


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack uint8 codes < 2**bits, little end first, `8 // bits` per byte."""
    if bits == 8:
        return codes
    per = 8 // bits
    n = codes.numel()
    if n % per:
        codes = F.pad(codes, (0, per - n % per))
    grid = codes.view(-1, per)
    out = grid[:, 0].clone()
    for j in range(1, per):
        out.bitwise_or_(grid[:, j] << (bits * j))
    return out


def unpack_bits(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """Inverse of `pack_bits`: the first `numel` codes as uint8."""
    if bits == 8:
        return packed[:numel]
    per = 8 // bits
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)
    codes = (packed[:, None] >> shifts).bitwise_and_((1 << bits) - 1)
    return codes.view(-1)[:numel]


def quantized_wire_size(numel: int, bits: int) -> int:
    """Bytes of codes plus scales for `numel` elements."""
    return packed_size(numel, bits) + 4 * bucket_count(numel)


def decode_quantized(codes: bytes, scales: bytes, bits: int, numel: int, device: torch.device | str, what: str) -> torch.Tensor:
    """Validate and dequantize untrusted parts into a flat fp32 tensor on `device`."""
    nb = bucket_count(numel)
    expect_bytes(codes, packed_size(numel, bits), f"{what} codes")
    expect_bytes(scales, 4 * nb, f"{what} scales")
    scale_t = bytes_to_tensor(scales, torch.float32, nb, device)
    require_finite(scale_t, f"{what} scales")
    if nb and bool((scale_t < 0).any()):
        raise CompressionError(f"{what}: negative bucket scale")
    packed = bytes_to_tensor(codes, torch.uint8, len(codes), device)
    return dequantize(packed, scale_t, bits, numel)


class QSGD(Codec):
    """Unbiased `bits`-bit stochastic quantization with one fp32 scale per `BUCKET` elements."""

    lossless = False

    def __init__(self, bits: int) -> None:
        if bits not in BITS:
            raise ValueError(f"qsgd bits must be one of {BITS}, got {bits}")
        self.bits = bits
        self.spec = f"qsgd:{bits}"
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


def _qsgd(arg: str | None) -> Codec:
    if not arg or not arg.isdigit():
        raise ValueError(f"qsgd needs a bit width, one of {BITS}, e.g. qsgd:8; got {arg!r}")
    return QSGD(int(arg))


register_codec("qsgd", _qsgd)
