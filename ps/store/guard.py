"""`StepGuard`: an optimizer step that would make a parameter or optimizer state NaN/Inf is refused
whole, leaving both bit for bit as they were (docs/RELIABILITY.md, "Poisoned updates").

Finite gradients are not enough: two pushes of 3e38 sum to Inf, and momentum or Adam's squared
average can overflow from finite inputs. Checking the result afterwards needs a copy to go back to,
and a copy of parameters + state every step costs more than the step. So the guard first bounds
the step from the largest magnitudes of gradients, parameters and state (`torch.aminmax`, one read
pass, no temporaries) with the optimizer's own formulas: if even the bound stays far below the
dtype's largest value, nothing can overflow and the step runs unguarded. Only when the bound does
not prove it (huge values, an optimizer the guard does not know) does it copy, step, check
(`check_update`) and restore on failure. Pipelined steps (keys applied ahead of the version) always
keep their copies until the version advances, because a refusal of a later key must undo the
earlier ones too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch

from netsense.errors import ProtocolError

MARGIN = 8.0
"""The bound must stay below ``finfo.max / MARGIN``: room for rounding in each of the step's few
operations (each rounds by at most 2**-24 relative in float32)."""


class UpdateRefused(ProtocolError):
    """The step would have made parameters or optimizer state non-finite; nothing was changed."""

    def __init__(self, reason: str) -> None:
        super().__init__("non-finite-update", reason)


def amax_abs(tensors: Iterable[torch.Tensor]) -> float:
    """Largest magnitude over `tensors` (0.0 for none); inf if any element is NaN or Inf."""
    parts = [torch.stack(torch.aminmax(t.detach())).to(torch.float64) for t in tensors if t.numel()]
    if not parts:
        return 0.0
    value = float(torch.stack(parts).abs().amax())  # amax propagates NaN
    return value if math.isfinite(value) else math.inf


def _state_tensors(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> list[torch.Tensor]:
    """The floating-point state of `param` (Adam's integer-valued `step` counter excluded)."""
    state = optimizer.state.get(param, {})
    return [v for k, v in state.items() if k != "step" and isinstance(v, torch.Tensor) and v.is_floating_point()]


def check_update(optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor]) -> None:
    """Raise `UpdateRefused` unless `params` and their optimizer state are all finite."""
    for p in params:
        if amax_abs([p, *_state_tensors(optimizer, p)]) == math.inf:
            raise UpdateRefused("the optimizer step made parameters or optimizer state NaN/Inf; step refused")


def step_bound(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> float:
    """An upper bound of every magnitude the step over `params` (grads set) computes; inf when the
    optimizer is not one whose formulas are known here (SGD, Adam, AdamW without amsgrad)."""
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    worst = 0.0
    for group in {id(group_of[id(p)]): group_of[id(p)] for p in params}.values():
        mine = [p for p in params if group_of[id(p)] is group]
        a_p = amax_abs(mine)
        a_g = amax_abs(p.grad for p in mine if p.grad is not None)
        if math.inf in (a_p, a_g):
            return math.inf
        lr, wd = float(group["lr"]), float(group.get("weight_decay", 0.0))
        if type(optimizer) is torch.optim.SGD:
            m, a_b = float(group["momentum"]), amax_abs(t for p in mine for t in _state_tensors(optimizer, p))
            d = a_g + wd * a_p
            b = m * a_b + d
            d = d + m * b if group["nesterov"] else (b if m else d)
            worst = max(worst, d, b, a_p + lr * d)
        elif type(optimizer) in (torch.optim.Adam, torch.optim.AdamW) and not group.get("amsgrad"):
            b1, b2 = group["betas"]
            states = [optimizer.state.get(p, {}) for p in mine]
            a_m = amax_abs(s["exp_avg"] for s in states if "exp_avg" in s)
            a_v = amax_abs(s["exp_avg_sq"] for s in states if "exp_avg_sq" in s)
            t = 1 + min((float(s["step"]) for s in states if "step" in s), default=0.0)
            g = a_g + (wd * a_p if type(optimizer) is torch.optim.Adam else 0.0)
            m_new, v_new = b1 * a_m + (1 - b1) * g, b2 * a_v + (1 - b2) * g * g
            # |exp_avg / denom| <= exp_avg / eps: denom = sqrt(v_hat) + eps >= eps
            step = lr / (1 - b1**t) * m_new / float(group["eps"])
            worst = max(worst, g * g, m_new, v_new, a_p + step)
        else:
            return math.inf
    return worst


def limit(params: Iterable[torch.Tensor]) -> float:
    """The largest magnitude a step may be bounded by and still run unguarded."""
    return min((float(torch.finfo(p.dtype).max) for p in params), default=math.inf) / MARGIN


class StepGuard:
    """Runs `optimizer.step()` so that a poisoning step changes nothing (see the module docstring)."""

    def __init__(self) -> None:
        self._saved: dict[str, tuple[torch.Tensor, dict[str, object] | None]] = {}
        """Key -> copies of its parameter and state from before the step (pipelined step: until
        `commit`)."""
        self._spare: dict[str, list[torch.Tensor]] = {}  # reused copy buffers: a fresh clone page-faults
        self.guarded_steps = 0
        """Steps that the bound did not prove safe, so they were copied and checked."""

    def step(
        self, optimizer: torch.optim.Optimizer, params: Mapping[str, torch.Tensor], keys: Iterable[str], *, keep: bool = False
    ) -> None:
        """`optimizer.step()` over `keys` of `params` (the store's whole dict; their `.grad` set, no
        other's). `keep`: a pipelined step's keys; their copies stay until `commit`, and a refusal
        restores every kept key."""
        keys = list(keys)
        tensors = [params[k] for k in keys]
        if amax_abs(p.grad for p in tensors if p.grad is not None) == math.inf:
            self.rollback(optimizer, params)
            raise UpdateRefused("the step's mean gradient is NaN/Inf (finite pushes overflowed when summed); step refused")
        safe = step_bound(optimizer, tensors) <= limit(tensors)
        if safe and not keep:
            optimizer.step()
            return
        for key in keys:
            self._save(optimizer, key, params[key])
        optimizer.step()
        if not safe:
            self.guarded_steps += 1
            try:
                check_update(optimizer, tensors)
            except UpdateRefused:
                self.rollback(optimizer, params)
                raise
        if not keep:
            self._saved.clear()

    def commit(self) -> None:
        """The pipelined step is whole: its copies are no longer needed."""
        self._saved.clear()

    def rollback(self, optimizer: torch.optim.Optimizer, params: Mapping[str, torch.Tensor]) -> None:
        """Put every saved key back as it was (`params` must hold them all)."""
        for key, (value, state) in self._saved.items():
            p = params[key]
            p.grad = None
            with torch.no_grad():
                p.copy_(value)
            if state is None:
                optimizer.state.pop(p, None)
            else:
                optimizer.state[p] = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
        self._saved.clear()

    def _save(self, optimizer: torch.optim.Optimizer, key: str, param: torch.Tensor) -> None:
        if key in self._saved:
            return
        values = [param.detach(), *(v for v in optimizer.state.get(param, {}).values() if isinstance(v, torch.Tensor))]
        spare = self._spare.get(key, [])
        if len(spare) != len(values) or any(s.shape != v.shape or s.dtype != v.dtype for s, v in zip(spare, values)):
            spare = self._spare[key] = [torch.empty_like(v) for v in values]
        for s, v in zip(spare, values):
            s.copy_(v)
        state = optimizer.state.get(param)
        copies = iter(spare[1:])
        saved = None if state is None else {k: next(copies) if isinstance(v, torch.Tensor) else v for k, v in state.items()}
        self._saved[key] = (spare[0], saved)
