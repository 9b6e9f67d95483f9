"""`probe_unseen_s`: a probe looks for a rise that makes a lighter level pay; where none pays at twice
the estimate nor at the highest rate the path has shown, the probe waits `probe_unseen_s` since the
last one (docs/POLICIES.md, "Probes").

On the probe ladder (4.5 MB payload, 50 ms compute, 20 ms RTT) the step-time law holds topk at
20 Mbit/s, and qsgd:4, the next lighter level, wins only from ~130 Mbit/s (6.5x)."""

from __future__ import annotations

import pytest

from probe_ladder import MBIT, RTT, S, TC, cadence_policy
from netsense.compression.policy import ChooseRequest, Decision, NetsensePolicy
from netsense.compression.policy.link import LinkState
from netsense.errors import ConfigError

TOPK = 4


def policy(**settings: object) -> NetsensePolicy:
    """The cadence alone would probe every 2 steps (no share, no back-off)."""
    return cadence_policy(**{"probe_share": 0, **settings})


def choose(p: NetsensePolicy, step: int, mbit: float, *, app_limited: bool = True) -> Decision:
    """One decision `step` seconds into the run, the link at `mbit` (a trusted sample unless app-limited)."""
    link = LinkState(time_s=float(step), bandwidth_Bps=mbit * MBIT, min_rtt_s=RTT, srtt_s=RTT, app_limited=app_limited)
    return p.choose(ChooseRequest(link=link, payload_bytes=S, compute_s=TC, step=step))


def probe_steps(p: NetsensePolicy, start: int, steps: int, mbit: float = 20) -> list[int]:
    """The steps among `steps` app-limited ones of 1 s at `mbit` whose decision was a probe."""
    found = []
    for step in range(start, start + steps):
        d = choose(p, step, mbit)
        if d.reason.startswith("probe"):
            found.append(step)
        else:
            assert d.level == TOPK, d.reason
    return found


def test_no_probe_for_a_rise_never_seen_until_probe_unseen_s() -> None:
    """At 20 Mbit/s from the start, qsgd:4 pays only at 6.5x: no probe in the first 30 s, then one
    every 30 s. With the wait off (0), the cadence probes every 2 steps as before."""
    p = policy()
    assert choose(p, 0, 20, app_limited=False).level == TOPK
    assert probe_steps(p, 1, 95) == [30, 60, 90]
    off = policy(probe_unseen_s=0)
    assert choose(off, 0, 20, app_limited=False).level == TOPK
    assert probe_steps(off, 1, 20) == list(range(2, 21, 2))


def test_a_rate_the_path_has_shown_keeps_the_cadence() -> None:
    """The run started at 200 Mbit/s, then dropped to 20: qsgd:4 pays at a rate this path carried,
    so the probes keep the cadence, to see the rate come back."""
    p = policy()
    high = choose(p, 0, 200, app_limited=False)
    assert high.level is not None and high.level < TOPK
    assert choose(p, 1, 20, app_limited=False).level == TOPK  # the drop: heavier at once
    assert p.probes.peak_Bps == pytest.approx(200 * MBIT)
    assert probe_steps(p, 2, 20) == list(range(3, 22, 2))


def test_a_rise_to_twice_the_estimate_is_within_reach() -> None:
    """At 70 Mbit/s qsgd:4 pays at 2x (140 Mbit/s): probes keep the cadence from the start."""
    p = policy()
    assert choose(p, 0, 70, app_limited=False).level == TOPK
    assert len(probe_steps(p, 1, 20, mbit=70)) == 10


@pytest.mark.parametrize("wait", [-1.0, float("nan")])
def test_probe_unseen_s_out_of_range_is_a_config_error(wait: float) -> None:
    with pytest.raises(ConfigError, match="probe_unseen_s"):
        policy(probe_unseen_s=wait)
