"""The training loop's events after the PS goes back (worker/trainer.py): `step` numbers never
go back, the resync is one `resync` event, and the redone steps are `redo` events."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from netsense.worker.optimizer import StepStats
from netsense.worker.task import TrainTask
from netsense.worker.trainer import TrainSettings, train


@dataclass
class _Uplink:
    levels: dict[str, int] = field(default_factory=dict)


class RollbackOptimizer:
    """Stands in for `NetSenseOptimizer`: each step moves the version by one, except that the
    step from `at` lands on `to` (a PS restored from an older checkpoint)."""

    def __init__(self, at: int, to: int) -> None:
        self.version, self.at, self.to = 0, at, to
        self.bytes_up = self.bytes_down = 0
        self.uplink = _Uplink()
        self.rolled_back = False

    def zero_grad(self, set_to_none: bool = True, *, samples: int | None = None) -> None:
        pass

    def step(self, samples: int = 1, codec: str | None = None) -> StepStats:
        if self.version == self.at and not self.rolled_back:
            self.version, self.rolled_back = self.to, True
        else:
            self.version += 1
        return StepStats(version=self.version, codec="fp32")


def _task() -> TrainTask:
    x = torch.randn(64, 4)
    y = torch.randint(0, 2, (64,))
    return TrainTask("tiny", lambda: torch.nn.Linear(4, 2), x, y, x[:8], y[:8], batch_size=4, steps=10)


def test_step_events_never_go_back_after_the_ps_restores_an_older_checkpoint() -> None:
    events: list[dict[str, Any]] = []
    task = _task()
    opt = RollbackOptimizer(at=6, to=3)  # the 7th step finds the PS back at version 3
    train(task, task.build_model(), opt, rank=1, world_size=2, settings=TrainSettings(steps=10), emit=events.append)  # type: ignore[arg-type]
    steps = [e["step"] for e in events if e["event"] == "step"]
    assert steps == list(range(1, 11))  # each job step reported once, in order
    assert all(b > a for a, b in zip(steps, steps[1:]))  # before the fix: ..., 6, 7, 4, 5, ...
    [resync] = [e for e in events if e["event"] == "resync"]
    assert (resync["from_version"], resync["to_version"], resync["step"]) == (6, 3, 6)
    assert [e["step"] for e in events if e["event"] == "redo"] == [4, 5, 6]  # redone after the resync
    assert [e["event"] for e in events].index("resync") == 7  # right after step 6 (and `start`)
    assert events[0] == {"event": "start", "step": 0, "steps": 10}  # before the first step
