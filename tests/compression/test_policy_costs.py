"""The netsense cost model with measured costs: codec timings per level and the transport's per-byte
cost, on synthetic sequences shaped like digits-cnn's (153 kB of fp32 per step, 5 ms of compute)."""

from __future__ import annotations

import math
import random
import statistics

import pytest

import netsense.compression  # noqa: F401  (registers the real codecs the ladder names)
from netsense.compression.policy import ChooseRequest, NetsensePolicy, SendReport, make_policy
from netsense.compression.policy.costs import CodecCosts, StepJitter, TransportCost
from netsense.compression.policy.ladder import DEFAULT_LADDER, Ladder
from netsense.compression.policy.link import LinkState

S = 153_128  # digits-cnn's dense fp32 gradient
TC = 0.005
RTT = 0.001
MB = 1e6
LADDER = Ladder.parse(DEFAULT_LADDER, numel=S // 4)
FP32, FP16, Q8, Q4 = (LADDER.find(s) for s in ("fp32", "fp16", "qsgd:8", "qsgd:4"))
# What the worker measured on 2 loaded cores (decision logs of the 2026-11-30 runs): a step's
# encode with error feedback of the six keys, and a candidate round's decode.
MEASURED = {FP32: (0.0001, 0.0001), FP16: (0.0008, 0.0001), Q8: (0.0075, 0.002), Q4: (0.007, 0.002)}


def policy(**settings: object) -> NetsensePolicy:
    p = make_policy("netsense", LADDER, **settings)
    assert isinstance(p, NetsensePolicy)
    return p


def measured(p: NetsensePolicy, *, costs: bool = True) -> NetsensePolicy:
    """Feed measured q (8-bit loses nothing measurable, 4-bit ~10%) and, with `costs`, the timings."""
    if costs:
        for level, (enc, dec) in MEASURED.items():
            p.observe_costs(level=level, dense_bytes=S, encode_s=enc, decode_s=dec)
    p.observe_progress(level=Q8, progress=0.9997)
    p.observe_progress(level=Q4, progress=0.9)
    return p


def link(bw_Bps: float | None, *, t: float = 0.0, rtt: float = RTT, app_limited: bool = False) -> LinkState:
    return LinkState(time_s=t, bandwidth_Bps=bw_Bps, min_rtt_s=rtt, srtt_s=rtt, app_limited=app_limited)


def choose(p: NetsensePolicy, lk: LinkState, step: int = 0) -> int:
    d = p.choose(ChooseRequest(link=lk, payload_bytes=S, compute_s=TC, step=step))
    assert d.level is not None
    return d.level


# --- CodecCosts -------------------------------------------------------------------------------


def test_codec_costs_start_from_the_ladder_and_switch_to_the_median_of_timings() -> None:
    costs = CodecCosts(LADDER, window=3)
    assert costs.level(Q8) is LADDER[Q8] and costs.measured(Q8) == (False, False)
    costs.observe(Q8, dense_bytes=S, encode_s=0.0075)
    assert costs.encode_s_per_mb(Q8) == pytest.approx(0.0075 / (S / MB))
    assert costs.decode_s_per_mb(Q8) == LADDER[Q8].decode_s_per_mb  # the half not timed keeps the prior
    assert costs.measured(Q8) == (True, False)
    for seconds in (0.5, 0.007, 0.008):  # one scheduler stall among three timings: the median ignores it
        costs.observe(Q8, dense_bytes=S, encode_s=seconds)
    assert costs.encode_s_per_mb(Q8) == pytest.approx(0.008 / (S / MB))
    lv = costs.level(Q8)
    assert lv.codec_s(S) == pytest.approx(0.008 + LADDER[Q8].decode_s_per_mb * S / MB)
    assert (lv.spec, lv.ratio, lv.progress) == (LADDER[Q8].spec, LADDER[Q8].ratio, LADDER[Q8].progress)
    for bad in (-1.0, math.nan, math.inf):
        costs.observe(Q8, dense_bytes=S, encode_s=bad, decode_s=bad)
    costs.observe(Q8, dense_bytes=0, encode_s=1.0)
    costs.observe(99, dense_bytes=S, encode_s=1.0)  # not a level: ignored
    assert costs.encode_s_per_mb(Q8) == pytest.approx(0.008 / (S / MB)) and costs.measured(Q8) == (True, False)
    assert [lv.spec for lv in costs.levels()] == list(LADDER.specs)


def test_codec_costs_cached_levels_follow_every_new_timing() -> None:
    """`levels()` is computed once per new timing (the policy asks on every decision): after any
    mix of timings and reads it equals the medians of the last `window` timings, read afresh."""
    rng = random.Random(5)
    costs = CodecCosts(LADDER, window=4)
    timed: dict[int, tuple[list[float], list[float]]] = {i: ([], []) for i in range(len(LADDER))}
    for _ in range(300):
        level = rng.randrange(len(LADDER))
        enc = rng.choice([None, rng.uniform(0.0, 0.01)])
        dec = rng.choice([None, rng.uniform(0.0, 0.01)])
        costs.observe(level, dense_bytes=S, encode_s=enc, decode_s=dec)
        for seconds, seen in ((enc, timed[level][0]), (dec, timed[level][1])):
            if seconds is not None:
                seen.append(seconds / (S / MB))
        if rng.random() < 0.5:  # reads between timings fill the cache that the next timing must clear
            for i, lv in enumerate(costs.levels()):
                enc_seen, dec_seen = timed[i]
                assert lv.encode_s_per_mb == (
                    statistics.median(enc_seen[-4:]) if enc_seen else LADDER[i].encode_s_per_mb
                )
                assert costs.decode_s_per_mb(i) == lv.decode_s_per_mb == (
                    statistics.median(dec_seen[-4:]) if dec_seen else LADDER[i].decode_s_per_mb
                )


# --- TransportCost ----------------------------------------------------------------------------


def test_transport_cost_is_the_slope_not_the_fixed_part() -> None:
    """A send costs 3 ms that do not grow with its size (the PS's optimizer step, stream set-up) plus
    1 / (30 MB/s) per byte: the fit finds 30 MB/s, where time / bytes of a small send would not."""
    tc = TransportCost()
    fixed, rate = 0.003, 30e6
    for _ in range(3):
        tc.observe(level=2, bytes_sent=38_000, comm_s=RTT + fixed + 38_000 / rate, time_s=0.0, min_rtt_s=RTT)
    assert tc.s_per_byte(0.0) is None  # one size: no slope yet
    for t in range(5):
        for level, size in ((0, 153_000), (1, 77_000), (5, 1_600)):
            noise = 1 + 0.05 * math.sin(7 * t + level)
            tc.observe(level=level, bytes_sent=size, comm_s=RTT + (fixed + size / rate) * noise, time_s=t, min_rtt_s=RTT)
    assert tc.goodput_Bps(5.0) == pytest.approx(rate, rel=0.1)
    assert 1_600 / (fixed + 1_600 / rate) < 0.6e6  # what time / bytes would have said


def test_transport_cost_subtracts_decode_skips_queues_and_forgets_old_rates() -> None:
    tc = TransportCost(horizon_s=10.0)
    for comm in (0.006, 0.050, 0.006):  # the median drops a scheduler stall
        tc.observe(level=0, bytes_sent=150_000, comm_s=comm, time_s=0.0, min_rtt_s=0.001)
    for _ in range(2):
        tc.observe(level=2, bytes_sent=40_000, comm_s=0.012, time_s=0.0, min_rtt_s=0.001, peer_decode_s=0.009)
    assert tc.s_per_byte(0.0) is None  # two sends are not yet a point
    tc.observe(level=2, bytes_sent=40_000, comm_s=0.012, time_s=0.0, min_rtt_s=0.001, peer_decode_s=0.009)
    assert tc.s_per_byte(0.0) == pytest.approx((0.005 - 0.002) / 110_000)
    # A send that starts on a standing queue measures a competitor's traffic, not ours.
    for _ in range(3):
        tc.observe(level=1, bytes_sent=75_000, comm_s=1.0, time_s=1.0, queue_s=0.05, queue_tolerance_s=0.01)
    assert [b for b, _ in tc.points(1.0)] == [150_000, 40_000] and tc.count(1) == 0
    # Ten seconds after its last send a level's point is gone: a rate seen before a link change
    # must not outlive it.
    tc.observe(level=2, bytes_sent=40_000, comm_s=0.003, time_s=10.5, min_rtt_s=0.001)
    assert tc.s_per_byte(10.5) is None
    # A fit that slopes down (noise, or a small send that costs more) charges bytes nothing.
    down = TransportCost(min_samples=1)
    down.observe(level=0, bytes_sent=150_000, comm_s=0.004, time_s=0.0)
    down.observe(level=5, bytes_sent=2_000, comm_s=0.008, time_s=0.0)
    assert down.s_per_byte(0.0) == 0.0 and down.goodput_Bps(0.0) is None
    # No point costs more per byte than its own time / bytes (the fixed part is >= 0): a noisy
    # steep fit is capped there.
    steep = TransportCost(min_samples=1)
    steep.observe(level=0, bytes_sent=150_000, comm_s=0.030, time_s=0.0)
    steep.observe(level=1, bytes_sent=75_000, comm_s=0.003, time_s=0.0)
    assert steep.s_per_byte(0.0) == pytest.approx(0.003 / 75_000)


def test_transport_cost_cached_fit_equals_a_fresh_fit_and_expires_with_the_horizon() -> None:
    """The fit is kept between sends (the policy asks on every decision); after every send, and as
    points leave the horizon with no send at all, it equals the fit of a fresh `TransportCost` fed
    the same sends (which has nothing cached)."""
    rng = random.Random(7)
    tc = TransportCost(horizon_s=2.0)
    sends: list[dict[str, float]] = []
    t = 0.0
    for _ in range(400):
        t += rng.choice([0.02, 0.02, 0.02, 0.5])
        level = rng.choice([FP32, FP16, FP16, FP16, Q8])
        size = S * LADDER[level].ratio
        send = dict(level=level, bytes_sent=int(size), comm_s=0.002 + size / rng.uniform(20e6, 60e6), time_s=t)
        tc.observe(**send)  # type: ignore[arg-type]
        sends.append(send)
        for now in (t, t + rng.uniform(0.0, 3.0)):  # later reads drop points that aged out
            fresh = TransportCost(horizon_s=2.0)
            for old in sends:
                fresh.observe(**old)  # type: ignore[arg-type]
            assert tc.s_per_byte(now) == fresh.s_per_byte(now)
            assert tc.points(now) == fresh.points(now)
    # No send for longer than the horizon: the last fit must not outlive its points.
    assert tc.s_per_byte(t) is not None or len(tc.points(t)) < 2
    assert tc.s_per_byte(t + 2.5) is None and tc.points(t + 2.5) == []


# --- the law with measured costs --------------------------------------------------------------


def drive(p: NetsensePolicy, bw_Bps: float, per_byte_s: float, steps: int) -> list[str]:
    """`steps` app-limited pushes 15 ms apart, each taking 2 ms plus max(1 / B, c) per byte; the specs."""
    specs = []
    for step in range(steps):
        lk = link(bw_Bps, t=step * 0.015, app_limited=True)
        d = p.choose(ChooseRequest(link=lk, payload_bytes=S, compute_s=TC, step=step))
        wire = d.predicted_bytes
        comm_s = RTT + 0.002 + wire * max(per_byte_s, 1 / bw_Bps)
        p.observe(SendReport(step=step, level=d.level, bytes_sent=wire, comm_s=comm_s))
        specs.append(d.spec if not d.reason.startswith("probe") else "probe:" + d.spec)
    return specs


def test_no_probes_where_the_hosts_per_byte_cost_alone_rules_out_lighter_levels() -> None:
    """Unshaped loopback: bytes cost c = 20 ns (50 MB/s, the hosts' CPUs) over a link estimated at
    300 MB/s. fp16 beats fp32 even at unlimited bandwidth, so a probe to fp32 can reveal nothing
    (they were every 20 steps on each worker and the PS); on a link-bound path, where c is the
    link's own 1 / B, the probes go on, unless fp32 pays only beyond reach (`probe_unseen_s`): it
    never beats fp16 there at twice the rate or at the highest rate seen."""
    loopback = drive(measured(policy()), 300e6, 20e-9, steps=400)
    assert loopback[50:] == ["fp16"] * 350
    for bw in (2.5e6, 12.5e6):  # 20 and 100 Mbit/s
        specs = drive(measured(policy(probe_backoff_max=1, probe_share=0, probe_unseen_s=0)), bw, 20e-9, steps=400)
        assert sum(s.startswith("probe:") for s in specs[50:]) >= 15
        # With the default back-off they go on too, at most every 80 steps once none finds headroom.
        specs = drive(measured(policy(probe_unseen_s=0)), bw, 20e-9, steps=400)
        assert sum(s.startswith("probe:") for s in specs[50:]) >= 4
        # By default none in these 6 s: fp32 is no rise away (`probe_unseen_s`, 30 s).
        specs = drive(measured(policy()), bw, 20e-9, steps=400)
        assert not any(s.startswith("probe:") for s in specs[50:])
    # The fp32 point ages out after `horizon_s` without an fp32 send; c is unknown again and the
    # law itself sends fp32 once, which refreshes it: one fp32 step per ~10 s, not per 20 steps.
    long = drive(measured(policy()), 300e6, 20e-9, steps=2000)
    late = [i for i, s in enumerate(long) if "fp32" in s and i >= 100]
    assert 1 <= len(late) <= 4 and not any(s.startswith("probe:") for s in long[100:])


def rounds(p: NetsensePolicy, step_s: float, steps: int = 600) -> list[int]:
    """The steps at which `p` asks for a candidate round, one decision every `step_s` seconds."""
    asked = []
    for step in range(steps):
        p.choose(ChooseRequest(link=link(50e6, t=step * step_s), payload_bytes=S, compute_s=TC, step=step))
        levels = p.progress_candidates(step)
        assert p.progress_candidates(step) == levels  # the uplink asks twice a step: same answer
        if levels:
            asked.append(step)
    return asked


def test_candidate_rounds_stay_within_their_share_of_the_time() -> None:
    """A round costs every lossy level's codec time on the sample: 8 x 3.5 ms here (the default
    ladder's 8 lossy levels), ~3 % of 50 steps of 18 ms (unshaped loopback), so with
    `progress_budget` = 1 % the rounds come every 200 steps there (every 150 with the 6 lossy
    levels before PowerSGD joined the ladder); on a 100 ms step (20 Mbit/s) 50 steps are 5 s and
    they stay every 50."""
    def timed() -> NetsensePolicy:
        p = policy()
        for level, lv in enumerate(LADDER):
            if not lv.lossless:
                p.observe_costs(level=level, dense_bytes=S, encode_s=0.003, decode_s=0.0005)
        return p

    assert rounds(timed(), 0.018) == [0, 200, 400]
    assert rounds(timed(), 0.1) == list(range(0, 600, 50))
    assert rounds(policy(progress_budget=0.0), 0.018) == list(range(0, 600, 50))  # no limit: as before


def test_measured_codec_cost_makes_an_unconstrained_link_pick_fp16_not_qsgd8() -> None:
    """Unshaped loopback, 50 MB/s: with the ladder's planning figures qsgd:8 looks cheapest (that is
    what the uplink chose in the 2026-11-30 runs); with its measured 7.5 ms encode, fp16 wins."""
    assert choose(measured(policy(), costs=False), link(50e6)) == Q8  # the ladder's figures: the bug fixed here
    p = measured(policy())
    assert choose(p, link(50e6)) == FP16
    assert choose(measured(policy(measured_costs=False)), link(50e6)) == Q8  # the setting switches it off
    # Still lossless where bytes cost nothing worth a cast (a fast link, fp16's cast measured).
    assert choose(measured(policy()), link(5e9)) == FP32


def test_bandwidth_bound_link_still_compresses_with_measured_costs() -> None:
    """20 Mbit/s, 20 ms RTT: 77 kB of fp16 take 31 ms, so 8-bit's slow encode still pays."""
    p = measured(policy())
    level = choose(p, link(2.5e6, rtt=0.02))
    assert level >= Q8
    d = p.choose(ChooseRequest(link=link(2.5e6, rtt=0.02, t=1.0), payload_bytes=S, compute_s=TC, step=1))
    assert d.level == level and d.predicted_comm_s == pytest.approx(
        LADDER[level].ratio * S / 2.5e6 + 0.02 + sum(MEASURED[level]), rel=0.02
    )


def test_untried_levels_keep_the_ladder_figures() -> None:
    p = measured(policy())
    top = len(LADDER) - 1
    assert p.costs.level(top) is LADDER[top] and p.costs.level(Q8) is not LADDER[Q8]


def cpu_bound_run(p: NetsensePolicy, steps: int = 40) -> list[int]:
    """The delivery rate says 500 MB/s, but a push takes 2 ms fixed + 1 / (30 MB/s) per byte (the
    hosts' CPUs)."""
    levels = []
    for step in range(steps):
        level = choose(p, link(500e6, t=0.02 * step), step)
        size = LADDER[level].ratio * S
        p.observe(SendReport(step=step, level=level, bytes_sent=round(size), comm_s=RTT + 0.002 + size / 30e6))
        levels.append(level)
    return levels


def test_per_byte_cost_prefers_fewer_bytes_on_a_cpu_bound_path() -> None:
    """With bytes nearly free at 500 MB/s fp32 wins the tie, but once an fp16 send (an exploration,
    `probe_interval` steps in) shows the hosts move 30 MB/s, fp16 is 15% faster and stays; qsgd:8's
    codec stays too dear."""
    off = measured(policy(transport_cost=False))
    assert set(cpu_bound_run(off)) == {FP32}
    on = measured(policy())
    levels = cpu_bound_run(on)
    assert on.transport.goodput_Bps(0.8) == pytest.approx(30e6, rel=0.01)
    explored = levels.index(FP16)  # fp16 explored for three steps (a point), then kept
    assert set(levels[:explored]) == {FP32} and explored <= 21 and set(levels[explored:]) == {FP16}
    # The per-byte cost only raises a byte's price: when the link slows to 20 Mbit/s, it rules.
    for step in range(40, 45):
        level = choose(on, link(2.5e6, t=0.02 * step, rtt=0.02), step)
        size = LADDER[level].ratio * S
        on.observe(SendReport(step=step, level=level, bytes_sent=round(size), comm_s=0.02 + size / 2.5e6))
    assert level >= Q8


def test_no_flapping_with_noisy_costs_and_link() -> None:
    """Timings jitter by +-30% (shared cores) and the rate by +-10%; the committed level must not
    flap at any rate from loopback to a slow WAN."""
    for rate in (2.5e6, 6e6, 12.5e6, 50e6, 500e6):
        rng = random.Random(int(rate))
        p = measured(policy())
        changes, last = 0, None
        for step in range(300):
            for level, (enc, dec) in MEASURED.items():
                if rng.random() < 0.3:
                    p.observe_costs(level=level, dense_bytes=S, encode_s=enc * rng.uniform(0.7, 1.3),
                                    decode_s=dec * rng.uniform(0.7, 1.3))
            lk = link(rate * rng.uniform(0.9, 1.1), t=step * 0.02)
            d = p.choose(ChooseRequest(link=lk, payload_bytes=S, compute_s=TC, step=step))
            assert d.level is not None
            size, decode = LADDER[d.level].ratio * S, MEASURED.get(d.level, (0.0, 0.001))[1]  # the PS decodes, then acks
            comm_s = RTT + decode + size / rate * rng.uniform(0.9, 1.1)
            p.observe(SendReport(step=step, level=d.level, bytes_sent=round(size), comm_s=comm_s))
            if last is not None and p.level != last:
                changes += 1
            last = p.level
        assert changes <= 2, (rate, changes)


# --- StepJitter ---------------------------------------------------------------------------------


def test_step_jitter_is_the_median_relative_deviation() -> None:
    """Steady steps give 0; steps alternating +-15 % around 0.2 s give 0.15; one stall among
    steady steps moves nothing (a median, not a mean); nothing before four steps."""
    j = StepJitter(8)
    for t in (0.2, 0.2, 0.2):
        j.observe(t)
    assert j.value == 0.0
    for _ in range(8):
        j.observe(0.2)
    j.observe(2.0)  # a scheduler stall
    assert j.value == 0.0
    for i in range(8):
        j.observe(0.2 * (1.15 if i % 2 else 0.85))
    assert j.value == pytest.approx(0.15)


def test_step_jitter_ignores_bad_figures_and_can_be_off() -> None:
    j = StepJitter(4)
    for t in (0.1, 0.2, float("nan"), float("inf"), -1.0, 0.0, 0.1, 0.2):
        j.observe(t)
    assert j.value == pytest.approx(0.05 / 0.15)  # 0.1, 0.2, 0.1, 0.2: median 0.15
    off = StepJitter(0)
    for t in (0.1, 0.3, 0.1, 0.3, 0.1):
        off.observe(t)
    assert off.value == 0.0


def test_return_share_is_the_median_delivery_over_a_pushed_bytes_time() -> None:
    """One until three deliveries counted; then the median of (seconds - min RTT) / (bytes x a
    pushed byte's time), clamped; deliveries too small to time (< RETURN_MIN_S at the push's
    rate) and nonsense are skipped."""
    from netsense.compression.policy.costs import RETURN_MIN_S, RETURN_SHARE_BOUNDS, ReturnShare

    r = ReturnShare()
    per_byte = 1 / 2.5e6  # 20 Mbit/s
    nbytes = 100_000  # 40 ms at that rate
    r.observe(nbytes=nbytes, seconds=0.02 + 0.080, min_rtt_s=0.02, push_byte_s=per_byte)  # 2x
    r.observe(nbytes=nbytes, seconds=0.02 + 0.160, min_rtt_s=0.02, push_byte_s=per_byte)  # 4x
    assert r.value == 1.0
    small = int(0.5 * RETURN_MIN_S / per_byte)
    r.observe(nbytes=small, seconds=5.0, min_rtt_s=0.02, push_byte_s=per_byte)  # too small to time
    r.observe(nbytes=nbytes, seconds=math.nan, min_rtt_s=0.02, push_byte_s=per_byte)
    r.observe(nbytes=0, seconds=1.0, min_rtt_s=0.02, push_byte_s=per_byte)
    r.observe(nbytes=nbytes, seconds=1.0, min_rtt_s=0.02, push_byte_s=0.0)
    assert r.value == 1.0
    r.observe(nbytes=nbytes, seconds=0.02 + 0.120, min_rtt_s=0.02, push_byte_s=per_byte)  # 3x
    assert r.value == pytest.approx(3.0)
    for _ in range(8):
        r.observe(nbytes=nbytes, seconds=100.0, min_rtt_s=0.02, push_byte_s=per_byte)
    assert r.value == RETURN_SHARE_BOUNDS[1]
    for _ in range(8):
        r.observe(nbytes=nbytes, seconds=0.0, min_rtt_s=0.02, push_byte_s=per_byte)  # faster than the RTT
    assert r.value == RETURN_SHARE_BOUNDS[0]
