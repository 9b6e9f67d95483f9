"""Dense codecs: fp32 identity (lossless) and 16-bit casts (the strong baseline)."""

from __future__ import annotations

import torch

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
from .limits import cast_clamped


class Identity(Codec):
    """Sends the tensor in its own dtype, unchanged."""

    spec = "fp32"
    lossless = True

    def encode(self, tensor: torch.Tensor) -> Payload:
        return Payload(self.spec, tuple(tensor.shape), DTYPE_NAMES[tensor.dtype], (tensor_to_bytes(tensor),))

    def decode(self, payload: Payload, *, device: torch.device | str = "cpu") -> torch.Tensor:
        dtype = check_payload_header(payload, codec=self.spec, parts=1, meta=0)
        n = payload.numel
        expect_bytes(payload.parts[0], n * dtype.itemsize, "fp32 values")
        # Shares memory with the payload's bytes (no copy): receivers only read it (the store
        # accumulates from it, a worker copies it into its replica).
        return bytes_to_tensor(payload.parts[0], dtype, n, device, copy=False).reshape(payload.shape)


class HalfCast(Codec):
    """Casts to a 16-bit float for the wire and back to the original dtype on decode.

    Finite values beyond the wire's range are clamped to its largest value (and counted in
    `clamped`) rather than sent as inf: under error feedback the clamped-off part stays in the
    residual and follows in later steps (docs/RELIABILITY.md, "Error feedback safety")."""

    lossless = False

    def __init__(self, spec: str, wire_dtype: torch.dtype) -> None:
        self.spec = spec
        self.wire_dtype = wire_dtype

    def encode(self, tensor: torch.Tensor) -> Payload:
        wire, cut = cast_clamped(tensor.detach(), self.wire_dtype)
        self.clamped += cut
        return Payload(self.spec, tuple(tensor.shape), DTYPE_NAMES[tensor.dtype], (tensor_to_bytes(wire),))

    def decode(self, payload: Payload, *, device: torch.device | str = "cpu") -> torch.Tensor:
        dtype = check_payload_header(payload, codec=self.spec, parts=1, meta=0)
        n = payload.numel
        expect_bytes(payload.parts[0], n * 2, f"{self.spec} values")
        wire = bytes_to_tensor(payload.parts[0], self.wire_dtype, n, device, copy=False)  # only read
        return empty_dense(n, dtype, device).copy_(wire).reshape(payload.shape)

    def nominal_ratio(self, numel: int) -> float:
        return 0.5

    def nominal_progress(self, numel: int) -> float:
        # Relative rounding error <= 2^-11 (fp16) or 2^-8 (bf16) per element: energy error <= its square.
        unit = 2.0**-11 if self.wire_dtype == torch.float16 else 2.0**-8
        return 1.0 - unit * unit


def _no_arg(name: str, arg: str | None) -> None:
    if arg:
        raise ValueError(f"{name} takes no argument, got {arg!r}")


def _identity(arg: str | None) -> Codec:
    _no_arg("fp32", arg)
    return Identity()


def _fp16(arg: str | None) -> Codec:
    _no_arg("fp16", arg)
    return HalfCast("fp16", torch.float16)


def _bf16(arg: str | None) -> Codec:
    _no_arg("bf16", arg)
    return HalfCast("bf16", torch.bfloat16)


register_codec("fp32", _identity)
register_codec("none", _identity)
register_codec("fp16", _fp16)
register_codec("bf16", _bf16)
