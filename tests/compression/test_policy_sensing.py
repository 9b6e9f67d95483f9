"""netsense's use of the link signal: which queue shrinks the bandwidth, and relaxing after a rise.

Synthetic link sequences, no network, no clock (the policy is pure). Figures from the ladder of
`test_policy.py`, on the step-time law (progress_aware=False), whose picks are hand-checkable.
"""

from __future__ import annotations

import pytest

from netsense.compression.policy import ChooseRequest, NetsensePolicy, make_policy
from netsense.compression.policy.link import LinkState

from test_policy import LADDER, MBIT, RTT, S, TC, assert_steady_on_jitter, reference_level


def netsense(**settings: object) -> NetsensePolicy:
    settings.setdefault("progress_aware", False)
    p = make_policy("netsense", LADDER, **settings)
    assert isinstance(p, NetsensePolicy)
    return p


def link(mbit: float, *, t: float = 0.0, srtt_queue: float = 0.0, standing: float | None = None) -> LinkState:
    return LinkState(
        time_s=t, bandwidth_Bps=mbit * MBIT, min_rtt_s=RTT, srtt_s=RTT + srtt_queue, standing_queue_s=standing
    )


def run(policy: NetsensePolicy, mbits: list[float], start: int = 0) -> list[int | None]:
    out = []
    for i, mbit in enumerate(mbits):
        step = start + i
        request = ChooseRequest(link=link(mbit, t=float(step)), payload_bytes=S, compute_s=TC, step=step)
        out.append(policy.choose(request).level)
    return out


def test_the_queue_our_own_push_built_does_not_shrink_the_bandwidth() -> None:
    """srtt carries the queue the last push built (40-60 ms over a 21 ms path after 1 MB pushes at
    50 Mbit/s): without anyone else on the link it halved B. The standing queue is what counts."""
    p = netsense(queue_tolerance_s=0.010)
    own = link(100, srtt_queue=0.040, standing=0.0)
    assert p.effective_bandwidth(own) == pytest.approx(100 * MBIT)
    shared = link(100, srtt_queue=0.040, standing=0.030)
    assert p.effective_bandwidth(shared) == pytest.approx(100 * MBIT * (RTT + 0.010) / (RTT + 0.030))
    legacy = link(100, srtt_queue=0.040)  # no standing-queue measurement: srtt - min RTT, as before
    assert p.effective_bandwidth(legacy) == pytest.approx(100 * MBIT * (RTT + 0.010) / (RTT + 0.040))


def _between_the_bands() -> tuple[float, int, int]:
    """A bandwidth at which the law (eps) picks a lighter level than one it keeps with relax_eps: the
    dead band. Returns (Mbit/s, the kept level, the law's level)."""
    for mbit in (x / 4 for x in range(40, 4000)):
        keep, law = reference_level(mbit * MBIT, eps=0.05), reference_level(mbit * MBIT, eps=0.1)
        heavier_keep = reference_level(mbit / 4 * MBIT)
        if law < keep and heavier_keep >= keep:
            # `keep` fits with eps at `mbit`: a policy committed to it holds it without relax_rise
            return mbit, keep, law
    raise AssertionError("no dead band found on this ladder")


def test_after_a_rise_headroom_is_judged_with_eps_not_the_dead_band() -> None:
    """Rate step: the level moved heavier at the low rate; after the rise the law (eps) wants a
    lighter level, but the stricter relax_eps (the dead band against jitter) does not. A bandwidth
    1.5x the lowest seen at the level is a changed link: relax after k steps of headroom."""
    mbit, keep, law = _between_the_bands()
    k = 5
    for rise, expect_relax in ((1.5, True), (0.0, False)):
        p = netsense(k=k, relax_rise=rise, probe_interval=0, probe_interval_s=0)
        run(p, [mbit / 4] * 3)
        p.level = keep  # committed there (as after a heavier move at the low rate and a partial relax)
        p.hold.low_bw = mbit / 4 * MBIT
        levels = run(p, [mbit] * (3 * k), start=3)
        if expect_relax:
            assert levels[: k - 1] == [keep] * (k - 1) and levels[k - 1 :] == [law] * (2 * k + 1), levels
        else:
            assert levels == [keep] * (3 * k), levels


def test_a_rise_after_a_heavier_move_relaxes_to_the_law_level() -> None:
    """The whole sequence, no state set by hand: high, low (heavier at once), back up to a rate in the
    dead band of the level held at the low rate."""
    mbit, keep, law = _between_the_bands()
    p = netsense(k=5, probe_interval=0, probe_interval_s=0)
    low = next(x for x in (mbit / d for d in (4, 6, 8, 12, 16)) if reference_level(x * MBIT) == keep)
    run(p, [low] * 5)
    assert p.level == keep
    after = run(p, [mbit] * 12, start=5)
    assert after[-1] == law and after.count(keep) == 4  # k - 1 steps of headroom, then relax


def test_after_a_rise_one_dip_pauses_the_headroom_count() -> None:
    """Loaded hosts make one push in a few slow: after a rise, that dip pauses the k steps of
    headroom instead of restarting them (a relax 9.8-11.8 s after a 20 -> 100 Mbit/s rise instead of
    ~6 s was seen that way). Without a rise the count restarts, as the dead band wants."""
    mbit, keep, law = _between_the_bands()
    dip = next(x / 4 for x in range(int(4 * mbit), 0, -1) if reference_level(x / 4 * MBIT) >= keep)
    assert dip >= mbit / 4 * 1.5  # still a rise over the low rate: the dip alone moves nothing
    p = netsense(k=5, probe_interval=0, probe_interval_s=0)
    low = next(x for x in (mbit / d for d in (4, 6, 8, 12, 16)) if reference_level(x * MBIT) == keep)
    run(p, [low] * 5)
    after = run(p, [mbit, mbit, dip, mbit, mbit, mbit, mbit], start=5)
    assert after[:5] == [keep] * 5 and after[5:] == [law] * 2, after  # dip paused, did not restart


def test_no_flapping_with_relax_rise_on_a_noisy_link() -> None:
    """+-10% jitter is not a rise: at most 3 level changes in 200 steps, as without the rule."""
    assert_steady_on_jitter(lambda mbits: run(netsense(), mbits), (20, 25, 60, 100, 160, 400))


def test_relax_rise_must_exceed_one() -> None:
    from netsense.errors import ConfigError

    with pytest.raises(ConfigError, match="relax_rise"):
        netsense(relax_rise=1.0)


def test_redecide_mid_push_moves_heavier_only_when_the_law_says_so() -> None:
    """A push running far slower than predicted is put to the law again with the path as it is now:
    a rate drop gives a heavier decision at once (committed, so the next step keeps it); the same
    rate as at the decision, or a faster one, lets the push finish; no step is counted."""
    p = netsense()
    levels = run(p, [1000.0] * 3)
    start = levels[-1]
    assert start is not None
    sent = p.choose(ChooseRequest(link=link(1000.0, t=3.0), payload_bytes=S, compute_s=TC, step=3))
    assert p.redecide(link=link(1000.0, t=3.2), sent=sent, bytes_acked=S // 2, elapsed_s=0.2) is None
    assert p.redecide(link=link(2000.0, t=3.3), sent=sent, bytes_acked=S, elapsed_s=0.2) is None
    assert p.level == start
    new = p.redecide(link=link(20.0, t=3.5), sent=sent, bytes_acked=S // 40, elapsed_s=0.5)
    assert new is not None and new.level is not None and new.level > start
    assert new.reason.startswith("redecide:") and new.step == 3
    assert new.level == reference_level(20.0 * MBIT)  # the law's level at the rate now
    assert p.level == new.level
    nxt = p.choose(ChooseRequest(link=link(20.0, t=4.0), payload_bytes=S, compute_s=TC, step=4))
    assert nxt.level == new.level and nxt.reason.startswith("hold")


def test_redecide_believes_the_slow_push_over_a_stale_app_limited_link_value() -> None:
    """The rate-step run's failure: a probe's push (light, so app-limited) left the link reporting
    84 Mbit/s; the next push, hit by a drop to ~10 Mbit/s per worker, ran at 6.6. The redecide's
    sample alone must set the estimate (the push's pipe is full), or the law stays near the stale
    rate and goes one level heavier instead of to the level that fits."""
    p = netsense()
    run(p, [1000.0] * 3)
    stale = LinkState(time_s=3.5, bandwidth_Bps=1000.0 * MBIT, min_rtt_s=RTT, srtt_s=RTT, app_limited=True)
    sent = p.choose(ChooseRequest(link=stale, payload_bytes=S, compute_s=TC, step=3))
    rate_mbit, elapsed = 20.0, 0.5
    acked = int(rate_mbit * MBIT * (elapsed - RTT))
    new = p.redecide(link=stale, sent=sent, bytes_acked=acked, elapsed_s=elapsed)
    assert new is not None and new.level == reference_level(rate_mbit * MBIT), (new, reference_level(rate_mbit * MBIT))
    assert new.bandwidth_Bps == pytest.approx(rate_mbit * MBIT)


def test_redecide_is_none_for_non_adaptive_policies() -> None:
    fixed = make_policy("fixed:qsgd:8", LADDER)
    sent = fixed.choose(ChooseRequest(link=link(1000.0), payload_bytes=S, compute_s=TC, step=0))
    assert fixed.redecide(link=link(1.0, t=1.0), sent=sent, bytes_acked=1000, elapsed_s=1.0) is None
