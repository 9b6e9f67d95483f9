"""The step's gradient from its pushes: one summation order, shared by the PS and its workers.

A gradient-domain PS that forwards a key's pushes (docs/ARCHITECTURE.md, "Forwarded pushes") has
every worker rebuild the step's gradient from them, and replicas stay equal to the PS's
parameters bit for bit only if every side adds the same terms in the same order with the same
operations: a weighted add may fuse its multiply (FMA), so a + w*b and b + w*a differ in the last
bit. This is that one order.
"""

from __future__ import annotations

import torch

from netsense.compression import Payload, make_codec
from netsense.compression.limits import all_finite
from netsense.errors import CompressionError, ProtocolError

from .messages import Sum


def weighted_sum(terms: list[tuple[torch.Tensor, float]], dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """sum(weight * tensor) in `dtype`, in the order of `terms` (at least one); into `out` when
    given (its shape and dtype the result's), else a new tensor."""
    (first, weight), rest = terms[0], terms[1:]
    if out is None:
        out = torch.mul(first.to(dtype), weight)
    else:
        torch.mul(first.to(dtype), weight, out=out)
    for tensor, w in rest:
        out.add_(tensor.to(dtype), alpha=w)
    return out


def forwarded_gradient(key: str, terms: Sum, own: Payload | None, shape: tuple[int, ...]) -> torch.Tensor:
    """The step's gradient of `key` from its forwarded pushes and the recipient's `own` push
    (`Sum.own`), in the PS's order and arithmetic, in its parameters' float32: the PS's gradient
    bit for bit. Every push is checked as a PS checks one (shape, codec, finite)."""
    values = []
    for payload in pushes_of(key, terms, own):
        if tuple(payload.shape) != shape:
            raise ProtocolError("shape", f"key {key!r}: forwarded shape {payload.shape} != model shape {shape}")
        try:
            value = make_codec(payload.codec).decode(payload)
        except CompressionError as exc:
            raise ProtocolError("bad-payload", f"forwarded push of {key!r}: {exc}") from None
        if not all_finite(value):
            raise ProtocolError("non-finite", f"forwarded push of {key!r} has NaN/Inf; rejected")
        values.append(value)
    return weighted_sum(list(zip(values, terms.weights)), torch.float32)


def pushes_of(key: str, terms: Sum, own: Payload | None) -> list[Payload]:
    """Every push of `terms` in order, `own` at its index (a relay hands its site's workers the
    whole sum: `Sum(weights, -1, pushes_of(...))`)."""
    pushes = list(terms.pushes)
    if terms.own >= 0:
        if own is None:
            raise ProtocolError("key", f"forwarded pushes of key {key!r} count this peer's, which it did not push")
        pushes.insert(terms.own, own)
    return pushes
