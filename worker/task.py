"""`TrainTask`: the contract between a model/data provider and the trainer.

A user's own model plugs in as ``--model package.module:factory`` where ``factory()`` returns a
`TrainTask`. The factory must be deterministic given the torch seed the trainer sets before
calling it, so every worker builds the same initial model (rank 0's parameters win anyway).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


def argmax_accuracy(output: torch.Tensor, target: torch.Tensor) -> float:
    """Fraction of rows whose arg-max equals the target class."""
    return (output.argmax(dim=-1) == target).float().mean().item()


@dataclass(frozen=True)
class TrainTask:
    """A model, its data, its loss and its metric."""

    name: str
    """Name for logs and results."""
    build_model: Callable[[], torch.nn.Module]
    """Builds a fresh model (called after the trainer seeds torch)."""
    train_inputs: torch.Tensor
    """Training inputs, first dimension = samples."""
    train_targets: torch.Tensor
    """Training targets, first dimension = samples."""
    test_inputs: torch.Tensor
    """Held-out inputs (fixed split)."""
    test_targets: torch.Tensor
    """Held-out targets."""
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = torch.nn.functional.cross_entropy
    """Mean loss over a batch."""
    accuracy: Callable[[torch.Tensor, torch.Tensor], float] = argmax_accuracy
    """Metric reported as test accuracy, in [0, 1]."""
    batch_size: int = 32
    """Default per-worker batch size."""
    optimizer: dict[str, Any] = field(default_factory=lambda: {"name": "sgd", "lr": 0.05, "momentum": 0.9})
    """Default PS optimizer settings (see `netsense.ps.optim.OptimizerSettings`)."""
    steps: int = 300
    """Default number of synchronous steps."""

    def __post_init__(self) -> None:
        if len(self.train_inputs) != len(self.train_targets) or len(self.test_inputs) != len(self.test_targets):
            raise ValueError(f"task {self.name!r}: inputs and targets differ in length")
        if len(self.train_inputs) == 0 or len(self.test_inputs) == 0:
            raise ValueError(f"task {self.name!r}: empty train or test set")
