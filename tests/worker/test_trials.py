"""Level trials (`netsense.worker.trials`): the step-equivalence arithmetic on curves whose answer is
known, and whole trials on a least-squares problem where each level's cost is known."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from torch import nn

from netsense.worker.task import TrainTask
from netsense.worker.trials import TaskSampler, TrialRun, run_trials, steps_equivalent, trial_progress


def test_steps_equivalent_interpolates_on_the_running_minimum() -> None:
    ref = [10.0, 8.0, 9.0, 6.0, 4.0]
    assert steps_equivalent(ref, 7.0, near=0) == pytest.approx(2.5)  # 8 -> 8 (the uptick ignored) -> 6
    assert steps_equivalent(ref, 11.0, near=3) == 0.0
    assert steps_equivalent(ref, 1.0, near=3) == 4.0  # never reached: the horizon
    assert steps_equivalent(ref, 8.0, near=2) == 2.0  # the stretch at 8 is steps 1-2: nearest to 2
    assert steps_equivalent(ref, 8.0, near=0) == 1.0


def test_half_speed_reads_one_half_and_an_identical_curve_one() -> None:
    ref = [math.exp(-t / 10) for t in range(41)]
    half = [math.exp(-t / 20) for t in range(41)]
    assert trial_progress(ref, half) == pytest.approx(0.5, abs=0.01)
    assert trial_progress(ref, ref) == 1.0
    noisy = [x * (1.2 if t % 3 == 0 else 1.0) for t, x in enumerate(ref)]
    assert trial_progress(noisy, noisy) == 1.0  # upticks neither cost nor credit the level
    with pytest.raises(ValueError, match="same length"):
        trial_progress(ref, ref[:10])


def _least_squares(seed: int = 0) -> tuple[nn.Module, list[list[tuple[torch.Tensor, torch.Tensor]]], tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    w_true = torch.randn(64, 1, generator=gen)

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, 64, generator=gen)
        return x, x @ w_true

    torch.manual_seed(seed)
    model = nn.Linear(64, 1, bias=False)
    steps = [[batch(32), batch(32)] for _ in range(40)]
    return model, steps, batch(256)


def _sgd(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05)


def test_trials_price_levels_by_what_they_cost_in_steps() -> None:
    """A (1, 64) gradient is rank 1, so powersgd:1 loses nothing; fp16 loses ~nothing; top-k of 1 in
    64 coordinates delays most of every step. The model itself is left untouched."""
    model, steps, held = _least_squares()
    before = model.weight.detach().clone()
    result = run_trials(model, nn.functional.mse_loss, _sgd, steps, held, ["fp16", "powersgd:1", "topk:0.015625"])
    assert torch.equal(model.weight, before)
    assert result.progress["fp16"] > 0.97
    assert result.progress["powersgd:1"] > 0.97
    assert result.progress["topk:0.015625"] < 0.5
    assert len(result.reference) == len(result.losses["fp16"]) == 41
    assert result.reference[-1] < 0.1 * result.reference[0]  # the problem trains in the horizon


def test_downlink_trials_compress_the_update() -> None:
    model, steps, held = _least_squares(1)
    result = run_trials(model, nn.functional.mse_loss, _sgd, steps, held, ["fp16", "powersgd:1", "topk:0.015625"], direction="down")
    assert result.progress["fp16"] > 0.97 and result.progress["powersgd:1"] > 0.97  # a rank-1 update
    assert result.progress["topk:0.015625"] < 0.5


def test_a_level_whose_codec_fails_is_left_out(caplog: pytest.LogCaptureFixture) -> None:
    model, steps, held = _least_squares()
    with caplog.at_level(logging.WARNING, logger="netsense.worker.trials"):
        result = run_trials(model, nn.functional.mse_loss, _sgd, steps[:5], held, ["nosuchcodec:1", "fp16"])
    assert set(result.progress) == {"fp16"}
    assert "nosuchcodec" in caplog.text


def test_a_trial_run_refuses_an_unknown_direction() -> None:
    with pytest.raises(ValueError, match="direction"):
        TrialRun(nn.Linear(2, 1), nn.functional.mse_loss, _sgd, "fp16", direction="sideways")


class _Squares(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 50

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full((3,), float(i)), torch.tensor(i % 2)


def test_task_sampler_draws_the_same_batches_from_tensors_or_a_dataset() -> None:
    """Every level of a trial sees the same batches: one seeded stream per worker, whichever form
    the task's training data takes (a `Dataset`'s samples collated as a DataLoader would)."""
    x = torch.arange(50, dtype=torch.float32).unsqueeze(1).repeat(1, 3)
    test = {"test_inputs": x, "test_targets": torch.zeros(50)}
    tensors = TrainTask("t", nn.Identity, train_inputs=x, train_targets=torch.arange(50) % 2, batch_size=4, **test)
    dataset = TrainTask("d", nn.Identity, train_data=_Squares(), batch_size=4, **test)
    a, b = TaskSampler(tensors, 0, 2).step(), TaskSampler(dataset, 0, 2).step()
    assert len(a) == len(b) == 2
    for (xa, ya), (xb, yb) in zip(a, b):
        assert xa.shape == xb.shape == (4, 3) and torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(a[0][0], a[1][0])  # the workers' streams differ
    assert TaskSampler(tensors, 0, 1, batch_size=7).step()[0][0].shape == (7, 3)
