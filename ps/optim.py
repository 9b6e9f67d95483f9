"""The PS's view of its optimizer: the settings and step (shared with workers that run the PS's
optimizer, `netsense.transport.optimizer`) and the metric an Adam job's downlink is priced in."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from netsense.transport.optimizer import (
    STATE_NAMES, Hyper, OptimizerSettings, as_hyper, optimizer_state_payloads,
)

__all__ = ["STATE_NAMES", "Hyper", "OptimizerSettings", "adam_metric", "as_hyper", "optimizer_state_payloads"]


def adam_metric(optimizer: torch.optim.Optimizer, params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """Per key, sqrt(v_hat) + eps: the diagonal curvature an Adam or AdamW step assumes (it moves
    coordinate i by m_i over that), new tensors. What a parameter error e costs, and what an update
    u is worth, in the loss Adam models: sum_i (sqrt(v_hat_i) + eps) e_i^2 (docs/POLICIES.md, "The
    downlink's metric"). None for another optimizer or while a key has no second moment yet."""
    if not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        return None
    eps = float(optimizer.param_groups[0]["eps"])
    beta2 = float(optimizer.param_groups[0]["betas"][1])
    out = {}
    for key, param in params.items():
        state = optimizer.state.get(param, {})
        v, step = state.get("exp_avg_sq"), state.get("step")
        if v is None or step is None or float(step) < 1:
            return None
        out[key] = (v / (1.0 - beta2 ** float(step))).sqrt_().add_(eps)  # beta2 < 1, step >= 1: no 0
    return out
