"""`torch.amp.GradScaler` with `NetSenseOptimizer`: unscale here, and never miss the barrier.

A stock optimizer lets `GradScaler.step(opt)` unscale its gradients and skips `opt.step()` when
they hold Inf/NaN. A skipped `step()` would leave the PS's sync barrier waiting for this worker
until its timeout, so `NetSenseOptimizer` declares `_step_supports_amp_scaling`: the scaler then
always calls `step()`, with its scale (`opt.grad_scale`, None once the user called
`scaler.unscale_(opt)`) and its verdict (`opt.found_inf`) set as attributes. `step()` unscales with
the scaler's own kernel and reciprocal (so the gradients equal a stock optimizer's, bit for bit)
and, on Inf/NaN, sends a skip PUSH: the worker sits the step out and the PS averages the others.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import torch


def scaler_verdict(opt: object) -> tuple[torch.Tensor | None, bool]:
    """(the scale to divide by, or None; whether the scaler found Inf/NaN) for this `step()` call."""
    found = getattr(opt, "found_inf", None)
    return getattr(opt, "grad_scale", None), found is not None and bool(found.item() > 0)


def unscale(param_groups: Sequence[Mapping[str, Any]], scale: torch.Tensor) -> bool:
    """Divide the groups' gradients by `scale` in place, as `GradScaler.unscale_` does; True if
    they are all finite afterwards."""
    inv = scale.double().reciprocal().float()
    by_device: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    for group in param_groups:
        for p in group["params"]:
            if p.grad is not None:
                by_device[(p.grad.device, p.grad.dtype)].append(p.grad)
    finite = True
    for (device, _), grads in by_device.items():
        found = torch.zeros(1, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv.to(device))
        finite = finite and not bool(found.item())
    return finite
