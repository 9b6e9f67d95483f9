"""Server-side optimizer settings, validated from what rank 0 sends in INIT.

The PS runs the real `torch.optim` classes on its authoritative tensors, so a NetSense run and a
single-process run with the same settings follow the same arithmetic.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from netsense.errors import ConfigError


@dataclass(frozen=True)
class OptimizerSettings:
    """Which optimizer the PS applies, with its hyper-parameters."""

    name: str = "sgd"
    """``sgd`` (with momentum / weight decay / nesterov) or ``adam`` / ``adamw``."""
    lr: float = 0.05
    """Learning rate."""
    momentum: float = 0.9
    """SGD momentum."""
    weight_decay: float = 0.0
    """L2 penalty (decoupled for adamw)."""
    nesterov: bool = False
    """SGD Nesterov momentum."""
    beta1: float = 0.9
    """Adam first-moment decay."""
    beta2: float = 0.999
    """Adam second-moment decay."""
    eps: float = 1e-8
    """Adam denominator epsilon."""

    def __post_init__(self) -> None:
        if self.name not in ("sgd", "adam", "adamw"):
            raise ConfigError(f"optimizer {self.name!r} unknown; use sgd, adam or adamw")
        if not (self.lr > 0 and self.lr < 1e3):
            raise ConfigError(f"optimizer lr must be in (0, 1000), got {self.lr}")
        for name in ("momentum", "beta1", "beta2"):
            v = getattr(self, name)
            if not 0 <= v < 1:
                raise ConfigError(f"optimizer {name} must be in [0, 1), got {v}")
        if self.weight_decay < 0 or self.eps <= 0:
            raise ConfigError(f"weight_decay must be >= 0 and eps > 0, got {self.weight_decay}, {self.eps}")

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
