"""The shipped example configs load, and the own-model example is a valid task."""

from __future__ import annotations

from pathlib import Path

import pytest

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
