"""The model registry: named tasks, plus ``package.module:factory`` for a user's own.

`digits-cnn` trains on scikit-learn's bundled 8x8 digits (1797 images inside the installed
package: no download) with a fixed, stratified held-out split.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from torch import nn

from netsense.errors import ConfigError
from netsense.worker.task import TrainTask

_REGISTRY: dict[str, Callable[[], TrainTask]] = {}


def register_model(name: str, factory: Callable[[], TrainTask]) -> None:
    """Make `factory` available as ``--model name``."""
    _REGISTRY[name] = factory


def model_names() -> list[str]:
    return sorted(_REGISTRY)


def load_task(spec: str) -> TrainTask:
    """A registered name, or ``package.module:factory`` returning a `TrainTask`."""
    if spec in _REGISTRY:
        return _REGISTRY[spec]()
    if ":" not in spec:
        raise ConfigError(f"unknown model {spec!r}; registered: {', '.join(model_names())}; or use package.module:factory")
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load model factory {spec!r}: {exc}") from None
    task = factory()
    if not isinstance(task, TrainTask):
        raise ConfigError(f"model factory {spec!r} returned {type(task).__name__}, expected netsense.worker.TrainTask")
    return task


class DigitsCNN(nn.Module):
    """A small CNN for 8x8 digits (~12k parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def digits_cnn() -> TrainTask:
    """scikit-learn's digits, 80/20 stratified split with a fixed seed."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    idx_train, idx_test = train_test_split(range(len(y)), test_size=0.2, random_state=0, stratify=digits.target)
    return TrainTask(
        name="digits-cnn",
        build_model=DigitsCNN,
        train_inputs=x[idx_train],
        train_targets=y[idx_train],
        test_inputs=x[idx_test],
        test_targets=y[idx_test],
        batch_size=32,
        optimizer={"name": "sgd", "lr": 0.05, "momentum": 0.9},
        steps=300,
    )


register_model("digits-cnn", digits_cnn)
