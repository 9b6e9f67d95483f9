"""Per-step optimizer hyper-parameters: the names both ends know, their defaults and bounds.

A worker's `param_groups` (what LR schedulers and users change between steps) travel in every
PUSH as one small map per group (`Push.hparams`), and the PS applies them to its torch optimizer
for that step (docs/ARCHITECTURE.md, "The optimizer"). Both sides need the same names and
defaults (the worker builds its groups from them, the PS's `OptimizerSettings` defaults to them),
and neither may import the other, so they live here, beside the wire schema that carries them.
A peer's values are never trusted: only these names, finite, within these bounds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from netsense.errors import ProtocolError

DEFAULTS: dict[str, float] = {
    "lr": 0.05,
    "momentum": 0.9,
    "weight_decay": 0.0,
    "beta1": 0.9,
    "beta2": 0.999,
    "eps": 1e-8,
}
"""The PS optimizer's default hyper-parameters (`netsense.ps.optim.OptimizerSettings`)."""

PER_OPTIMIZER: dict[str, tuple[str, ...]] = {
    "sgd": ("lr", "momentum", "weight_decay"),
    "adam": ("lr", "beta1", "beta2", "eps", "weight_decay"),
    "adamw": ("lr", "beta1", "beta2", "eps", "weight_decay"),
}
"""The hyper-parameters a step may set, per optimizer (anything else is fixed at INIT)."""


def scales_per_coordinate(name: str) -> bool:
    """Whether optimizer `name` divides each coordinate by its gradient's second moment (one with a
    beta2: Adam, AdamW): the uplink's windows price levels in its metric, and the downlink's rounds
    in its own (docs/POLICIES.md)."""
    return "beta2" in PER_OPTIMIZER.get(name, ())

BOUNDS: dict[str, tuple[float, float, bool]] = {
    "lr": (0.0, 1e3, False),
    "momentum": (0.0, 1.0, False),
    "weight_decay": (0.0, 1e3, False),
    "beta1": (0.0, 1.0, False),
    "beta2": (0.0, 1.0, False),
    "eps": (0.0, 1.0, True),
}
"""name -> (low, high, low exclusive): values must be in [low, high) (or (low, high)). A step's lr
may be 0 (a warm-up from zero); the configured lr may not (`OptimizerSettings`)."""

MAX_GROUPS = 64
"""Most parameter groups one PUSH may describe."""


def check_value(name: str, value: object) -> float:
    """`value` as a float if `name` is a known hyper-parameter and it is finite and in bounds."""
    if name not in BOUNDS:
        raise ProtocolError("hparams", f"unknown hyper-parameter {name!r}; known: {sorted(BOUNDS)}")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ProtocolError("hparams", f"hyper-parameter {name!r} must be a number, got {value!r}")
    v = float(value)
    lo, hi, open_low = BOUNDS[name]
    if not math.isfinite(v) or not (v > lo if open_low else v >= lo) or not v < hi:
        interval = f"{'(' if open_low else '['}{lo:g}, {hi:g})"
        raise ProtocolError("hparams", f"hyper-parameter {name!r} = {value!r} must be finite, in {interval}")
    return v


def check_group(raw: object) -> dict[str, float]:
    """One group's map, validated (names, types, bounds)."""
    if not isinstance(raw, Mapping) or len(raw) > len(BOUNDS):
        raise ProtocolError("hparams", f"a group's hyper-parameters must be a map of <= {len(BOUNDS)} names")
    out: dict[str, float] = {}
    for name, value in raw.items():
        if not isinstance(name, str):
            raise ProtocolError("hparams", f"hyper-parameter names must be strings, got {name!r}")
        out[name] = check_value(name, value)
    return out


def check_allowed(optimizer: str, group: Mapping[str, float]) -> None:
    """Refuse a name the `optimizer` has no use for (e.g. ``beta1`` for SGD): the two ends disagree."""
    allowed = PER_OPTIMIZER.get(optimizer, ())
    extra = sorted(set(group) - set(allowed))
    if extra:
        raise ProtocolError("hparams", f"hyper-parameters {extra} do not apply to {optimizer}; it takes {list(allowed)}")
