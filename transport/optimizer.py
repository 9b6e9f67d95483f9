"""The optimizer settings both ends agree on, validated from what rank 0 sends in INIT, and one step of it.

The PS runs the real `torch.optim` classes on its authoritative tensors, so a NetSense run and a
single-process run with the same settings follow the same arithmetic; a worker of a
gradient-domain PS runs the same classes from the same settings (worker/mirror.py). A step may bring its own
hyper-parameters (the workers' param groups, e.g. an LR schedule's lr): they apply to that step
only, and the settings stay what INIT said (`step_with`); with ``clip_grad_norm`` the step's
aggregated gradient is clipped first, as `torch.nn.utils.clip_grad_norm_` does.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from netsense.compression import Payload, make_codec
from netsense.errors import ConfigError

from .hparams import DEFAULTS, scales_per_coordinate

Hyper = tuple[tuple[str, float], ...]
"""One key's hyper-parameters for a step, as sorted (name, value) pairs (hashable: keys with the
same ones step together)."""


@dataclass(frozen=True)
class OptimizerSettings:
    """Which optimizer the PS applies, with its hyper-parameters."""

    name: str = "sgd"
    """``sgd`` (with momentum / weight decay / nesterov) or ``adam`` / ``adamw``."""
    lr: float = DEFAULTS["lr"]
    """Learning rate."""
    momentum: float = DEFAULTS["momentum"]
    """SGD momentum."""
    weight_decay: float = DEFAULTS["weight_decay"]
    """L2 penalty (decoupled for adamw)."""
    nesterov: bool = False
    """SGD Nesterov momentum."""
    beta1: float = DEFAULTS["beta1"]
    """Adam first-moment decay."""
    beta2: float = DEFAULTS["beta2"]
    """Adam second-moment decay."""
    eps: float = DEFAULTS["eps"]
    """Adam denominator epsilon."""
    clip_grad_norm: float = 0.0
    """> 0: clip the step's aggregated gradient (over every key of this PS, i.e. per shard) to this
    global L2 norm before the step, as `torch.nn.utils.clip_grad_norm_`; 0: no clipping."""

    @property
    def per_coordinate(self) -> bool:
        """Whether the optimizer scales each coordinate by its gradient's second moment (Adam,
        AdamW): its updates are priced in that metric (`adam_metric`)."""
        return scales_per_coordinate(self.name)

    def __post_init__(self) -> None:
        if self.name not in ("sgd", "adam", "adamw"):
            raise ConfigError(f"optimizer {self.name!r} unknown; use sgd, adam or adamw")
        if not (self.lr > 0 and self.lr < 1e3):
            raise ConfigError(f"optimizer lr must be in (0, 1000), got {self.lr}")
        for name in ("momentum", "beta1", "beta2"):
            v = getattr(self, name)
            if not 0 <= v < 1:
                raise ConfigError(f"optimizer {name} must be in [0, 1), got {v}")
        if not (0 <= self.weight_decay < 1e3 and 0 < self.eps < 1):
            raise ConfigError(f"weight_decay must be in [0, 1000) and eps in (0, 1), got {self.weight_decay}, {self.eps}")
        clip = self.clip_grad_norm
        if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not 0 <= clip < math.inf:
            raise ConfigError(f"clip_grad_norm must be finite and >= 0 (0: off), got {self.clip_grad_norm!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OptimizerSettings:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown optimizer settings {sorted(unknown)}; known: {sorted(known)}")
        try:
            return cls(**d)
        except TypeError as exc:
            raise ConfigError(f"bad optimizer settings {d!r}: {exc}") from None

    def build(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        """The torch optimizer over `params`."""
        if self.name == "sgd":
            return torch.optim.SGD(
                params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay, nesterov=self.nesterov
            )
        cls = torch.optim.Adam if self.name == "adam" else torch.optim.AdamW
        return cls(params, lr=self.lr, betas=(self.beta1, self.beta2), eps=self.eps, weight_decay=self.weight_decay)

    def base(self) -> dict[str, float]:
        """The per-step hyper-parameters as INIT set them, by wire name (`netsense.transport.hparams`)."""
        if self.name == "sgd":
            return {"lr": self.lr, "momentum": self.momentum, "weight_decay": self.weight_decay}
        return {"lr": self.lr, "beta1": self.beta1, "beta2": self.beta2, "eps": self.eps, "weight_decay": self.weight_decay}

    def clip(self, params: list[torch.Tensor]) -> None:
        """Clip the gradients of `params` (every key of the step) to `clip_grad_norm`, if set."""
        if self.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm)

    @contextmanager
    def step_with(self, optimizer: torch.optim.Optimizer, hyper: Hyper | None) -> Iterator[None]:
        """Within: `optimizer`'s group holds this step's hyper-parameters (None: INIT's); after:
        INIT's again, so a later step without any (and a checkpoint) sees the settings."""
        if not hyper:
            yield
            return
        group = optimizer.param_groups[0]
        saved = {k: group[k] for k in ("lr", "momentum", "weight_decay", "betas", "eps") if k in group}
        group.update(_torch_names(dict(hyper), group))
        try:
            yield
        finally:
            group.update(saved)


def _torch_names(hyper: Mapping[str, float], group: Mapping[str, Any]) -> dict[str, Any]:
    """Wire names as torch.optim's param group spells them (``beta1``/``beta2`` -> ``betas``)."""
    out: dict[str, Any] = {k: v for k, v in hyper.items() if k not in ("beta1", "beta2")}
    if "beta1" in hyper or "beta2" in hyper:
        beta1, beta2 = group["betas"]
        out["betas"] = (hyper.get("beta1", beta1), hyper.get("beta2", beta2))
    return out


def as_hyper(group: Mapping[str, float]) -> Hyper:
    """A group's hyper-parameters in their hashable form."""
    return tuple(sorted(group.items()))


STATE_NAMES = ("momentum_buffer", "exp_avg", "exp_avg_sq", "step")
"""The per-parameter optimizer state a gradient-domain full PARAMS carries (SGD, Adam, AdamW)."""


def optimizer_state_payloads(
    optimizer: torch.optim.Optimizer, params: Mapping[str, torch.Tensor], before: Mapping[str, Mapping[str, Any] | None] | None = None
) -> dict[str, Payload]:
    """Each key's optimizer state, ``<state name>:<key>`` -> lossless payload (a replica running the
    same optimizer needs it to step as the PS does: docs/ARCHITECTURE.md, "Gradient-domain
    downlink"). States not yet made (before a key's first step) are left out. `before`: keys whose
    state to send as it was before a step still under way (a pipelined step's keys applied ahead:
    the parameters sent are the previous version's, `StepGuard.kept`)."""
    fp32 = make_codec("fp32")
    out = {}
    before = before or {}
    for key, param in params.items():
        state = before[key] if key in before else optimizer.state.get(param)
        for name, value in (state or {}).items():
            if name in STATE_NAMES and isinstance(value, torch.Tensor):
                out[f"{name}:{key}"] = fp32.encode(value.detach())
    return out
