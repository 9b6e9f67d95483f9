"""A user's own model for `netsense launch --model examples.own_model:task` (run from the repo root).

The factory returns a `TrainTask`: how to build the model, train/test tensors, loss and metric.
"""

from __future__ import annotations

import torch

from netsense.worker import TrainTask


def task() -> TrainTask:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 20, generator=g)
    teacher = torch.randn(20, 4, generator=g)
    y = (x @ teacher).argmax(dim=1)
    return TrainTask(
        name="own-linear",
        build_model=lambda: torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)),
        train_inputs=x[:1600],
        train_targets=y[:1600],
        test_inputs=x[1600:],
        test_targets=y[1600:],
        batch_size=32,
        optimizer={"name": "adam", "lr": 0.01},
        steps=150,
    )
