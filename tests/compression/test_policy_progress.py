"""The policy's side of progress efficiency q: the per-level EWMA, and one candidate measurement
handed to the policy (costs and q)."""

from __future__ import annotations

import pytest
import torch

from netsense.compression import Ladder, make_codec
from netsense.compression.policy.progress import ProgressEstimate, measure_into


def test_progress_estimate_first_measurement_replaces_the_prior() -> None:
    est = ProgressEstimate(Ladder.parse("fp32,topk:0.01+fp16"), alpha=0.5, floor=0.02)
    assert est.values == [1.0, 0.02] and est.measured == [True, False]  # prior 0.01 raised to the floor
    est.update(1, 0.4)
    assert est[1] == 0.4 and est.measured[1]
    est.update(1, 0.2)
    assert est[1] == pytest.approx(0.3)
    est.update(1, 5.0)
    assert est[1] == pytest.approx(0.65)  # clamped to 1 before averaging


def test_measure_into_reports_costs_and_progress_to_the_policy() -> None:
    """One candidate measurement tells the policy the level's sender cost and its q."""
    class Recorder:
        def __init__(self) -> None:
            self.costs: list[dict[str, float]] = []
            self.progress: list[tuple[int, float]] = []

        def observe_costs(self, *, level: int, dense_bytes: int, encode_s: float | None = None, decode_s: float | None = None) -> None:
            self.costs.append({"level": level, "dense_bytes": dense_bytes, "encode_s": encode_s, "decode_s": decode_s})

        def observe_progress(self, *, level: int, progress: float) -> None:
            self.progress.append((level, progress))

    rec = Recorder()
    q = measure_into(rec, 3, make_codec("qsgd:4"), [torch.randn(64, 32), torch.randn(100)])
    assert q is not None and 0 < q < 1
    assert rec.progress == [(3, q)]
    (cost,) = rec.costs
    assert cost["level"] == 3 and cost["dense_bytes"] == 4 * (64 * 32 + 100)
    assert cost["encode_s"] >= cost["decode_s"] > 0  # lossy: the sender pays encode + decode
    assert measure_into(rec, 3, make_codec("qsgd:4"), [torch.zeros(0)]) is None and len(rec.costs) == 1


def test_drift_is_the_move_of_one_step_error_odds_since_the_last_window() -> None:
    ladder = Ladder.parse("fp32,qsgd:8,powersgd:2")
    est = ProgressEstimate(ladder, alpha=1.0)  # the newest figure alone: the odds are exact
    assert est.drift(2) == 1.0  # no window yet
    est.update(2, 0.8)  # odds 0.25
    assert est.drift(2) == 1.0
    est.update_window(2, 0.99, interim=True)
    assert est.drift(2) == 1.0  # an interim window sets no reference
    est.update_window(2, 0.99)
    est.update(2, 0.8)
    assert est[2] == 0.99 and est.drift(2) == 1.0  # the windowed q stands; the stream as it was
    est.update(2, 0.5)  # odds 1.0: four times the window's
    assert abs(est.drift(2) - 4.0) < 1e-9 and est[2] == 0.99
    est.update(2, 0.95)  # odds 1/19: either way
    assert abs(est.drift(2) - 4.75) < 1e-9
    est.update_window(2, 0.9)
    assert est.drift(2) == 1.0  # a new window, a new reference
    est.update(1, 1.0)
    est.update_window(1, 1.0)
    est.update(1, 0.996)  # 8 bits wander at 0.995-1.0: odds under 0.01 count as 0.01
    assert est.drift(1) == 1.0
    est.update(1, 0.98)  # odds 0.0204 against the floor's 0.01
    assert abs(est.drift(1) - 0.02 / 0.98 / 0.01) < 1e-9


def test_an_interim_figure_stands_in_for_the_prior_until_the_first_measurement() -> None:
    """An interim q replaces the prior but leaves the level unmeasured: the next figure replaces
    it outright (no EWMA with it), and an interim figure after a measurement changes nothing."""
    est = ProgressEstimate(Ladder.parse("fp32,powersgd:2"), alpha=0.3)
    est.update(1, 0.9, interim=True)
    assert est[1] == 0.9 and not est.measured[1] and est.one_step[1] is None
    est.update(1, 0.4)
    assert est[1] == 0.4 and est.measured[1]
    est.update(1, 0.95, interim=True)
    assert est[1] == 0.4
