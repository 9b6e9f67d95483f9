"""The step's gradient from its pushes: one summation order, shared by the PS and its workers.

A gradient-domain PS that forwards a key's pushes (docs/ARCHITECTURE.md, "Forwarded pushes") has
every worker rebuild the step's gradient from them, and replicas stay equal to the PS's
parameters bit for bit only if every side adds the same terms in the same order with the same
operations: a weighted add may fuse its multiply (FMA), so a + w*b and b + w*a differ in the last
bit. This is that one order.
"""

from __future__ import annotations

import torch


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
