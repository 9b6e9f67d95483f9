"""A heavier move over a small gap waits for a second decision (`confirm_gap`): one step's
predictions carry that step's noise, and a heavier move is undone only after k steps of headroom,
so a single noisy step used to cost k steps at the heavier level. A rate drop's gap is large and
still moves at once (docs/POLICIES.md, "Hysteresis on the committed level")."""

from __future__ import annotations

import pytest

from netsense.compression.policy.law import LevelHold
from netsense.compression.policy.netsense_settings import NetsensePolicySettings
from netsense.errors import ConfigError
from tests.compression.test_policy import aware, run_aware

Q = [1.0, 0.9, 0.8]
SPECS = ("a", "b", "c")
AT_B = [1.2, 1.0, 1.0]
"""b the cheapest with c tied: b holds."""
B_OVER = [1.2, 1.15, 1.0]
"""b 15 % over c, the best: past eps (10 %), within confirm_gap (20 %)."""
B_FAR_OVER = [1.2, 1.6, 1.0]
"""b 60 % over c: a rate drop's gap."""


def _hold(**settings: float) -> LevelHold:
    hold = LevelHold(NetsensePolicySettings(**settings), SPECS)  # type: ignore[arg-type]
    hold.level = 1
    return hold


def _decide(hold: LevelHold, costs: list[float]) -> str:
    return hold.step([c * qi for c, qi in zip(costs, Q)], Q, bw=1e6)


def test_one_step_over_a_small_gap_holds_and_a_second_in_a_row_moves() -> None:
    hold = _hold()
    assert _decide(hold, B_OVER).startswith("hold:") and hold.level == 1
    assert _decide(hold, B_OVER).startswith("heavier:") and hold.level == 2


def test_a_blip_between_steps_that_hold_never_moves() -> None:
    hold = _hold()
    for _ in range(20):
        _decide(hold, B_OVER)
        assert hold.level == 1
        _decide(hold, AT_B)
        assert hold.level == 1


def test_a_large_gap_moves_at_once() -> None:
    hold = _hold()
    assert _decide(hold, B_FAR_OVER).startswith("heavier:") and hold.level == 2


def test_confirm_gap_zero_moves_at_once_as_before() -> None:
    hold = _hold(confirm_gap=0.0)
    assert _decide(hold, B_OVER).startswith("heavier:") and hold.level == 2


def test_the_wait_stops_the_count_of_headroom() -> None:
    """The step that waits is no headroom toward a lighter level either."""
    hold = _hold()
    hold.headroom, hold.relax_to = 3, 0
    _decide(hold, B_OVER)
    assert hold.headroom == 0


def test_confirm_gap_below_eps_is_refused() -> None:
    with pytest.raises(ConfigError, match="confirm_gap"):
        aware(confirm_gap=0.05)


def test_a_rate_drop_moves_the_policy_heavier_within_one_step() -> None:
    """Through the policy: 400 -> 20 Mbit/s on the progress-aware ladder moves at the drop's first
    decision, as issue #14 asks (after a drop, heavier within one step)."""
    p = aware(probe_interval=0, probe_interval_s=0)
    levels = run_aware(p, [400] * 10 + [20] * 3)
    assert levels[10] is not None and levels[9] is not None and levels[10] > levels[9]
