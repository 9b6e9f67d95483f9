"""A user's own data as a `Dataset` with augmentation, loaded by worker processes:
`netsense launch --model examples.own_dataset:task` (run from the repo root).

The samples are made on demand in `__getitem__` (nothing is held in memory, as with files on disk),
and the `loader` factory is `DataLoader` with two loader processes. Every worker still trains on its
own seeded slice of each step's global batch, exactly the samples the tensor form would take.
"""

from __future__ import annotations

import functools

import torch
from torch.utils.data import DataLoader, Dataset

from netsense.worker import TrainTask

FEATURES, CLASSES = 20, 4


class TeacherData(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample i: Gaussian features from seed i, labelled by a fixed linear teacher."""

    def __init__(self, first: int, count: int, augment: bool) -> None:
        self.first, self.count, self.augment = first, count, augment
        self.teacher = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(FEATURES, generator=torch.Generator().manual_seed(self.first + i))
        y = (x @ self.teacher).argmax()
        if self.augment:  # a small random jitter; the loader's seed makes it repeatable
            x = x + 0.05 * torch.randn(FEATURES)
        return x, y


def task() -> TrainTask:
    return TrainTask(
        name="own-dataset",
        build_model=lambda: torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES)
        ),
        train_data=TeacherData(0, 1600, augment=True),
        test_data=TeacherData(1600, 400, augment=False),
        loader=functools.partial(DataLoader, num_workers=2),
        batch_size=32,
        optimizer={"name": "adam", "lr": 0.01},
        steps=150,
    )
