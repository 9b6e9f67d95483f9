"""The worker's param groups as the PS sees them: defaults from the optimizer settings, and each
step's hyper-parameters as PUSH fields.

`NetSenseOptimizer` is a `torch.optim.Optimizer`, so LR schedulers, GradScaler and user code change
its `param_groups` between steps; what the PS needs of them is one small map per group (the names
of `netsense.transport.hparams`) and which keys belong to which group. The PS applies them to that
step (docs/ARCHITECTURE.md, "The optimizer").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from netsense.errors import ConfigError, ProtocolError
from netsense.transport.hparams import DEFAULTS, PER_OPTIMIZER, check_value

from .client import StepFields
from .layout import KeySlot


def optimizer_name(settings: Mapping[str, object]) -> str:
    name = settings.get("name", "sgd")
    if name not in PER_OPTIMIZER:
        raise ConfigError(f"optimizer {name!r} unknown; use {', '.join(PER_OPTIMIZER)}")
    return str(name)


def group_defaults(settings: Mapping[str, object]) -> dict[str, Any]:
    """torch.optim-style defaults for the param groups, from the PS optimizer settings (the same
    defaults the PS fills in, so both ends start from the same values)."""
    name = optimizer_name(settings)

    def get(key: str) -> Any:
        return settings.get(key, DEFAULTS[key])

    if name == "sgd":
        return {"lr": get("lr"), "momentum": get("momentum"), "weight_decay": get("weight_decay"), "nesterov": bool(settings.get("nesterov", False))}
    return {"lr": get("lr"), "betas": (get("beta1"), get("beta2")), "eps": get("eps"), "weight_decay": get("weight_decay")}


def wire_group(name: str, group: Mapping[str, Any], index: int) -> dict[str, float]:
    """One param group's hyper-parameters by wire name, validated as the PS will (finite, in bounds)."""
    values: dict[str, Any] = {k: group.get(k) for k in PER_OPTIMIZER[name] if k not in ("beta1", "beta2")}
    if name != "sgd":
        betas = group.get("betas")
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ConfigError(f"param group {index}: betas must be a pair, got {betas!r}")
        values["beta1"], values["beta2"] = betas
    out = {}
    for key, value in values.items():
        try:
            out[key] = check_value(key, float(value.item() if isinstance(value, torch.Tensor) else value))  # type: ignore[arg-type]
        except (TypeError, ValueError, ProtocolError) as exc:
            raise ConfigError(f"param group {index}: {exc}") from None
    return out


def check_groups(param_groups: Sequence[Mapping[str, Any]], slots: Sequence[KeySlot]) -> None:
    """Every trainable parameter of the model in a group, and nothing else: a parameter outside
    the groups would be pushed without a GradScaler unscaling it, one outside the model has no key."""
    in_groups = {id(p) for g in param_groups for p in g["params"]}
    in_model = {id(s.param) for s in slots}
    if in_groups - in_model:
        raise ConfigError(f"{len(in_groups - in_model)} tensor(s) in the param groups are not trainable parameters of the model")
    missing = sorted({s.key.split("#")[0] for s in slots if id(s.param) not in in_groups})
    if missing:
        raise ConfigError(f"parameters {missing[:5]} of the model are in no param group; every trainable parameter must be in one")


def step_fields(name: str, param_groups: Sequence[Mapping[str, Any]], slots: Sequence[KeySlot], *, skip: bool = False) -> StepFields:
    """This step's PUSH fields from the param groups as they are now. A worker keeps its pushes
    (`Replica.own`), so a gradient-domain PS may forward it the others' (`Push.keeps`)."""
    index = {id(p): i for i, g in enumerate(param_groups) for p in g["params"]}
    hparams = tuple(wire_group(name, g, i) for i, g in enumerate(param_groups))
    key_groups = {s.key: index[id(s.param)] for s in slots if index.get(id(s.param), 0)}
    return StepFields(hparams, key_groups, skip, keeps=True)
