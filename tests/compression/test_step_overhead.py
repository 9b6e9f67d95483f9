"""The step's unmodelled time (`StepOverhead`): measured between decisions as the step's length
beyond the law's prediction for the level sent, and added to every level's predicted step, where
it weighs progress against bytes (docs/POLICIES.md, "The step's unmodelled time")."""

from __future__ import annotations

import pytest

from netsense.compression.policy import ChooseRequest, make_policy
from netsense.compression.policy.overhead import SKIP_DECISIONS, StepOverhead
from netsense.errors import ConfigError
from tests.compression.test_policy import LADDER_Q, S, TC, aware, link
from tests.compression.test_policy_join import _hold


def _feed(overhead: StepOverhead, lengths: list[float], predicted: float = 0.010) -> None:
    t = 100.0
    for length in lengths:
        overhead.decided(t, predicted)
        t += length


def test_the_median_excess_over_the_prediction_after_start_up() -> None:
    o = StepOverhead(16)
    _feed(o, [1.0] * SKIP_DECISIONS + [0.015] * 3)  # start-up steps are no samples
    assert o.value == 0.0  # two samples in (the third step's end is not yet seen): too few
    _feed(o, [0.015] * 6)
    assert o.value == pytest.approx(0.005)


def test_a_step_that_held_an_evaluation_does_not_move_it() -> None:
    """One step in five holds an evaluation 10x the step: the median stays the steps' own excess."""
    o = StepOverhead(16)
    _feed(o, [0.0] * SKIP_DECISIONS + [0.150 if i % 5 == 4 else 0.014 for i in range(40)])
    assert o.value == pytest.approx(0.004)


def test_never_below_zero_and_off_at_window_zero() -> None:
    fast = StepOverhead(16)
    _feed(fast, [0.0] * SKIP_DECISIONS + [0.006] * 20)  # overlapped steps, shorter than predicted
    assert fast.value == 0.0
    off = StepOverhead(0)
    _feed(off, [0.0] * SKIP_DECISIONS + [0.050] * 20)
    assert off.value == 0.0


def test_a_step_without_a_prediction_or_dropped_is_no_sample() -> None:
    o = StepOverhead(4)
    t = 0.0
    for _ in range(SKIP_DECISIONS):
        o.decided(t, 0.01)
        t += 1.0
    for _ in range(8):
        o.decided(t, None)  # unknown bandwidth: nothing predicted
        t += 1.0
    assert o.value == 0.0
    for _ in range(8):
        o.decided(t, 0.01)
        o.drop()  # every push redecided
        t += 1.0
    assert o.value == 0.0


def test_the_policy_adds_it_to_every_level() -> None:
    """Steps 30 ms longer than predicted: every level's predicted step grows by those 30 ms (the
    same run with the window off as the reference), and the decision says what it used."""
    runs = {}
    for window in (16, 0):
        p = aware(overhead_window=window)
        t, decisions = 0.0, []
        for step in range(40):
            d = p.choose(ChooseRequest(link=link(100, t=t), payload_bytes=S, compute_s=TC, step=step))
            decisions.append(d)
            t += (d.predicted_step_s or 0.0) - d.overhead_s + 0.030
        runs[window] = decisions
    on, off = runs[16][-1], runs[0][-1]
    assert on.overhead_s == pytest.approx(0.030) and off.overhead_s == 0.0
    assert on.predicted_levels is not None and off.predicted_levels is not None
    assert [a - b for a, b in zip(on.predicted_levels, off.predicted_levels)] == pytest.approx([0.030] * len(LADDER_Q))


def test_time_left_out_priced_a_lossier_level_too_low() -> None:
    """Two sites, digits-cnn, one decision (rounded): rank 2 predicted 13.0 ms at q 0.929, rank 1
    10.7 ms at q 0.793, so rank 1 cost 4 % less per unit of progress; the steps were 5.4 ms longer
    than predicted at every level, and with that time rank 2 costs 2.5 % less."""
    hold = _hold()
    q = [1.0, 0.929, 0.793]
    preds = [0.030, 0.0130, 0.0107]
    assert hold.law(preds, q, 0.0, 0.0)[0] == 2
    assert hold.law([p + 0.0054 for p in preds], q, 0.0, 0.0)[0] == 1


@pytest.mark.parametrize("window", [-1, -16])
def test_overhead_window_out_of_range_is_a_config_error(window: int) -> None:
    with pytest.raises(ConfigError, match="overhead_window"):
        make_policy("netsense", LADDER_Q, overhead_window=window)
