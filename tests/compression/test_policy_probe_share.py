"""`probe_share`: an upward probe waits until a share of the time since the last probe covers its
predicted extra time over a step at the committed level, or the back-off's longest wait passed
(docs/POLICIES.md, "Probes")."""

from __future__ import annotations

import pytest

from probe_ladder import LADDER
from netsense.compression.policy import ChooseRequest, Decision, NetsensePolicy, make_policy
from netsense.compression.policy.link import LinkState
from netsense.errors import ConfigError

MBIT = 1e6 / 8
S = 4_500_000  # dense fp32 payload, bytes
TC = 0.05
RTT = 0.02


def policy(**settings: object) -> NetsensePolicy:
    settings = {"progress_aware": False, "probe_interval": 2, "probe_interval_s": 0, "probe_backoff_max": 1, **settings}
    p = make_policy("netsense", LADDER, **settings)
    assert isinstance(p, NetsensePolicy)
    return p


def run(p: NetsensePolicy, steps: int, *, dt: float = 1.0) -> tuple[Decision, list[Decision]]:
    """The first decision (a saturated sample sets the estimate) and the probes of `steps` app-limited
    steps of `dt` seconds each at 20 Mbit/s."""

    def request(step: int, app_limited: bool = True) -> ChooseRequest:
        link = LinkState(time_s=step * dt, bandwidth_Bps=20 * MBIT, min_rtt_s=RTT, srtt_s=RTT, app_limited=app_limited)
        return ChooseRequest(link=link, payload_bytes=S, compute_s=TC, step=step)

    first = p.choose(request(0, app_limited=False))
    decisions = [p.choose(request(step)) for step in range(1, steps + 1)]
    assert all(d.level == first.level for d in decisions if not d.reason.startswith("probe"))
    return first, [d for d in decisions if d.reason.startswith("probe")]


def extra_s(probe: Decision, held: int) -> float:
    """The probe's predicted extra time over a step at the committed level, from its own record."""
    assert probe.predicted_levels is not None and probe.level is not None
    return probe.predicted_levels[probe.level] - probe.predicted_levels[held]


def gaps(first: Decision, probes: list[Decision]) -> list[int]:
    steps = [first.step, *(d.step for d in probes)]
    return [b - a for a, b in zip(steps, steps[1:])]


def test_a_dear_probe_waits_until_its_share_of_the_time_covers_it() -> None:
    """Without a share the cadence probes every 2 steps (1 s each); with 3 % a 0.23 s probe comes
    at the first step whose time since the last probe pays for it, and never sooner."""
    first, free = run(policy(probe_share=0), 60)
    assert gaps(first, free) == [2] * 30
    first, probes = run(policy(probe_share=0.03), 60)
    assert first.level is not None and probes and {d.level for d in probes} == {first.level - 1}
    extras = [extra_s(d, first.level) for d in probes]
    assert all(0.15 < e < 0.35 for e in extras), extras
    for gap, extra in zip(gaps(first, probes), extras):
        assert gap * 0.03 >= extra and (gap - 1) * 0.03 < extra
    assert sum(extras) <= 0.03 * 60


def test_cheap_probes_keep_the_cadence() -> None:
    """A share whose time pays for the probe within the cadence changes nothing."""
    first, probes = run(policy(probe_share=0.5), 40)
    assert gaps(first, probes) == [2] * 20


def test_the_back_off_s_longest_wait_bounds_a_dear_probe() -> None:
    """However dear the probe, it comes `probe_interval_s` x `probe_backoff_max` (8 s) after the last
    one, as the back-off's cadence alone would bring it at the latest: a rise is not seen later."""
    settings = {"probe_interval_s": 2.0, "probe_backoff_max": 4}
    first, backed_off = run(policy(probe_share=0, **settings), 80, dt=0.5)
    assert gaps(first, backed_off)[:4] == [2, 4, 8, 8]  # steps of 0.5 s: the step cadence backs off to 4 s
    first, probes = run(policy(probe_share=0.001, **settings), 80, dt=0.5)
    assert gaps(first, probes) == [16] * 5  # 8 s: 0.001 of it is far below the probe's 0.23 s


@pytest.mark.parametrize("share", [-0.1, 1.0, 2.0])
def test_probe_share_out_of_range_is_a_config_error(share: float) -> None:
    with pytest.raises(ConfigError, match="probe_share"):
        policy(probe_share=share)
