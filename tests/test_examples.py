"""The shipped example configs load, and the own-model example is a valid task."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from netsense.config import load_config
from netsense.models import load_task

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.name)
def test_example_configs_load(path: Path) -> None:
    load_config(path)


def test_own_model_example_is_a_task(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES.parent))
    task = load_task("examples.own_model:task")
    model = task.build_model()
    assert model(task.train_inputs[:3]).shape == (3, 4)


def test_own_dataset_example_trains(monkeypatch) -> None:
    """The Dataset + DataLoader example is a valid task and learns in a few local steps."""
    from netsense.worker.data import TrainBatches

    monkeypatch.syspath_prepend(str(EXAMPLES.parent))
    task = load_task("examples.own_dataset:task")
    assert task.train_size == 1600 and task.test_size == 400
    torch.manual_seed(0)
    model = task.build_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    batches = TrainBatches(task.train_data, task.loader, rank=0, world_size=1, batch_size=32, seed=0, steps=60)
    first = last = 0.0
    for step in range(60):
        x, y = batches.batch(step)
        loss = task.loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first, last = (loss.item() if step == 0 else first), loss.item()
    assert last < first
