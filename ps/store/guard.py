"""`StepGuard`: an optimizer step that would make a parameter or optimizer state NaN/Inf is refused
whole, leaving both bit for bit as they were (docs/RELIABILITY.md, "Poisoned updates").

Finite gradients are not enough: two pushes of 3e38 overflow SGD momentum (0.9 * 3e38 + 3e38), and
Adam's squared average or a large learning rate can overflow from finite inputs. Checking the
result afterwards needs a copy to go back to, and a copy of parameters + state every step costs
about as much as the step. So the guard proves the step finite first: it carries per key upper
bounds of |parameter| and |state| from step to step with the optimizer's own formulas, reads only
the step's mean gradient (`torch.aminmax`, no temporaries), and if every bound stays far below the
dtype's largest value nothing can overflow and the step runs unguarded. A bound grown past the
limit is measured afresh; only when even that does not prove the step (huge values, an optimizer
the guard does not know) does it copy, step, check (`check_update`) and restore on failure.
Pipelined steps (keys applied ahead of the version) always keep their copies until the version
advances, because a refusal of a later key must undo the earlier ones too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from netsense.errors import ProtocolError

MARGIN = 8.0
"""The bound must stay below ``finfo.max / MARGIN``: room for rounding in each of the step's few
operations (each rounds by at most 2**-24 relative in float32)."""


SLACK = 1 + 2**-16
"""Carried bounds are widened by this per step: torch computes in float32, the bounds in float64, and
each of a step's few float32 operations may round up by 2**-24 relative."""


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


def amax_each(tensors: list[torch.Tensor]) -> list[float]:
    """`amax_abs` of each tensor, with one device sync for all of them."""
    if not tensors:
        return []
    zero = torch.zeros(2, dtype=torch.float64)
    rows = torch.stack([torch.stack(torch.aminmax(t.detach())).to(torch.float64) if t.numel() else zero for t in tensors])
    return [v if math.isfinite(v) else math.inf for v in rows.abs().amax(dim=1).tolist()]


def _state_tensors(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> list[torch.Tensor]:
    """The floating-point state of `param` (Adam's integer-valued `step` counter excluded)."""
    state = optimizer.state.get(param, {})
    return [v for k, v in state.items() if k != "step" and isinstance(v, torch.Tensor) and v.is_floating_point()]


def check_update(optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor]) -> None:
    """Raise `UpdateRefused` unless `params` and their optimizer state are all finite."""
    for p in params:
        if amax_abs([p, *_state_tensors(optimizer, p)]) == math.inf:
            raise UpdateRefused("the optimizer step made parameters or optimizer state NaN/Inf; step refused")


def _sgd_bound(group: dict[str, Any], p: float, state: tuple[float, ...], g: float) -> tuple[float, tuple[float, ...], float]:
    """torch SGD: d = g + wd p; buf = m buf + (1 - dampening) d (the first step: buf = d); d = d + m buf
    (nesterov) or buf; p -= lr d. Returns (largest intermediate, new state bounds, new param bound)."""
    lr, wd, m, damp = (float(group[k]) for k in ("lr", "weight_decay", "momentum", "dampening"))
    b = state[0] if state else 0.0
    d = g + wd * p
    if m:
        b = m * b + max(1.0, abs(1 - damp)) * d
        d = d + m * b if group["nesterov"] else b
    p_new = p + lr * d
    return max(d, b, lr * d, p_new), ((b,) if m else ()), p_new


def _adam_bound(
    group: dict[str, Any], p: float, state: tuple[float, ...], g: float, t: float, recursion: bool
) -> tuple[float, tuple[float, ...], float]:
    """torch Adam/AdamW: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; p -= lr / bc1 * m /
    (sqrt(v) / sqrt(bc2) + eps), with bc_i = 1 - b_i^t. The ratio is at most m / eps (the
    denominator is at least eps) and, when m and v are sums of the same gradients with betas that
    never changed (`recursion`) and b1^2 < b2, at most sqrt(bc2) * (1 - b1) / sqrt((1 - b2)(1 - b1^2 / b2))
    by Cauchy-Schwarz (7.3 for the default betas): an update is a few lr, whatever the gradients."""
    lr, wd, eps = float(group["lr"]), float(group["weight_decay"]), float(group["eps"])
    b1, b2 = (float(b) for b in group["betas"])
    a_m, a_v = state if state else (0.0, 0.0)
    if not group.get("decoupled_weight_decay"):
        g = g + wd * p
    m, v = b1 * a_m + (1 - b1) * g, b2 * a_v + (1 - b2) * g * g
    ratio = m / eps
    if recursion and b1 * b1 < b2:
        # + 1e-6: a v that underflowed to 0 in float32 (|g| < 1e-19) leaves a tiny m over eps
        ratio = min(ratio, math.sqrt(1 - b2**t) * (1 - b1) / math.sqrt((1 - b2) * (1 - b1 * b1 / b2)) * (1 + 1e-3) + 1e-6)
    step = lr / (1 - b1**t) * ratio
    p_new = p + lr * wd * p + step
    return max(g * g, m, v, m / (1 - b1**t), step, p_new), (m, v), p_new


def _kind(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> str | None:
    """Which formulas bound a step of this group; None: unknown, always copy and check."""
    if type(optimizer) is torch.optim.SGD and not group.get("maximize"):
        return "sgd"
    if type(optimizer) in (torch.optim.Adam, torch.optim.AdamW) and not group.get("amsgrad") and not group.get("maximize"):
        return "adam"
    return None


def _state_names(kind: str) -> tuple[str, ...]:
    return ("momentum_buffer",) if kind == "sgd" else ("exp_avg", "exp_avg_sq")


def limit(params: Iterable[torch.Tensor]) -> float:
    """The largest magnitude a step may be bounded by and still run unguarded."""
    return min((float(torch.finfo(p.dtype).max) for p in params), default=math.inf) / MARGIN


class StepGuard:
    """Runs `optimizer.step()` so that a poisoning step changes nothing (see the module docstring).

    It keeps, per key, upper bounds of the parameter's and its state's magnitudes, carried from
    step to step by the same formulas (so an ordinary step reads only its gradient to be proven
    safe); a bound that grows past the limit is replaced by a measurement first."""

    def __init__(self) -> None:
        self._saved: dict[str, tuple[torch.Tensor, dict[str, object] | None]] = {}
        """Key -> copies of its parameter and state from before the step (pipelined step: until
        `commit`)."""
        self._spare: dict[str, list[torch.Tensor]] = {}  # reused copy buffers: a fresh clone page-faults
        self._bounds: dict[str, tuple[float, tuple[float, ...]]] = {}
        """Key -> (bound of |param|, bounds of |state tensors|) after the last step."""
        self._betas: dict[str, tuple[float, ...]] = {}  # key -> Adam betas its state was built with
        self.guarded_steps = 0
        """Steps that the bound did not prove safe, so they were copied and checked."""
        self.measured = 0
        """Keys whose bounds were measured (first step, after a restore, or grown past the limit)."""

    def forget(self) -> None:
        """The parameters or state changed outside the guard (INIT, restore): measure them again."""
        self._bounds.clear()
        self._betas.clear()
        self._saved.clear()
        self._spare.clear()

    def step(
        self, optimizer: torch.optim.Optimizer, params: Mapping[str, torch.Tensor], keys: Iterable[str], *, keep: bool = False
    ) -> None:
        """`optimizer.step()` over `keys` of `params` (the store's whole dict; their `.grad` set, no
        other's). `keep`: a pipelined step's keys; their copies stay until `commit`, and a refusal
        restores every kept key."""
        keys = list(keys)
        tensors = [params[k] for k in keys]
        grads = dict(zip(keys, amax_each([params[k].grad if params[k].grad is not None else params[k][:0] for k in keys])))
        if math.inf in grads.values():
            self.rollback(optimizer, params)
            raise UpdateRefused("the step's mean gradient is NaN/Inf; step refused")
        lim = limit(tensors)
        after = self._prove(optimizer, params, keys, grads, lim)
        if after is None:
            for k in keys:  # measured afresh: slack carried over many steps may be what failed
                self._bounds.pop(k, None)
            after = self._prove(optimizer, params, keys, grads, lim)
        if after is not None and not keep:
            optimizer.step()
            self._bounds.update(after)
            return
        for key in keys:
            self._save(optimizer, key, params[key])
        optimizer.step()
        if after is None:
            self.guarded_steps += 1
            try:
                check_update(optimizer, tensors)
            except UpdateRefused:
                self.rollback(optimizer, params)
                raise
            for k in keys:
                self._bounds.pop(k, None)  # measured at the next step
        else:
            self._bounds.update(after)
        if not keep:
            self._saved.clear()

    def _prove(
        self, optimizer: torch.optim.Optimizer, params: Mapping[str, torch.Tensor], keys: list[str], grads: dict[str, float], lim: float
    ) -> dict[str, tuple[float, tuple[float, ...]]] | None:
        """Each key's bounds after the step, if every magnitude the step computes stays below
        `lim`; None if that is not proven."""
        group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        out = {}
        for key in keys:
            param = params[key]
            group = group_of[id(param)]
            kind = _kind(optimizer, group)
            if kind is None:
                return None
            state = optimizer.state.get(param, {})
            known = self._bounds.get(key)
            if known is None or len(known[1]) != sum(1 for n in _state_names(kind) if isinstance(state.get(n), torch.Tensor)):
                self.measured += 1
                names = [n for n in _state_names(kind) if isinstance(state.get(n), torch.Tensor)]
                known = (amax_abs([param]), tuple(amax_abs([state[n]]) for n in names))  # type: ignore[list-item]
            if kind == "sgd":
                worst, new_state, p_new = _sgd_bound(group, known[0], known[1], grads[key])
            else:
                t = 1.0 + (float(state["step"]) if "step" in state else 0.0)
                betas = tuple(float(b) for b in group["betas"])
                recursion = self._betas.setdefault(key, betas) == betas  # the state's betas: the first ones seen
                worst, new_state, p_new = _adam_bound(group, known[0], known[1], grads[key], t, recursion)
            if not worst <= lim:  # NaN-safe
                return None
            out[key] = (p_new * SLACK, tuple(b * SLACK for b in new_state))
        return out

    def kept(self) -> dict[str, dict[str, torch.Tensor] | None]:
        """Key -> its optimizer state before the step under way, for the keys a pipelined step
        applied ahead (None: it had none yet); copies the next step reuses, read them at once."""
        return {key: state for key, (_, state) in self._saved.items()}

    def commit(self) -> None:
        """The pipelined step is whole: its copies are no longer needed."""
        self._saved.clear()

    def rollback(self, optimizer: torch.optim.Optimizer, params: Mapping[str, torch.Tensor]) -> None:
        """Put every saved key back as it was (`params` must hold them all)."""
        for key, (value, state) in self._saved.items():
            self._bounds.pop(key, None)  # bounds of the step's result, not of what is put back
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
