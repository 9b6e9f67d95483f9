"""Adaptive policies on synthetic link sequences: no network, no clock, no real lossy codecs."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Iterable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from netsense.compression.base import Codec, Payload, register_codec
from netsense.compression.policy import (
    ChooseRequest,
    Dc2Policy,
    NetsensePolicy,
    PaperPolicy,
    Policy,
    SendReport,
    make_policy,
    policy_names,
    predict,
    register_policy,
)
from netsense.compression.policy.ladder import Ladder, Level
from netsense.compression.policy.law import LevelHold
from netsense.compression.policy.link import LinkState
from netsense.compression.policy.netsense_settings import NetsensePolicySettings
from netsense.errors import ConfigError

MBIT = 1e6 / 8
S = 45_000_000  # 45 MB of fp32 gradients
TC = 0.5
RTT = 0.02


def _lv(spec: str, ratio: float, enc: float = 0.01, dec: float = 0.002, lossless: bool = False) -> Level:
    return Level(spec, ratio, enc, dec, lossless)


# Figures close to the real ladder's, fixed so the expectations below are hand-checkable.
LADDER = Ladder(
    (
        _lv("fp32", 1.0, 0.0005, 0.0005, lossless=True),
        _lv("fp16", 0.5, 0.002, 0.001),
        _lv("qsgd:8", 0.26, 0.005),
        _lv("qsgd:4", 0.135, 0.005),
        _lv("topk:0.1+fp16", 0.085),
        _lv("topk:0.01+fp16", 0.009),
        _lv("topk:0.001+fp16", 0.0009),
    )
)


class FakeSparse(Codec):
    """A registry stand-in for the paper law's top-k, so its tests do not need the real one."""

    def __init__(self, arg: str | None) -> None:
        self.density = float(arg or "nan")
        if not 0 < self.density <= 1:
            raise ValueError(f"density must be in (0, 1], got {arg!r}")
        self.spec = f"policyfake:{arg}"

    def encode(self, tensor: torch.Tensor) -> Payload:
        return Payload(self.spec, tuple(tensor.shape), "float32", ())

    def decode(self, payload: Payload, *, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.zeros(payload.shape, device=device)

    def nominal_ratio(self, numel: int) -> float:
        return min(1.0, 1.5 * self.density)


register_codec("policyfake", FakeSparse)


def link(
    bw_mbit: float | None, *, t: float = 0.0, queue: float = 0.0, loss: float = 0.0, app_limited: bool = False
) -> LinkState:
    return LinkState(
        time_s=t,
        bandwidth_Bps=None if bw_mbit is None else bw_mbit * MBIT,
        min_rtt_s=RTT,
        srtt_s=RTT + queue,
        loss_rate=loss,
        app_limited=app_limited,
    )


def reference_level(bw_Bps: float, *, compute_s: float = TC, overlap: bool = False, eps: float = 0.1) -> int:
    """The step-time law (docs/POLICIES.md) written out once more, apart from the policy's bookkeeping."""
    steps = []
    for lv in LADDER:
        comm = lv.ratio * S / bw_Bps + RTT + (lv.encode_s_per_mb + lv.decode_s_per_mb) * S / 1e6
        steps.append(max(compute_s, comm) if overlap else compute_s + comm)
    best = min(steps)
    return next(i for i, p in enumerate(steps) if p <= (1 + eps) * best)


def run(policy: Policy, bws: list[float | None], **kw: object) -> list[int | None]:
    levels = []
    for step, bw in enumerate(bws):
        lk = link(bw, t=float(step), **kw)  # type: ignore[arg-type]
        d = policy.choose(ChooseRequest(link=lk, payload_bytes=S, compute_s=TC, step=step))
        levels.append(d.level)
    return levels


def netsense(**settings: object) -> NetsensePolicy:
    # The mechanics below (hysteresis, probes, bandwidth estimation) are checked on the step-time
    # law, whose picks are hand-checkable with `reference_level`; LADDER's levels carry q = 1, on
    # which the progress-aware law would pick the fastest level. Its own tests use LADDER_Q.
    settings.setdefault("progress_aware", False)
    p = make_policy("netsense", LADDER, **settings)
    assert isinstance(p, NetsensePolicy)
    return p


# --- netsense ---------------------------------------------------------------------------------


def test_fast_link_stays_lossless() -> None:
    p = netsense()
    for step in range(30):
        d = p.choose(ChooseRequest(link=link(10_000), payload_bytes=S, compute_s=TC, step=step))
        assert (d.level, d.spec) == (0, "fp32")
    assert d.predicted_comm_s is not None and d.predicted_comm_s < 0.2


def test_slow_link_picks_a_level_that_fits() -> None:
    p = netsense()
    d = p.choose(ChooseRequest(link=link(20), payload_bytes=S, compute_s=TC, step=0))
    assert d.level == reference_level(20 * MBIT) == 6
    # 18 s of fp32 shrink to well under a second, and nothing predicts much better.
    assert d.predicted_comm_s is not None and d.predicted_step_s is not None
    assert d.predicted_comm_s < 1.0
    best = min(
        predict(lv, payload_bytes=S, bandwidth_Bps=20 * MBIT, min_rtt_s=RTT, compute_s=TC, overlap=False).step_s
        for lv in LADDER
    )
    assert d.predicted_step_s <= 1.1 * best
    assert d.predicted_bytes == round(0.0009 * S)


def test_bandwidth_drop_moves_heavier_at_once_and_recovery_waits_k_steps() -> None:
    k = 5
    p = netsense(k=k)
    light, heavy = reference_level(100 * MBIT), reference_level(20 * MBIT)
    assert light < heavy
    assert run(p, [100] * 10) == [light] * 10
    d = p.choose(ChooseRequest(link=link(20), payload_bytes=S, compute_s=TC, step=10))
    assert d.level == heavy and d.reason.startswith("heavier")
    run(p, [20] * 10)
    back = run(p, [100] * (k + 5))
    assert back[: k - 1] == [heavy] * (k - 1)
    assert back[k - 1 :] == [light] * 6


def assert_steady_on_jitter(levels_of: Callable[[list[float]], list[int | None]], mbits: Iterable[float]) -> None:
    """At most 3 level changes in 200 steps of +-10% jitter around each rate (Mbit/s), three seeds."""
    for mbit in mbits:
        for seed in range(3):
            rng = random.Random(seed)
            levels = levels_of([mbit * rng.uniform(0.9, 1.1) for _ in range(200)])
            changes = sum(a != b for a, b in zip(levels, levels[1:]))
            assert changes <= 3, (mbit, seed, changes)


def test_no_flapping_on_a_noisy_link() -> None:
    assert_steady_on_jitter(lambda mbits: run(netsense(), mbits), (20, 25, 60, 100, 160, 400))


def test_relax_backs_off_when_undone_and_stays_bounded() -> None:
    p = netsense(k=2, max_k=8, relax_eps=0.1)
    rng = random.Random(1)
    run(p, [160 * rng.uniform(0.9, 1.1) for _ in range(300)])
    assert 2 <= p.k_now <= 8


def test_app_limited_low_samples_do_not_drive_it_heavier() -> None:
    p = netsense(probe_interval=0, probe_interval_s=0)
    start = run(p, [100] * 5)[-1]
    assert start is not None
    for step in range(5, 40):
        # Compressed sends are small: the link reports a low app-limited rate; the application's
        # sends are latency-bound (two RTTs for a few hundred kB) or flagged app-limited.
        d = p.choose(ChooseRequest(link=link(2, t=step, app_limited=True), payload_bytes=S, compute_s=TC, step=step))
        sent = SendReport(step=step, level=d.level, bytes_sent=d.predicted_bytes, comm_s=2 * RTT, app_limited=step % 2 == 0)
        p.observe(sent)
        assert d.level == start
    assert p.bandwidth.value_Bps == 100 * MBIT


def test_app_limited_higher_sample_raises_estimate() -> None:
    p = netsense()
    run(p, [20] * 3)
    run(p, [100], app_limited=True)
    assert p.bandwidth.value_Bps == 100 * MBIT


def test_upward_probe_while_app_limited() -> None:
    p = netsense(probe_interval=5, probe_interval_s=0, probe_backoff_max=1)
    heavy = run(p, [20])[-1]
    assert heavy is not None and heavy > 0
    decisions = [
        p.choose(ChooseRequest(link=link(20, t=s, app_limited=True), payload_bytes=S, compute_s=TC, step=s))
        for s in range(1, 13)
    ]
    probes = [d for d in decisions if d.reason.startswith("probe")]
    assert len(probes) == 2 and {d.level for d in probes} == {heavy - 1}
    assert probes[0].step == 5
    assert all(d.level == heavy for d in decisions if not d.reason.startswith("probe"))
    assert p.level == heavy


def test_probe_interval_in_seconds_bounds_recovery_when_steps_are_slow() -> None:
    """Steps of 4 s: 20 steps between probes would be 80 s; `probe_interval_s` probes after 6 s."""
    p = netsense(probe_interval=20, probe_interval_s=6.0, probe_backoff_max=1)
    heavy = run(p, [20])[-1]
    assert heavy is not None and heavy > 0
    decisions = [
        p.choose(ChooseRequest(link=link(20, t=4.0 * s, app_limited=True), payload_bytes=S, compute_s=TC, step=s))
        for s in range(1, 9)
    ]
    probes = [d.step for d in decisions if d.reason.startswith("probe")]
    assert probes == [2, 4, 6, 8]  # >= 6 s and >= 2 steps since the last change or probe
    assert netsense(probe_interval=0, probe_interval_s=0).settings.probe_interval_s == 0
    with pytest.raises(ConfigError, match="probe_interval_s"):
        netsense(probe_interval_s=-1)


def test_probes_that_find_no_headroom_back_off_and_a_new_level_resets_them() -> None:
    """A steady app-limited path: each probe's sample leaves the law where it was, so the gaps
    double (5, 10, 20, then `probe_backoff_max` = 4 keeps 20); a drop moves the level heavier and
    the short cadence is back."""
    p = netsense(probe_interval=5, probe_interval_s=0, probe_share=0)
    heavy = run(p, [100])[-1]
    assert heavy is not None and heavy > 0
    steps = [
        s
        for s in range(1, 80)
        if p.choose(ChooseRequest(link=link(100, t=s, app_limited=True), payload_bytes=S, compute_s=TC, step=s)).reason.startswith("probe")
    ]
    assert [b - a for a, b in zip(steps, steps[1:])][:4] == [10, 20, 20, 20] and steps[0] == 5
    assert p.probes.backoff == 4 and p.level == heavy
    drop = p.choose(ChooseRequest(link=link(2, t=80.0), payload_bytes=S, compute_s=TC, step=80))
    assert drop.level is not None and drop.level > heavy
    p.choose(ChooseRequest(link=link(2, t=81.0, app_limited=True), payload_bytes=S, compute_s=TC, step=81))
    assert p.probes.backoff == 1
    with pytest.raises(ConfigError, match="probe_backoff_max"):
        netsense(probe_backoff_max=0)


def test_probe_is_big_enough_to_measure_and_skipped_after_a_slow_send() -> None:
    """From topk 0.1% of 45 MB (44 kB, app-limited however fast the link) a probe jumps to the
    heaviest level whose send is a bandwidth sample: >= min_sample_bytes, or long enough (8 min
    RTTs) at twice the current rate; none follows a send slower than predicted. (No reach rule here:
    `probe_unseen_s` = 0; its own tests are in test_policy_probe_reach.py.)"""
    p = netsense(probe_interval=2, probe_interval_s=0, probe_share=0, probe_unseen_s=0)
    heavy = run(p, [0.5])[-1]
    assert heavy == 6

    def probes(policy: NetsensePolicy, comm_s: float | None = None) -> list[int | None]:
        found = []
        for step in range(1, 4):
            lk = link(0.5, t=step, app_limited=True)
            d = policy.choose(ChooseRequest(link=lk, payload_bytes=S, compute_s=TC, step=step))
            wire = RTT + d.predicted_bytes / (0.5 * MBIT)
            policy.observe(SendReport(step=step, level=d.level, bytes_sent=d.predicted_bytes, comm_s=comm_s or wire))
            found += [d.level] if d.reason.startswith("probe") else []
        return found

    assert probes(p) == [5]  # 405 kB >= 256 kB
    q = netsense(probe_interval=2, probe_interval_s=0, probe_share=0, probe_unseen_s=0, min_sample_bytes=1 << 20)
    run(q, [0.5])
    assert probes(q) == [5]  # 405 kB < 1 MiB, but it lasts 6.5 s at 0.5 Mbit/s: >> 8 RTTs at 1 Mbit/s
    by_size = netsense(
        probe_interval=2, probe_interval_s=0, probe_share=0, probe_unseen_s=0, min_sample_bytes=1 << 20, min_sample_rtts=0
    )
    run(by_size, [0.5])
    assert probes(by_size) == [4]  # size alone: 3.8 MB, the first level over 1 MiB
    slow = netsense(probe_interval=2, probe_interval_s=0, probe_share=0, probe_unseen_s=0)
    run(slow, [0.5])
    assert probes(slow, comm_s=10.0) == []  # every send far slower than predicted


def test_queue_shrinks_bandwidth_only_on_a_saturated_path() -> None:
    """RTT inflation while app-limited (CPU contention on shared hosts) is not a competing flow."""
    base = run(netsense(), [160])[-1]
    assert run(netsense(), [160], queue=0.2)[-1] > base  # type: ignore[operator]
    p = netsense()
    run(p, [160])  # a trusted, saturated link sample sets the estimate
    d = p.choose(ChooseRequest(link=link(1, t=1.0, queue=0.2, app_limited=True), payload_bytes=S, compute_s=TC, step=1))
    assert d.bandwidth_Bps == pytest.approx(160 * MBIT) and d.level == base
    p.observe(SendReport(step=1, level=d.level, bytes_sent=S, comm_s=RTT + S / (160 * MBIT), app_limited=False))
    d = p.choose(ChooseRequest(link=link(160, t=2.0, queue=0.2), payload_bytes=S, compute_s=TC, step=2))
    assert d.bandwidth_Bps == pytest.approx(160 * MBIT * (RTT + 0.01) / (RTT + 0.2))


def test_long_short_sends_count_as_bandwidth_samples() -> None:
    """A 150 kB push that takes 30 ms over a 2 ms RTT spans 14 round trips: a rate, not a latency."""
    est = netsense().bandwidth
    est.add_app_sample(bytes_sent=150_000, comm_s=0.032, min_rtt_s=0.002, app_limited=False)
    assert est.update(link(None)) == pytest.approx(150_000 / 0.030)
    short = netsense().bandwidth  # 3 RTTs: ramp-up dominates, a lower bound only
    short.add_app_sample(bytes_sent=150_000, comm_s=0.008, min_rtt_s=0.002, app_limited=False)
    assert short.update(link(None)) is None
    tiny = netsense().bandwidth  # long but tiny (< min_sample_bytes / 16): latency, not rate
    tiny.add_app_sample(bytes_sent=8_000, comm_s=0.1, min_rtt_s=0.002, app_limited=False)
    assert tiny.update(link(None)) is None
    off = netsense(min_sample_rtts=0).bandwidth
    off.add_app_sample(bytes_sent=150_000, comm_s=0.032, min_rtt_s=0.002, app_limited=False)
    assert off.update(link(None)) is None


def test_probe_discovers_freed_capacity_from_application_samples() -> None:
    """No link bandwidth at all: only observe() feedback, as on a transport without a rate estimate."""
    p = netsense(probe_interval=4, k=2)
    levels = []
    for step in range(40):
        rate = 20 * MBIT if step < 10 else 400 * MBIT
        d = p.choose(ChooseRequest(link=link(None, t=step), payload_bytes=S, compute_s=TC, step=step))
        levels.append(d.level)
        comm_s = RTT + d.predicted_bytes / rate
        p.observe(SendReport(step=step, level=d.level, bytes_sent=d.predicted_bytes, comm_s=comm_s))
    assert levels[0] == 1  # bandwidth unknown: fp16, the fewest bytes that lose nothing measurable
    assert levels[1] == reference_level(20 * MBIT)
    assert levels[-1] == reference_level(400 * MBIT) < levels[1]
    # Each probe lifts the estimate by what one lighter level reveals: one level per probe + k steps.
    assert levels.index(levels[-1]) <= 10 + 3 * (4 + 2)


def test_overlap_keeps_lossless_when_comm_hides_under_compute() -> None:
    bw = 30e6  # T_fp32 = 1.5 s + rtt + cost < Tc = 2 s
    kw = dict(link=LinkState(0.0, bw, RTT, RTT), payload_bytes=S, compute_s=2.0, step=0)
    assert netsense().choose(ChooseRequest(overlap=True, **kw)).level == 0  # type: ignore[arg-type]
    serial = netsense().choose(ChooseRequest(overlap=False, **kw))  # type: ignore[arg-type]
    assert serial.level is not None and serial.level > 0
    assert serial.level == reference_level(bw, compute_s=2.0)


def test_unknown_bandwidth_stays_at_safe_level() -> None:
    """By default the fewest bytes that lose nothing measurable: fp16 (judged by its codec's worst
    case, not by LADDER's q = 1 placeholders, which would make it top-k); fp32 without a 16-bit
    level; a tie goes to the first."""
    d = netsense().choose(ChooseRequest(link=link(None), payload_bytes=S, compute_s=TC, step=0))
    assert (d.spec, d.reason, d.predicted_comm_s, d.predicted_step_s) == ("fp16", "unknown-bandwidth", None, None)
    unknown = ChooseRequest(link=link(None), payload_bytes=S, compute_s=TC, step=0)
    assert netsense(safe_level=0).choose(unknown).level == 0
    assert netsense(safe_level=2).choose(unknown).level == 2
    assert make_policy("netsense", Ladder.parse("fp32,qsgd:8,qsgd:4,topk:0.01")).choose(unknown).spec == "fp32"
    assert make_policy("netsense", Ladder.parse("fp32,bf16,fp16")).choose(unknown).spec == "bf16"


def test_unknown_bandwidth_level_follows_measured_progress_until_the_bandwidth_is_known() -> None:
    """A round that measures the 8-bit level lossless (q within progress_tol of 1) makes it the
    unknown-bandwidth level, half of fp16's bytes; one that measures it lossy does not; a lossy
    level never qualifies whatever it measures once the bandwidth was known (the law decides then)."""
    unknown = ChooseRequest(link=link(None), payload_bytes=S, compute_s=TC, step=0)
    q8, q4 = LADDER.find("qsgd:8"), LADDER.find("qsgd:4")
    p = netsense()
    assert p.choose(unknown).spec == "fp16"
    p.observe_progress(level=q8, progress=0.9999)
    assert (p.choose(unknown).spec, p.choose(unknown).reason) == ("qsgd:8", "unknown-bandwidth")
    p.observe_progress(level=q4, progress=0.9999)  # measured lossless too, and fewer bytes
    assert p.choose(unknown).spec == "qsgd:4"
    lossy = netsense()
    lossy.observe_progress(level=q8, progress=0.98)
    assert lossy.choose(unknown).spec == "fp16"
    assert netsense(safe_level=0).choose(unknown).spec == "fp32"  # a set level is kept
    known = netsense()
    d = known.choose(ChooseRequest(link=link(1000), payload_bytes=S, compute_s=TC, step=0))  # fast: the law's pick
    known.observe_progress(level=q8, progress=0.9999)
    assert known.choose(ChooseRequest(link=link(None), payload_bytes=S, compute_s=TC, step=1)).level == d.level


def test_warmup_caps_the_level() -> None:
    levels = run(netsense(warmup_steps=3, warmup_level=1), [20] * 5)
    assert levels == [1, 1, 1, 6, 6]


def test_queue_and_loss_shrink_bandwidth() -> None:
    base = run(netsense(), [160])[-1]
    queued = run(netsense(), [160], queue=0.2)[-1]
    lossy = run(netsense(), [160], loss=0.5)[-1]
    assert base is not None and queued is not None and lossy is not None
    assert queued > base and lossy >= base
    assert run(netsense(), [160], queue=0.005)[-1] == base  # within the tolerance


@settings(max_examples=60, deadline=None)
@given(
    bw_mbit=st.floats(min_value=1, max_value=100_000),
    compute_s=st.floats(min_value=0.0, max_value=10.0),
    overlap=st.booleans(),
)
def test_first_decision_is_the_law(bw_mbit: float, compute_s: float, overlap: bool) -> None:
    d = netsense().choose(
        ChooseRequest(link=link(bw_mbit), payload_bytes=S, compute_s=compute_s, overlap=overlap, step=0)
    )
    assert d.level == reference_level(bw_mbit * MBIT, compute_s=compute_s, overlap=overlap)


def test_netsense_monotone_in_bandwidth() -> None:
    levels = [run(netsense(), [mbit])[-1] for mbit in (1, 5, 20, 50, 100, 200, 500, 1000, 10_000)]
    assert levels == sorted(levels, reverse=True)  # type: ignore[type-var]


# --- netsenseml-paper -------------------------------------------------------------------------


def paper(**kw: object) -> PaperPolicy:
    p = make_policy("netsenseml-paper", LADDER, codec="policyfake", **kw)
    assert isinstance(p, PaperPolicy)
    return p


def test_paper_law_matches_hand_computation() -> None:
    p = paper()
    assert p.density == 0.75 and p.spec == "policyfake:0.75"
    # (time, bytes sent, comm s, rtt) -> window max bw, min rtt, BDP, and the branch taken.
    p.observe(SendReport(step=0, level=None, bytes_sent=1_000_000, comm_s=1.0, time_s=0.0, rtt_s=0.1))
    # bw 1e6, rtt 0.1: BDP 1e5; 1e6 > 9e4 -> r = 0.95 * 0.75
    assert p.density == pytest.approx(0.7125)
    p.observe(SendReport(step=1, level=None, bytes_sent=50_000, comm_s=0.5, time_s=1.0, rtt_s=0.2))
    # max bw 1e6, min rtt 0.1: BDP 1e5; 5e4 <= 9e4 -> r + 0.001
    assert p.density == pytest.approx(0.7135)
    p.observe(SendReport(step=2, level=None, bytes_sent=50_000, comm_s=0.1, time_s=7.0, rtt_s=0.05))
    # the 5 s window forgot t=0 and t=1: bw 5e5, rtt 0.05, BDP 2.5e4; 5e4 > 2.25e4 -> shrink
    assert p.density == pytest.approx(0.7135 * 0.95)
    assert p.bdp_bytes == pytest.approx(25_000)
    d = p.choose(ChooseRequest(link=link(100, t=7.0), payload_bytes=S, compute_s=TC, step=3))
    assert d.spec == "policyfake:0.678" and d.level is None and d.reason.startswith("paper")


def test_paper_law_bounds_and_rtt_from_link() -> None:
    p = paper(r_min=0.01)
    for step in range(200):  # every send is far above the BDP: r decays to r_min and stays
        p.choose(ChooseRequest(link=link(100, t=step * 0.1), payload_bytes=S, compute_s=TC, step=step))
        p.observe(SendReport(step=step, level=None, bytes_sent=S, comm_s=1.0))
    assert p.density == 0.01 and p.spec == "policyfake:0.01"
    q = paper(start=0.9995)
    # A send that takes under one RTT stays under the BDP (bytes < bw * rtt): r grows, capped at 1.
    q.observe(SendReport(step=0, level=None, bytes_sent=1000, comm_s=1.0, time_s=0.0, rtt_s=2.0))
    assert q.density == 1.0 and q.spec == "policyfake:1"


def test_paper_law_waits_for_a_bdp() -> None:
    p = paper()
    p.observe(SendReport(step=0, level=None, bytes_sent=S, comm_s=1.0, time_s=0.0))  # no RTT sample yet
    assert p.density == 0.75


def test_paper_policy_needs_its_sparsifier() -> None:
    with pytest.raises(ConfigError, match="nosuchsparse"):
        make_policy("netsenseml-paper", LADDER, codec="nosuchsparse")
    with pytest.raises(ConfigError, match="start"):
        paper(start=2.0)


# --- dc2 --------------------------------------------------------------------------------------


def test_dc2_monotone_in_delay() -> None:
    delays = [0.0, 0.004, 0.006, 0.01, 0.02, 0.04, 0.08, 0.2, 1.0, 10.0]
    levels = []
    for q in delays:
        p = make_policy("dc2", LADDER, alpha=1.0)
        assert isinstance(p, Dc2Policy)
        levels.append(p.choose(ChooseRequest(link=link(100, queue=q), payload_bytes=S, compute_s=TC, step=0)).level)
    assert levels == sorted(levels)  # type: ignore[type-var]
    assert levels[0] == 0 and levels[-1] == len(LADDER) - 1
    assert levels[3] == 1  # 10 ms against a 5 ms target: half the bytes -> fp16


def test_dc2_smooths_delay() -> None:
    p = make_policy("dc2", LADDER)
    assert p.choose(ChooseRequest(link=link(100, queue=0.0), payload_bytes=S, compute_s=TC, step=0)).level == 0
    queued = ChooseRequest(link=link(100, queue=0.02), payload_bytes=S, compute_s=TC, step=1)
    assert p.choose(queued).level == 1  # ewma 10 ms


# --- fixed baselines, registry, decision log --------------------------------------------------


def test_fixed_policies() -> None:
    d = make_policy("none", LADDER).choose(ChooseRequest(link=link(20), payload_bytes=S, compute_s=TC, step=0))
    assert (d.level, d.spec, d.reason) == (0, "fp32", "fixed")
    assert d.predicted_comm_s == pytest.approx(S / (20 * MBIT) + RTT + 0.001 * 45)
    at_20 = ChooseRequest(link=link(20), payload_bytes=S, compute_s=TC, step=0)
    assert make_policy("fp16", LADDER).choose(at_20).level == 1
    assert make_policy("fixed:qsgd:4", LADDER).choose(dataclasses.replace(at_20, link=link(None))).level == 3
    off = make_policy("fixed:policyfake:0.5", LADDER).choose(at_20)
    assert (off.level, off.spec, off.predicted_bytes) == (None, "policyfake:0.5", round(0.75 * S))
    assert make_policy("fixed:policyfake:0.5", LADDER).name == "fixed:policyfake:0.5"


@pytest.mark.parametrize(
    ("spec", "kwargs", "match"),
    [
        ("nosuch", {}, "unknown policy 'nosuch'"),
        ("", {}, "non-empty"),
        ("netsense", {"bogus": 1}, "no setting"),
        ("netsense", {"k": 0}, "k=0"),
        ("netsense", {"safe_level": 7}, "safe_level"),
        ("netsense", {"relax_eps": 0.5}, "relax_eps"),
        ("netsense:x", {}, "no argument"),
        ("dc2", {"target_delay_s": 0}, "target_delay_s"),
        ("fixed", {}, "needs a codec spec"),
        ("fixed:nosuchcodec", {}, "nosuchcodec"),
        ("none", {"eps": 0.1}, "no settings"),
        ("fp16:x", {}, "no argument"),
    ],
)
def test_make_policy_errors(spec: str, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make_policy(spec, LADDER, **kwargs)


def test_registry() -> None:
    assert {"none", "fp16", "fixed", "dc2", "netsenseml-paper", "netsense"} <= set(policy_names())
    register_policy("test-always-heaviest", lambda arg, ladder, **kw: make_policy(f"fixed:{ladder[-1].spec}", ladder))
    heaviest = make_policy("test-always-heaviest", LADDER)
    assert heaviest.choose(ChooseRequest(link=link(1), payload_bytes=S, compute_s=TC, step=0)).level == 6
    with pytest.raises(ValueError):
        register_policy("a:b", lambda arg, ladder, **kw: make_policy("none", ladder))
    assert make_policy("netsense", LADDER, eps=0.2, k=3, probe_interval=7).settings.k == 3  # type: ignore[attr-defined]


def test_decision_record_is_json_safe() -> None:
    p = netsense()
    lk = LinkState(12.5, None, None, None, app_limited=True, cwnd_bytes=12000, bytes_in_flight=0)
    d = p.choose(ChooseRequest(link=lk, payload_bytes=S, compute_s=TC, step=3))
    rec = d.to_record(lk, bytes_sent=S, comm_s=float("inf"))
    json.dumps(rec, allow_nan=False)
    assert rec["t"] == 12.5 and rec["step"] == 3 and rec["policy"] == "netsense"
    assert rec["level"] == 1 and rec["spec"] == "fp16" and rec["comm_s"] is None
    assert rec["predicted_comm_s"] is None and rec["bytes_sent"] == S and rec["app_limited"] is True
    d2 = p.choose(ChooseRequest(link=link(20, t=13.0), payload_bytes=S, compute_s=TC, step=4))
    rec2 = d2.to_record(link(20, t=13.0), bytes_sent=d2.predicted_bytes, comm_s=0.7)
    json.dumps(rec2, allow_nan=False)
    assert rec2["predicted_comm_s"] == d2.predicted_comm_s and rec2["bw_used_Bps"] == pytest.approx(20 * MBIT)
    assert set(rec2) >= {"queue_s", "loss_rate", "srtt_s", "min_rtt_s", "bw_Bps", "payload_bytes", "predicted_bytes"}


def test_bad_inputs_rejected() -> None:
    with pytest.raises(ValueError):
        netsense().choose(ChooseRequest(link=link(20), payload_bytes=-1, compute_s=TC, step=0))
    with pytest.raises(ValueError):
        netsense().choose(ChooseRequest(link=link(20), payload_bytes=S, compute_s=float("nan"), step=0))


def test_bandwidth_estimate_marks_small_and_latency_bound_sends() -> None:
    est = netsense(min_sample_bytes=1000).bandwidth
    est.add_app_sample(bytes_sent=500, comm_s=1.0, min_rtt_s=0.0, app_limited=False)  # small
    est.add_app_sample(bytes_sent=10_000, comm_s=0.03, min_rtt_s=0.02, app_limited=False)  # latency-bound
    assert est.update(link(None)) is None  # app-limited evidence alone never creates an estimate
    est.add_app_sample(bytes_sent=10_000, comm_s=1.02, min_rtt_s=0.02, app_limited=False)
    assert est.update(link(None)) == pytest.approx(10_000)  # trusted; the older lower bounds were used up
    est.add_app_sample(bytes_sent=10_000, comm_s=0.03, min_rtt_s=0.02, app_limited=True)
    assert est.update(link(None)) == pytest.approx(10_000 / 0.03)  # a fresh higher lower bound raises it
    assert est.update(link(0.08)) == pytest.approx(10_000)  # a link value that is not app-limited wins at once
    assert est.update(link(1, app_limited=True)) == pytest.approx(1 * MBIT)  # app-limited but higher: raises


# --- netsense, progress-aware (cost P_l / q_l) ------------------------------------------------

# q per level as measured on real gradients with error feedback (orders seen on digits-cnn/charlm):
# 16-bit and 8-bit lose nothing measurable, top-k 1% keeps a quarter of the update's energy.
Q = (1.0, 1.0, 0.99, 0.9, 0.5, 0.25, 0.08)
LADDER_Q = Ladder(tuple(dataclasses.replace(lv, progress=q) for lv, q in zip(LADDER, Q, strict=True)))


def aware(**settings: object) -> NetsensePolicy:
    p = make_policy("netsense", LADDER_Q, **settings)
    assert isinstance(p, NetsensePolicy)
    return p


def run_aware(policy: NetsensePolicy, bws: list[float], **kw: object) -> list[int | None]:
    out = []
    for step, bw in enumerate(bws):
        request = ChooseRequest(link=link(bw, t=float(step)), payload_bytes=S, compute_s=TC, step=step, **kw)  # type: ignore[arg-type]
        d = policy.choose(request)
        out.append(d.level)
    return out


def aware_reference(
    bw_Bps: float, *, compute_s: float = TC, eps: float = 0.1, tie: float = 0.01, passes: int = 1, share: float = 1.0,
    compressions: int | None = None,
) -> int:
    """The progress-aware law written out independently: cost P/q, least lossy within (1+eps)
    of the best cost, equal-q levels by predicted step (fp16 over fp32 when > 1% faster); the
    sends after the first at `share` times a pushed byte's time."""
    sends = 1 + (passes - 1) * share
    steps = [
        compute_s + sends * lv.ratio * S / bw_Bps + RTT + (lv.encode_s_per_mb + lv.decode_s_per_mb) * S / 1e6 for lv in LADDER_Q
    ]
    qs = [x ** (passes if compressions is None else compressions) for x in Q]
    cost = [p / qi for p, qi in zip(steps, qs)]
    ok = [i for i, c in enumerate(cost) if c <= (1 + eps) * min(cost)]
    top = [i for i in ok if qs[i] >= max(qs[j] for j in ok) - 0.005]
    return next(i for i in top if steps[i] <= (1 + tie) * min(steps[j] for j in top))


@pytest.mark.parametrize("mbit", [0.5, 1, 5, 20, 50, 100, 200, 400, 1000, 3000])
def test_progress_aware_first_decision_is_the_law(mbit: float) -> None:
    """A move (the first decision is one) goes within move_eps of the best cost, tie_eps scaled
    as move_eps / eps; eps is only the band the committed level may then drift within."""
    assert run_aware(aware(), [mbit])[0] == aware_reference(mbit * MBIT, eps=0.02, tie=0.01 * 0.02 / 0.1)


@pytest.mark.parametrize("mbit", [0.5, 5, 20, 100, 400, 3000])
def test_two_passes_price_each_level_at_q_squared_and_twice_its_bytes(mbit: float) -> None:
    """Against a gradient-domain PS the level goes up and comes back down: the law prices it at
    q ** 2 and two sends of its bytes (`Policy.passes`, `Policy.compressions`), the same law
    otherwise; forwarded pushes come back at their bytes but compressed once: q, two sends."""
    p = aware()
    p.passes = p.compressions = 2
    assert run_aware(p, [mbit])[0] == aware_reference(mbit * MBIT, eps=0.02, tie=0.01 * 0.02 / 0.1, passes=2)
    p = aware()
    p.passes = 2
    assert run_aware(p, [mbit])[0] == aware_reference(mbit * MBIT, eps=0.02, tie=0.01 * 0.02 / 0.1, passes=2, compressions=1)


def test_the_measured_return_share_prices_the_update_coming_back() -> None:
    """Against a gradient-domain PS whose updates reach every worker in 3x one copy's time (three
    workers' copies through one bottleneck), the PS's reports (`SendReport.returned`) set the share
    to 3 and the law prices the return at three pushed bytes a byte; with no report the share
    stays 1. Some bandwidth's pick then differs from the one-share law's."""
    mbit, min_rtt = 50, RTT

    def after_reports(share: float | None) -> tuple[NetsensePolicy, list[int | None]]:
        p = aware(probe_interval=0, probe_interval_s=0)
        p.passes = p.compressions = 2
        run_aware(p, [mbit])  # the first decision: a pushed byte's time is now known
        for step in range(3):
            returned = None if share is None else (1_000_000, min_rtt + share * 1_000_000 / (mbit * MBIT))
            p.observe(SendReport(step=step, level=p.level, bytes_sent=1000, comm_s=0.1, returned=returned))
        p.provisional()  # judge afresh, no hold
        return p, run_aware(p, [mbit])

    p, _ = after_reports(None)
    assert p.returns.value == 1.0
    p, _ = after_reports(3.0)
    assert p.returns.value == pytest.approx(3.0, rel=0.01)
    picks = {
        m: (aware_reference(m * MBIT, eps=0.02, tie=0.002, passes=2), aware_reference(m * MBIT, eps=0.02, tie=0.002, passes=2, share=3.0))
        for m in (1, 5, 20, 50, 100, 200, 400)
    }
    assert any(one != three for one, three in picks.values())
    for m in picks:
        q = aware(probe_interval=0, probe_interval_s=0)
        q.passes = q.compressions = 2
        q.returns.value = 3.0
        assert run_aware(q, [m])[0] == picks[m][1], m


def test_two_passes_move_the_pick_somewhere() -> None:
    def first(mbit: float, passes: int) -> int | None:
        p = aware()
        p.passes = p.compressions = passes
        return run_aware(p, [mbit])[0]

    picks = [(first(m, 1), first(m, 2)) for m in (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 400)]
    assert any(a != b for a, b in picks)


def test_progress_aware_prefers_light_levels_at_moderate_bandwidth() -> None:
    """Where the step-time law already sparsifies (top-k 1% at 50-100 Mbit/s, qsgd:4 at 400),
    time per unit of progress keeps 8/4-bit quantization: top-k's shorter step does not pay
    for the 4x slower progress of a step that carries a quarter of the update."""
    qsgd8, qsgd4, topk10 = 2, 3, 4
    for mbit, expect in ((400, qsgd8), (100, qsgd4), (50, qsgd4)):
        assert run_aware(aware(), [mbit])[0] == expect, mbit
        assert run_aware(aware(progress_aware=False), [mbit])[0] > expect, mbit  # type: ignore[operator]
    # Heavy sparsification only when the link is really slow (P dominated by r_l S / B).
    assert all(run_aware(aware(), [mbit])[0] >= 5 for mbit in (0.5, 1, 5, 10))  # type: ignore[operator]
    assert run_aware(aware(), [20])[0] <= topk10  # type: ignore[operator]


def test_progress_aware_monotone_in_bandwidth() -> None:
    levels = [run_aware(aware(), [mbit])[0] for mbit in (0.5, 1, 5, 20, 50, 100, 200, 500, 1000, 10_000)]
    assert levels == sorted(levels, reverse=True)  # type: ignore[type-var]


def test_progress_aware_moves_to_the_cheapest_and_holds_within_eps() -> None:
    """q already prices a level's loss, so a move goes to the least lossy level within move_eps of
    the best cost, not within eps: at 400 Mbit/s fp16 costs 2 % more per unit of progress than
    qsgd:8, which the old rule (move_eps = eps) gave away for fp16's q. eps stays the band a
    committed level may drift within: put at fp16, the policy keeps it (for good with
    settle_steps 0: the next test); with eps below fp16's 2 % it moves at once."""
    fp16, qsgd8 = 1, 2
    assert run_aware(aware(), [400])[0] == qsgd8
    assert run_aware(aware(move_eps=0.1), [400])[0] == fp16
    p = aware(probe_interval=0, probe_interval_s=0, settle_steps=0)
    run_aware(p, [400])
    p.level = fp16
    assert run_aware(p, [400] * 30) == [fp16] * 30
    p = aware(eps=0.015, move_eps=0.015, relax_eps=0.015, probe_interval=0, probe_interval_s=0)
    run_aware(p, [400])
    p.level = fp16
    # A gap this small (within `confirm_gap`) moves on the second decision in a row that sees it.
    assert run_aware(p, [400, 400])[1] in (qsgd8, qsgd8 + 1)  # type: ignore[operator]


def test_a_level_that_stays_the_strict_pick_within_the_dead_band_is_settled_on() -> None:
    """Within the dead band the committed level holds, unless one other level stays the pick with
    move_eps alone for settle_steps decisions in a row: put at fp16 at 400 Mbit/s, where qsgd:8
    costs 2 % less per unit of progress, the policy holds fp16 for 19 decisions, moves on the
    20th and holds qsgd:8 from then on. Where the strict pick alternates (400 / 500 Mbit/s: qsgd:8,
    then fp16 itself) the count restarts and fp16 holds. A settle undone within its count (the
    rate drops: heavier on the second decision) doubles the count for the next."""
    fp16, qsgd8 = 1, 2
    p = aware(probe_interval=0, probe_interval_s=0)
    run_aware(p, [400])
    p.level = fp16
    levels = run_aware(p, [400] * 30)
    assert levels == [fp16] * 19 + [qsgd8] * 11
    assert p.hold.settle_now == 20
    p = aware(probe_interval=0, probe_interval_s=0)
    run_aware(p, [400])
    p.level = fp16
    assert run_aware(p, [400, 500] * 30) == [fp16] * 60
    p = aware(probe_interval=0, probe_interval_s=0)
    run_aware(p, [400])
    p.level = fp16
    levels = run_aware(p, [400] * 20 + [150] * 2)  # the drop's gap is within confirm_gap: two decisions
    assert levels[20] == qsgd8 and levels[21] > qsgd8  # type: ignore[operator]
    assert p.hold.settle_now == 40


def test_a_settle_undone_by_a_settle_back_doubles_the_count() -> None:
    """The way back from a settle may be a settle itself, settle_steps decisions later: the move
    stays on probation for twice its count, so the ping-pong slows down. Three levels, q 1 / 0.9 /
    0.8, jitter 10 %: first C is 5 % cheaper than the committed B (the jitter band's pick stays B),
    then B 5 % cheaper than C, with A, 8 % dearer than B, the band's least-lossy pick: no relax."""
    hold = LevelHold(NetsensePolicySettings(), ("a", "b", "c"))
    q = [1.0, 0.9, 0.8]

    def decide(costs: list[float]) -> str:
        return hold.step([c * qi for c, qi in zip(costs, q)], q, bw=1e6)

    hold.level, hold.jitter = 1, 0.1
    reasons = [decide([1.20, 1.00, 0.95]) for _ in range(20)]
    assert hold.level == 2 and reasons[-1].startswith("settle: 20 decisions") and hold.settle_now == 20
    reasons = [decide([1.08, 1.00, 1.05]) for _ in range(20)]
    assert hold.level == 1 and reasons[-1].startswith("settle") and hold.settle_now == 40
    assert all(r.startswith("hold") for r in reasons[:-1])


def test_a_lighter_level_only_in_the_jitter_band_is_no_headroom() -> None:
    """The jitter band's "least lossy" preference says where a move goes, not that one is due: at
    400 Mbit/s with a 5 % step jitter fp16 (2 % dearer than the committed qsgd:8) is the move's
    pick, yet qsgd:8 holds; counted as headroom it relaxed to fp16 after k steps, and a settle
    back to qsgd:8 and that relax would alternate for good."""
    qsgd8 = 2
    p = aware(probe_interval=0, probe_interval_s=0)
    assert run_aware(p, [400]) == [qsgd8]
    p.hold.jitter = 0.05
    assert run_aware(p, [400] * 40) == [qsgd8] * 40


def test_a_jittery_step_widens_the_move_band_to_the_least_lossy_level() -> None:
    """At 400 Mbit/s qsgd:4 has the best cost, qsgd:8's is 1.6 % and fp16's 4 % above it. With
    steady measured steps a move goes within move_eps: qsgd:8. Once the steps vary by 4-8 %
    (compute +-8 %, plus the send), fp16's 4 % is inside the noise the costs were measured
    under, and the move (here a relax from top-k 10 % after k steps of headroom) goes to the least
    lossy level within that band, fp16. The band never passes eps: at 30 % jitter it is 10 %."""
    fp16, qsgd8, topk10 = 1, 2, 4

    def relax_after(jitter: float) -> int | None:
        p = aware(probe_interval=0, probe_interval_s=0)
        for step in range(12):
            tc = TC * (1 + (jitter if step % 2 else -jitter)) if step else TC
            d = p.choose(ChooseRequest(link=link(400, t=float(step)), payload_bytes=S, compute_s=tc, step=step))
            if step == 0:
                assert d.level == qsgd8  # no step measured yet: move_eps
            comm_s = d.predicted_bytes / (400 * MBIT) + RTT
            p.observe(SendReport(step=step, level=d.level, bytes_sent=d.predicted_bytes, comm_s=comm_s, app_limited=False))
        assert p.hold.jitter == 0.0 if jitter == 0 else 0.04 < p.hold.jitter <= jitter  # the send dilutes it
        p.level = topk10
        return run_aware(p, [400] * (p.k_now + 1))[-1]

    assert relax_after(0.0) == qsgd8
    assert relax_after(0.08) == fp16
    hold = aware().hold
    preds, q = [1.25, 0.9975, 0.9], [1.0, 0.95, 0.9]  # costs 1.25, 1.05, 1.0
    assert hold.target(preds, q) == 2
    hold.jitter = 0.3
    assert hold.target(preds, q) == 1  # capped at eps = 0.1; 0.3 would reach level 0


def test_the_committed_level_gives_way_to_an_equally_progressive_faster_one() -> None:
    """Within the eps band a level holds, except against a level of equal q that is faster by more
    than tie_eps: fp32 committed (after a probe, say) where fp16 is 4 % faster goes back at once."""
    fp32, fp16 = 0, 1
    p = aware(probe_interval=0, probe_interval_s=0)
    run_aware(p, [1500])
    assert p.level == fp16
    p.level = fp32
    assert run_aware(p, [1500])[0] == fp16


def test_progress_aware_no_flapping_on_a_noisy_link() -> None:
    assert_steady_on_jitter(lambda mbits: run_aware(aware(), mbits), (1, 10, 20, 50, 100, 200, 400, 1000))


def test_progress_aware_lossless_when_comm_hides_behind_compute() -> None:
    """Overlapped and hidden: every P_l equals Tc, so q decides, and of the q = 1 levels the least
    lossy stays (fp16 is not faster, only smaller)."""
    bw = 30e6  # T_fp32 = 1.5 s + rtt + cost < Tc = 2 s
    for step in range(20):
        lk = LinkState(float(step), bw, RTT, RTT)
        d = aware().choose(ChooseRequest(link=lk, payload_bytes=S, compute_s=2.0, overlap=True, step=step))
        assert d.level == 0 and d.progress == 1.0


def test_fp16_wins_over_fp32_whenever_bytes_matter() -> None:
    """fp16 loses no measurable progress, so it is chosen as soon as its predicted step is shorter by
    more than tie_eps (1%), far inside the law's eps (10%): the strong baseline is never given away.
    On a CPU-bound path the measured (not app-limited) delivery rate is lower, which widens the gap."""
    # 10 Gbit/s: halving 45 MB saves 18 ms of 569 ms (3%), fp16's cast costs 90 ms more: fp32.
    assert run_aware(aware(), [10_000])[0] == 0
    # 3 Gbit/s: saves 60 ms (> 1%) but the cast still costs 90 ms: fp32. 1 Gbit/s: saves 180 ms: fp16.
    assert run_aware(aware(), [3_000])[0] == 0
    assert run_aware(aware(), [1_000])[0] == 1
    # The step-time law kept fp32 while fp16 was within its 10% (the 100 Mbit/s digits-cnn case).
    small = dict(payload_bytes=153_000, compute_s=0.1)
    lk = link(100)  # 153 kB at 100 Mbit/s: P_fp32 = 132 ms, fp16 127 ms (4% faster), top-k 122 ms
    request = ChooseRequest(link=lk, step=0, **small)  # type: ignore[arg-type]
    assert make_policy("netsense", LADDER_Q, progress_aware=False).choose(request).level == 0
    assert aware().choose(ChooseRequest(link=lk, step=0, **small)).level == 1  # type: ignore[arg-type]


def test_measured_progress_moves_the_choice() -> None:
    """Priors are worst-case bounds; a measurement replaces a level's prior, later ones are EWMA'd."""
    ladder = Ladder.parse("fp32,fp16,qsgd:4,topk:0.01+fp16")
    p = make_policy("netsense", ladder, k=2)
    assert isinstance(p, NetsensePolicy)
    assert p.progress.values[2] < 0.5 and p.progress.values[3] == 0.01  # priors
    before = p.choose(ChooseRequest(link=link(20, t=0.0), payload_bytes=S, compute_s=TC, step=0))
    assert before.level == 1  # with worst-case priors nothing lossier than fp16 pays at 20 Mbit/s
    p.observe_progress(level=2, progress=0.97)
    p.observe_progress(level=3, progress=0.3)
    assert p.progress.values[2] == 0.97 and p.progress.measured[2]
    d = p.choose(ChooseRequest(link=link(20, t=1.0), payload_bytes=S, compute_s=TC, step=1))
    assert d.level == 2 and d.reason.startswith("heavier") and d.progress == 0.97  # 4-bit, not top-k
    d = p.choose(ChooseRequest(link=link(5, t=2.0), payload_bytes=S, compute_s=TC, step=2))
    assert d.level == 3 and d.progress == 0.3  # at 5 Mbit/s top-k's 4x shorter step pays for q = 0.3
    p.observe_progress(level=3, progress=0.01)  # EWMA: 0.3 * 0.01 + 0.7 * 0.3
    assert p.progress.values[3] == pytest.approx(0.213)
    for _ in range(8):
        p.observe_progress(level=3, progress=0.01)
    levels = [
        p.choose(ChooseRequest(link=link(5, t=3.0 + s), payload_bytes=S, compute_s=TC, step=3 + s)).level for s in range(4)
    ]
    assert levels[0] == 3 and levels[-1] == 2  # top-k measured poor: back to 4-bit after k steps of headroom
    rec = d.to_record(link(5), bytes_sent=1, comm_s=0.1)
    assert rec["progress"] == 0.3 and rec["progress_levels"] == [1.0, 1.0, 0.97, 0.3]
    # The log shows why: every level's P_l, and the chosen one's P / q is the cheapest.
    costs = [pl / q for pl, q in zip(rec["predicted_levels"], rec["progress_levels"])]
    assert len(costs) == 4 and costs[3] == min(costs) and rec["per_byte_s"] == 0.0 and rec["jitter"] == 0.0
    json.dumps(rec, allow_nan=False)
    assert p.progress_candidates(50) == [1, 2, 3] and p.progress_candidates(10) == []
    assert aware(progress_every=0).progress_candidates(0) == []
    assert aware(progress_aware=False).progress_candidates(0) == []


def test_progress_settings_validated() -> None:
    for bad in ({"tie_eps": -1}, {"progress_alpha": 0}, {"progress_floor": 0}, {"progress_every": -1}, {"progress_tol": 1}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            aware(**bad)


def bound_run(p: NetsensePolicy, rate_mbit: float, payload: int = 153_000, compute_s: float = 0.05) -> list[int | None]:
    """10 steps whose sends are all app-limited (small, latency-bound) on a `rate_mbit` path: the levels."""
    levels = []
    for step in range(10):
        d = p.choose(ChooseRequest(link=link(None, t=step), payload_bytes=payload, compute_s=compute_s, step=step))
        levels.append(d.level)
        sent = d.predicted_bytes
        p.observe(SendReport(step=step, level=d.level, bytes_sent=sent, comm_s=RTT + sent / (rate_mbit * MBIT), app_limited=True))
    assert d.reason.endswith("(lower bound B)") and p.bandwidth.value_Bps is None
    return levels


def test_lower_bound_picks_the_level_of_least_regret() -> None:
    """Every send app-limited (the PS's 150 kB updates at 100 Mbit/s), so the bandwidth never becomes
    known, only a lower bound. The law then picks among the levels whose cost is nearest the best
    over every rate from the bound up: at 100 Mbit/s qsgd:8 (q 0.99: 2.4 % over fp32's cost at
    unlimited bandwidth, where fp16 is 12.6 % over qsgd:8's at the bound); on a 0.5 Mbit/s path,
    where the bound is the rate, qsgd:4 (q 0.9: 11 % over at unlimited bandwidth; fp16 is 2.5x at
    the bound). Never a top-k level (q <= 0.5: 2x and more at unlimited bandwidth)."""
    assert bound_run(aware(probe_interval=0, probe_interval_s=0), 100) == [1] + [2] * 9
    assert bound_run(aware(probe_interval=0, probe_interval_s=0), 0.5) == [1] + [3] * 9
    # The step-time law keeps §5's rule: no estimate, no move.
    q = netsense()
    q.observe(SendReport(step=0, level=0, bytes_sent=153_000, comm_s=0.05, app_limited=True))
    unknown = ChooseRequest(link=link(None, t=1.0), payload_bytes=153_000, compute_s=0.05, step=1)
    assert q.choose(unknown).reason == "unknown-bandwidth"


def test_lower_bound_prefers_a_cheap_codec_that_loses_a_little_over_a_dear_lossless_one() -> None:
    """digits-cnn's case: 153 kB pushes, never a bandwidth sample. qsgd:4 counts as lossless (q
    0.999) but costs 4.9 ms of codec a step; powersgd:4 loses 3 % at 1.8 ms and half the bytes.
    Over every rate from the 10 Mbit/s bound up, powersgd:4 is at most 6 % over the best cost
    (fp32's at unlimited bandwidth), qsgd:4 17 % (over powersgd:4's at the bound): powersgd:4."""
    ladder = Ladder(
        (
            dataclasses.replace(_lv("fp32", 1.0, 0.0005, 0.0005, lossless=True), progress=1.0),
            dataclasses.replace(_lv("qsgd:4", 0.13, 0.03, 0.002), progress=0.999),
            dataclasses.replace(_lv("powersgd:4", 0.06, 0.01, 0.002), progress=0.97),
        )
    )
    p = make_policy("netsense", ladder, probe_interval=0, probe_interval_s=0)
    assert isinstance(p, NetsensePolicy)
    assert bound_run(p, 10, compute_s=0.03)[1:] == [2] * 9


def test_sends_slowed_in_rate_count_as_two_in_a_row_when_one_spans_two_rtts() -> None:
    """wide-mlp's 40 kB pushes in a 10 Mbit/s phase over a 22 ms path alternated 58 ms (36 ms past
    the first RTT: slow in rate, short of 2 RTTs) and 62-72 ms: a pair of them is two slow sends in a
    row, so the estimate falls to their rate. A send that is slow only because it is short (latency-
    bound, or under `SLOWED_MIN_S` past the RTT) does not pair with one host stall."""
    est = netsense().bandwidth
    assert est.update(link(45.7)) == pytest.approx(45.7 * MBIT)
    est.add_app_sample(bytes_sent=40_632, comm_s=0.058, min_rtt_s=0.022, app_limited=False)
    assert est.update(link(45.7, app_limited=True)) == pytest.approx(45.7 * MBIT)  # one: not yet
    est.add_app_sample(bytes_sent=40_632, comm_s=0.068, min_rtt_s=0.022, app_limited=False)
    assert est.update(link(45.7, app_limited=True)) == pytest.approx(40_632 / 0.046)
    stall = netsense().bandwidth
    stall.update(link(45.7))
    stall.add_app_sample(bytes_sent=40_632, comm_s=0.035, min_rtt_s=0.022, app_limited=False)  # 13 ms past the RTT
    stall.add_app_sample(bytes_sent=40_632, comm_s=0.080, min_rtt_s=0.022, app_limited=False)  # one stall
    assert stall.update(link(45.7, app_limited=True)) == pytest.approx(45.7 * MBIT)


def test_a_slowed_small_send_lowers_the_estimate_and_a_stale_link_value_cannot_restore_it() -> None:
    """76 kB pushes after a 100 -> 10 Mbit/s step: each is "small", but at 4-5x its predicted time,
    twice in a row, they show the path slowed. That lowers the estimate at once; the link's app-limited value (a max
    that only a trusted sample replaces) is then stale and may not raise it back; a higher one may."""
    est = netsense().bandwidth
    assert est.update(link(43.7)) == pytest.approx(43.7 * MBIT)  # trusted: the 100 Mbit/s phase
    est.add_app_sample(bytes_sent=76_000, comm_s=0.022, min_rtt_s=0.02, app_limited=False)  # fast, latency-bound
    assert est.update(link(43.7, app_limited=True)) == pytest.approx(43.7 * MBIT)
    est.add_app_sample(bytes_sent=76_000, comm_s=0.09, min_rtt_s=0.02, app_limited=False)  # 1.09 MB/s: slow...
    assert est.update(link(43.7, app_limited=True)) == pytest.approx(43.7 * MBIT)  # ...once: a host stall?
    est.add_app_sample(bytes_sent=76_000, comm_s=0.09, min_rtt_s=0.02, app_limited=False)  # twice: slowed
    assert est.update(link(43.7, app_limited=True)) == pytest.approx(76_000 / 0.07)
    est.add_app_sample(bytes_sent=76_000, comm_s=0.085, min_rtt_s=0.02, app_limited=False)  # small, not slowed now
    assert est.update(link(43.7, app_limited=True)) == pytest.approx(76_000 / 0.065)  # its rate bounds; 43.7 is stale
    assert est.update(link(60, app_limited=True)) == pytest.approx(60 * MBIT)  # a new, higher link value is news
    fresh = netsense().bandwidth  # no estimate yet: nothing to be slower than, a small send stays a bound
    for _ in range(2):
        fresh.add_app_sample(bytes_sent=76_000, comm_s=0.09, min_rtt_s=0.02, app_limited=False)
    assert fresh.update(link(None)) is None
    loopback = netsense().bandwidth  # 20 kB in 6 ms over a 1 ms RTT: the per-message cost, not the path
    loopback.update(link(600))
    for _ in range(3):
        loopback.add_app_sample(bytes_sent=20_000, comm_s=0.006, min_rtt_s=0.001, app_limited=False)
    assert loopback.update(link(600, app_limited=True)) == pytest.approx(600 * MBIT)
    told = netsense().bandwidth  # the caller's app-limited flag wins
    told.update(link(43.7))
    for _ in range(2):
        told.add_app_sample(bytes_sent=76_000, comm_s=0.09, min_rtt_s=0.02, app_limited=True)
    assert told.update(link(43.7, app_limited=True)) == pytest.approx(43.7 * MBIT)
