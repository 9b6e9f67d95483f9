"""`TrainTask`: the contract between a model/data provider and the trainer.

A user's own model plugs in as ``--model package.module:factory`` where ``factory()`` returns a
`TrainTask`. The factory must be deterministic given the torch seed the trainer sets before
calling it, so every worker builds the same initial model (rank 0's parameters win anyway).

Data comes in one of two forms: tensors (small data, indexed in memory) or map-style `Dataset`s
returning ``(input, target)`` (loaded through a `DataLoader`, or the task's own factory with its
signature: loader workers, augmentation, data larger than memory). Both take the same samples per
step and rank (`netsense.worker.data`), so switching form changes nothing in training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Dataset

from .data import LoaderFactory


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
    train_inputs: torch.Tensor | None = None
    """Training inputs, first dimension = samples (tensor form)."""
    train_targets: torch.Tensor | None = None
    """Training targets, first dimension = samples (tensor form)."""
    test_inputs: torch.Tensor | None = None
    """Held-out inputs (fixed split; tensor form)."""
    test_targets: torch.Tensor | None = None
    """Held-out targets (tensor form)."""
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

    train_data: Dataset[Any] | None = None
    """Training samples as a map-style `Dataset` of ``(input, target)`` (instead of the tensors)."""
    test_data: Dataset[Any] | None = None
    """Held-out samples as a map-style `Dataset` (instead of the test tensors)."""
    loader: LoaderFactory | None = None
    """How `train_data` / `test_data` are loaded: called like ``DataLoader(dataset, batch_sampler=...,
    generator=...)``; None is `DataLoader` itself (e.g. ``functools.partial(DataLoader, num_workers=4)``)."""

    def __post_init__(self) -> None:
        for split, x, y, data in (
            ("train", self.train_inputs, self.train_targets, self.train_data),
            ("test", self.test_inputs, self.test_targets, self.test_data),
        ):
            tensors = x is not None or y is not None
            if tensors == (data is not None):
                raise ValueError(
                    f"task {self.name!r}: give the {split} split as {split}_inputs + {split}_targets "
                    f"or as {split}_data, exactly one"
                )
            if tensors and (x is None or y is None or len(x) != len(y)):
                raise ValueError(f"task {self.name!r}: inputs and targets differ in length")
        if self.train_size == 0 or self.test_size == 0:
            raise ValueError(f"task {self.name!r}: empty train or test set")

    @property
    def train_size(self) -> int:
        """Number of training samples, in either form."""
        return len(self.train_inputs) if self.train_inputs is not None else len(self.train_data)  # type: ignore[arg-type]

    @property
    def test_size(self) -> int:
        """Number of held-out samples, in either form."""
        return len(self.test_inputs) if self.test_inputs is not None else len(self.test_data)  # type: ignore[arg-type]
