"""The task's data forms: tensors, or a `Dataset` through a `DataLoader` (factory), sharded per rank
and seeded, so the form changes how samples are fetched and never which."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from netsense.worker.data import StepBatchSampler, TrainBatches, global_batch
from netsense.worker.task import TrainTask
from netsense.worker.trainer import BREAKDOWN, TrainSettings, evaluate, train


def _tensors(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, 5, generator=g)
    return x, (x.sum(dim=1) > 0).long()


def _model() -> torch.nn.Module:
    return torch.nn.Linear(5, 2)


def _tensor_task(**kw: Any) -> TrainTask:
    x, y = _tensors()
    return TrainTask("t", _model, x[:48], y[:48], x[48:], y[48:], batch_size=4, steps=6, **kw)


def _dataset_task(**kw: Any) -> TrainTask:
    x, y = _tensors()
    return TrainTask(
        "d", _model, train_data=TensorDataset(x[:48], y[:48]), test_data=TensorDataset(x[48:], y[48:]),
        batch_size=4, steps=6, **kw,
    )  # fmt: skip


@dataclass
class _Stats:
    version: int = 0
    codec: str = "fp32"

    def __getattr__(self, name: str) -> float:
        if name in BREAKDOWN:
            return 0.0
        raise AttributeError(name)


@dataclass
class _LocalOpt:
    """A stand-in for `NetSenseOptimizer`: one process, plain SGD, the same version counting."""

    model: torch.nn.Module
    version: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    seen: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sgd = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.uplink = type("U", (), {"levels": {}})()

    def zero_grad(self, samples: int | None = None) -> None:
        self.sgd.zero_grad()

    def step(self, samples: int) -> _Stats:
        self.seen.append(samples)
        self.sgd.step()
        self.version += 1
        return _Stats(version=self.version)


def _train(task: TrainTask, *, rank: int = 0, world_size: int = 1) -> tuple[dict[str, Any], torch.nn.Module]:
    torch.manual_seed(0)
    model = task.build_model()
    opt = _LocalOpt(model)
    summary = train(task, model, opt, rank=rank, world_size=world_size, settings=TrainSettings(seed=7))  # type: ignore[arg-type]
    return summary, model


def test_a_dataset_trains_exactly_like_the_same_tensors() -> None:
    s_t, m_t = _train(_tensor_task())
    s_d, m_d = _train(_dataset_task())
    for a, b in zip(m_t.parameters(), m_d.parameters()):
        assert torch.equal(a, b)
    assert s_t["final_loss"] == s_d["final_loss"] and s_t["test_accuracy"] == s_d["test_accuracy"]


def test_a_loader_factory_with_worker_processes_takes_the_same_batches() -> None:
    two = functools.partial(DataLoader, num_workers=2)
    s_d, m_d = _train(_dataset_task())
    s_w, m_w = _train(_dataset_task(loader=two))
    for a, b in zip(m_d.parameters(), m_w.parameters()):
        assert torch.equal(a, b)


def test_ranks_take_disjoint_slices_whose_union_is_the_global_batch() -> None:
    n, world, b = 48, 3, 4
    per_rank = [
        list(StepBatchSampler(n, rank=r, world_size=world, batch_size=b, seed=7, start=0, steps=5)) for r in range(world)
    ]
    for step in range(5):
        slices = [per_rank[r][step] for r in range(world)]
        union = [i for s in slices for i in s]
        assert len(set(union)) == world * b  # disjoint across ranks, like DistributedSampler
        assert union == global_batch(step, seed=7, n=n, size=world * b).tolist()


def test_a_jump_in_the_step_restarts_the_loader_at_that_step() -> None:
    """A rejoining worker or a PS resumed from a checkpoint moves the version: the batch must be the
    job step's, not the loader's next one."""
    x, y = _tensors()
    data = TensorDataset(x, y)
    batches = TrainBatches(data, None, rank=1, world_size=2, batch_size=4, seed=7, steps=20)
    batches.batch(0)
    batches.batch(1)
    jumped = batches.batch(9)
    fresh = TrainBatches(data, None, rank=1, world_size=2, batch_size=4, seed=7, steps=20)
    assert torch.equal(jumped[0], fresh.batch(9)[0])


class _Augmented(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random noise per fetch: augmentation that the loader's seed must make repeatable."""

    def __init__(self) -> None:
        self.x, self.y = _tensors()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i] + 0.1 * torch.randn(5), self.y[i]


def test_augmentation_in_loader_workers_is_seeded() -> None:
    def first_batches() -> list[torch.Tensor]:
        tb = TrainBatches(_Augmented(), functools.partial(DataLoader, num_workers=2), rank=0, world_size=2,
                          batch_size=4, seed=7, steps=4)  # fmt: skip
        return [tb.batch(s)[0] for s in range(4)]

    a, b = first_batches(), first_batches()
    assert all(torch.equal(p, q) for p, q in zip(a, b))


class _Huge(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Ten million samples that exist only when fetched (larger than memory as tensors would be)."""

    def __init__(self) -> None:
        self.fetched: set[int] = set()

    def __len__(self) -> int:
        return 10_000_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.fetched.add(i)
        g = torch.Generator().manual_seed(i)
        return torch.randn(5, generator=g), torch.tensor(i % 2)


def test_a_dataset_larger_than_memory_is_fetched_per_batch() -> None:
    data = _Huge()
    tb = TrainBatches(data, None, rank=0, world_size=2, batch_size=4, seed=7, steps=3)
    for s in range(3):
        assert tb.batch(s)[0].shape == (4, 5)
    assert len(data.fetched) <= 3 * 4 + 4  # this rank's samples (and at most one prefetched batch)


def test_evaluation_reads_a_test_dataset_like_the_tensors() -> None:
    torch.manual_seed(0)
    model = _model()
    assert evaluate(_tensor_task(), model, batch=5) == evaluate(_dataset_task(), model, batch=5)


def test_each_split_takes_exactly_one_form() -> None:
    x, y = _tensors()
    with pytest.raises(ValueError, match="exactly one"):
        TrainTask("both", _model, x, y, x, y, train_data=TensorDataset(x, y))
    with pytest.raises(ValueError, match="exactly one"):
        TrainTask("none", _model, test_data=TensorDataset(x, y))
    with pytest.raises(ValueError, match="differ in length"):
        TrainTask("short", _model, x, y[:3], x, y)
    with pytest.raises(ValueError, match="empty"):
        TrainTask("empty", _model, train_data=TensorDataset(x[:0], y[:0]), test_data=TensorDataset(x, y))
