"""`probe_share`: an upward probe waits until a share of the time since the last probe covers its
predicted extra time over a step at the committed level and what the last probe cost beyond its
prediction, or the back-off's longest wait passed (docs/POLICIES.md, "Probes")."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from probe_ladder import MBIT, RTT, S, TC, cadence_policy
from netsense.compression.policy import ChooseRequest, Decision, NetsensePolicy, SendReport
from netsense.compression.policy.link import LinkState
from netsense.errors import ConfigError


def policy(**settings: object) -> NetsensePolicy:
    return cadence_policy(**{"probe_unseen_s": 0, **settings})


def run(
    p: NetsensePolicy, steps: int, *, dt: float = 1.0, overrun: Callable[[Decision], float] | None = None
) -> tuple[Decision, list[Decision]]:
    """The first decision (a saturated sample sets the estimate) and the probes of `steps` app-limited
    steps of `dt` seconds each at 20 Mbit/s; with `overrun`, each send is observed as taking its
    predicted wire time plus `overrun(decision)` seconds."""

    def request(step: int, app_limited: bool = True) -> ChooseRequest:
        link = LinkState(time_s=step * dt, bandwidth_Bps=20 * MBIT, min_rtt_s=RTT, srtt_s=RTT, app_limited=app_limited)
        return ChooseRequest(link=link, payload_bytes=S, compute_s=TC, step=step)

    def choose(step: int) -> Decision:
        d = p.choose(request(step, app_limited=step > 0))
        if overrun is not None:
            wire = d.predicted_bytes + d.pad_bytes
            comm = wire / (20 * MBIT) + RTT + overrun(d)
            p.observe(SendReport(step=step, level=d.level, bytes_sent=wire, comm_s=comm, app_limited=True))
        return d

    first = choose(0)
    decisions = [choose(step) for step in range(1, steps + 1)]
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


def is_probe(d: Decision) -> bool:
    return d.reason.startswith("probe")


def test_a_probe_that_cost_more_than_predicted_delays_the_next_by_what_it_cost() -> None:
    """Each probe's send took 0.3 s beyond its prediction where the held sends took theirs: the next
    waits until the share also covers those 0.3 s (~18 steps of 1 s, not ~8), and the probes'
    measured cost stays within the share."""
    settings = {"probe_share": 0.03, "transport_cost": False}
    first, planned = run(policy(**settings), 120, overrun=lambda d: 0.0)
    first, probes = run(policy(**settings), 120, overrun=lambda d: 0.3 if is_probe(d) else 0.0)
    assert first.level is not None and len(planned) >= 12
    extras = [extra_s(d, first.level) for d in probes]
    later = gaps(first, probes)[1:]
    assert later and all(gap * 0.03 >= extra + 0.3 and (gap - 1) * 0.03 < extra + 0.3 for gap, extra in zip(later, extras[1:]))
    assert sum(extras) + 0.3 * len(probes) <= 0.03 * 120
    assert len(probes) <= len(planned) // 2


def test_an_overrun_every_send_shares_is_not_the_probe_s() -> None:
    """Every send 20 ms slower than predicted (a per-send delay the prediction leaves out): the probes
    keep the cadence their predicted cost allows; and a probe whose slowness the held sends after it
    share (the link dropped as it went out) is not charged either."""
    settings = {"probe_share": 0.03, "transport_cost": False}
    first, planned = run(policy(**settings), 80, overrun=lambda d: 0.0)
    assert len(planned) >= 8
    assert gaps(first, run(policy(**settings), 80, overrun=lambda d: 0.02)[1]) == gaps(first, planned)
    p = policy(**settings)
    for held in (0.0, 0.0, 0.0):
        p.probes.sent(held)
    p.probes._probe_unsent = True  # the decision just sent was a probe
    p.probes.sent(0.4)
    p.probes.sent(0.0)  # the next send is no probe's
    assert p.probes.owed_s() == pytest.approx(0.4)
    for held in (0.35, 0.4, 0.45):  # the sends after it as slow: median of the last five is 0.35
        p.probes.sent(held)
    assert p.probes.owed_s() == pytest.approx(0.05)


@pytest.mark.parametrize("share", [-0.1, 1.0, 2.0])
def test_probe_share_out_of_range_is_a_config_error(share: float) -> None:
    with pytest.raises(ConfigError, match="probe_share"):
        policy(probe_share=share)
