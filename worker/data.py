"""Which samples a worker trains on at each step, and how they are loaded.

Every worker draws the same seeded global batch for a step and takes its own slice (disjoint
across ranks, as with `DistributedSampler`), so the union over workers is one large batch and
NetSense training follows single-process training on it. The tensor form indexes the task's
tensors; the `Dataset` form feeds the same indices to a `DataLoader` (or the task's own factory
with its signature) through `StepBatchSampler`, so loader workers, augmentation and data larger
than memory change how samples are fetched, never which.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

LoaderFactory = Callable[..., Iterable[Any]]
"""Called as ``factory(dataset, batch_sampler=..., generator=...)``: `DataLoader` itself, or e.g.
``functools.partial(DataLoader, num_workers=4, pin_memory=True)``; yields (inputs, targets) batches."""


def global_batch(step: int, *, seed: int, n: int, size: int) -> torch.Tensor:
    """Indices of the global batch of `step` (the same on every worker)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    if size <= n:
        return torch.randperm(n, generator=g)[:size]
    return torch.randint(0, n, (size,), generator=g)


def worker_batch(step: int, *, rank: int, world_size: int, batch_size: int, seed: int, n: int) -> torch.Tensor:
    """This worker's slice of the global batch."""
    idx = global_batch(step, seed=seed, n=n, size=batch_size * world_size)
    return idx[rank * batch_size : (rank + 1) * batch_size]


class StepBatchSampler(Sampler[list[int]]):
    """This rank's indices for steps ``start, start + 1, ..., steps - 1``, one list per step.

    A `DataLoader` prefetches ahead, so the sampler is built for a starting step: a worker that
    rejoins, or a PS restored from a checkpoint, restarts the loader at the job's step."""

    def __init__(
        self, n: int, *, rank: int, world_size: int, batch_size: int, seed: int, start: int, steps: int
    ) -> None:
        self.n, self.rank, self.world_size, self.batch_size, self.seed = n, rank, world_size, batch_size, seed
        self.start, self.steps = start, steps

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.start, self.steps):
            idx = worker_batch(
                step, rank=self.rank, world_size=self.world_size, batch_size=self.batch_size, seed=self.seed, n=self.n
            )
            yield idx.tolist()

    def __len__(self) -> int:
        return max(0, self.steps - self.start)


class _Chunks(Sampler[list[int]]):
    """0..n-1 in order, `size` at a time (evaluation: every held-out sample once)."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size

    def __iter__(self) -> Iterator[list[int]]:
        for start in range(0, self.n, self.size):
            yield list(range(start, min(start + self.size, self.n)))

    def __len__(self) -> int:
        return -(-self.n // self.size)


def _pair(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise TypeError(f"a data batch must be (inputs, targets), got {type(batch).__name__}")
    return batch[0], batch[1]


class TrainBatches:
    """A worker's batch per step from a `Dataset`, through the loader factory, restarted on a jump."""

    def __init__(
        self, dataset: Dataset[Any], factory: LoaderFactory | None, *, rank: int, world_size: int, batch_size: int,
        seed: int, steps: int,
    ) -> None:  # fmt: skip
        self.dataset, self.factory = dataset, factory or DataLoader
        self.n = len(dataset)  # type: ignore[arg-type]
        self.rank, self.world_size, self.batch_size, self.seed, self.steps = rank, world_size, batch_size, seed, steps
        self._it: Iterator[Any] | None = None
        self._next = -1

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The (inputs, targets) of `step`; the same samples as the tensor form would take."""
        if self._it is None or step != self._next:
            sampler = StepBatchSampler(
                self.n, rank=self.rank, world_size=self.world_size, batch_size=self.batch_size, seed=self.seed,
                start=step, steps=self.steps,
            )  # fmt: skip
            # Seeds loader workers (augmentation) from the job, the rank and the step it starts at.
            g = torch.Generator().manual_seed((self.seed * 1_000_003 + step) * 65_537 + self.rank)
            self._it = iter(self.factory(self.dataset, batch_sampler=sampler, generator=g))
        self._next = step + 1
        return _pair(next(self._it))


def eval_batches(
    dataset: Dataset[Any], factory: LoaderFactory | None, batch: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Every held-out sample once, in order, `batch` at a time."""
    chunks = _Chunks(len(dataset), batch)  # type: ignore[arg-type]
    loader = (factory or DataLoader)(dataset, batch_sampler=chunks, generator=torch.Generator())
    for b in loader:
        yield _pair(b)
