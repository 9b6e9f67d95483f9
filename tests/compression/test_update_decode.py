"""The worker's decode of an update that comes back at the level pushed (a gradient-domain PS):
timed per level on the run's steps and priced in every level's P_l (docs/POLICIES.md, "The
update's decode"). Figures shaped like two sites' digits-cnn (153 kB of fp32 per step)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

import netsense.compression  # noqa: F401  (registers the real codecs the ladder names)
from netsense.compression.policy import ChooseRequest, NetsensePolicy, make_policy
from netsense.compression.policy.costs import RETURN_RATIO_BOUNDS, CodecCosts
from netsense.compression.policy.decision import predict
from netsense.compression.policy.ladder import DEFAULT_LADDER, Ladder
from netsense.compression.policy.link import LinkState
from netsense.config import ConfigError
from netsense.worker.uplink import STARTUP_STEPS, UplinkController

S = 153_128
MB = 1e6
LADDER = Ladder.parse(DEFAULT_LADDER, numel=S // 4)
TK, P1, Q4 = (LADDER.find(s) for s in ("topk:0.01+fp16", "powersgd:1", "qsgd:4"))


def test_a_levels_update_decode_is_the_median_of_its_timings_and_unsent_levels_borrow_the_ratio() -> None:
    costs = CodecCosts(LADDER, window=3)
    assert costs.level(TK).return_decode_s_per_mb is None  # no update timed: not priced (a relay)
    assert costs.level(TK).return_s(S) == 0.0
    costs.observe(P1, dense_bytes=S, decode_s=0.0004)
    for seconds in (0.0007, 0.05, 0.0008):  # a stall among three: the median ignores it
        costs.observe_return(P1, dense_bytes=S, decode_s=seconds)
    assert costs.level(P1).return_s(S) == pytest.approx(0.0008)
    # top-k was never sent: its candidate decode times powersgd:1's ratio (0.0008 / 0.0004 = 2)
    costs.observe(TK, dense_bytes=S, decode_s=0.0006)
    assert costs.level(TK).return_s(S) == pytest.approx(0.0012)
    costs.observe_return(TK, dense_bytes=S, decode_s=0.0028)  # then its own timing
    assert costs.level(TK).return_s(S) == pytest.approx(0.0028)
    for bad in (-1.0, math.nan, math.inf):
        costs.observe_return(TK, dense_bytes=S, decode_s=bad)
    costs.observe_return(TK, dense_bytes=0, decode_s=1.0)
    costs.observe_return(99, dense_bytes=S, decode_s=1.0)
    assert costs.level(TK).return_s(S) == pytest.approx(0.0028)
    # the ratio unsent levels borrow is clamped: one level's 100x says more about the host than the codec
    lo, hi = RETURN_RATIO_BOUNDS
    costs = CodecCosts(LADDER)
    costs.observe(P1, dense_bytes=S, decode_s=0.0001)
    costs.observe_return(P1, dense_bytes=S, decode_s=0.01)
    assert costs.level(Q4).return_decode_s_per_mb == pytest.approx(hi * LADDER[Q4].decode_s_per_mb)
    costs.observe_return(P1, dense_bytes=S, decode_s=0.0)
    costs.observe_return(P1, dense_bytes=S, decode_s=0.0)
    assert costs.level(Q4).return_decode_s_per_mb == pytest.approx(lo * LADDER[Q4].decode_s_per_mb)


def test_the_update_decode_is_priced_only_where_the_update_comes_back_at_the_level() -> None:
    lv = CodecCosts(LADDER).level(TK)
    timed = CodecCosts(LADDER)
    timed.observe_return(TK, dense_bytes=S, decode_s=0.003)
    slow = timed.level(TK)
    kw = dict(payload_bytes=S, bandwidth_Bps=2.5e6, min_rtt_s=0.002, compute_s=0.005)
    for overlap in (False, True):
        one = predict(slow, overlap=overlap, **kw)  # type: ignore[arg-type]
        assert one == predict(lv, overlap=overlap, **kw)  # type: ignore[arg-type]
        two = predict(slow, overlap=overlap, wire_passes=2, **kw)  # type: ignore[arg-type]
        base = predict(lv, overlap=overlap, wire_passes=2, **kw)  # type: ignore[arg-type]
        assert two.comm_s == base.comm_s  # not part of the push: the redecide's yardstick stays
        # after the wait, so outside the overlap's max as well
        assert two.step_s - base.step_s == pytest.approx(0.003 - lv.return_s(S))


def pair_policy(passes: int, update_decode: dict[int, float]) -> NetsensePolicy:
    """Top-k 1 % and powersgd:1 as two sites' digits-cnn measured them: top-k sends a quarter of
    the bytes and encodes 1.8 ms slower, its q a little lower; every other level far behind."""
    p = make_policy("netsense", LADDER)
    assert isinstance(p, NetsensePolicy)
    p.passes = passes
    p.observe_ratio(level=TK, ratio=0.011)
    p.observe_ratio(level=P1, ratio=0.041)
    p.observe_costs(level=TK, dense_bytes=S, encode_s=0.0027, decode_s=0.0007)
    p.observe_costs(level=P1, dense_bytes=S, encode_s=0.0009, decode_s=0.0004)
    for level, lv in enumerate(LADDER):
        if not lv.lossless:
            p.observe_progress(level=level, progress={TK: 0.8, P1: 0.82}.get(level, 0.3))
    for level, seconds in update_decode.items():
        for _ in range(3):
            p.observe_return(level=level, dense_bytes=S, decode_s=seconds)
    return p


def first_choice(p: NetsensePolicy) -> str:
    lk = LinkState(time_s=0.0, bandwidth_Bps=2.5e6, min_rtt_s=0.002, srtt_s=0.002)
    return p.choose(ChooseRequest(link=lk, payload_bytes=S, compute_s=0.005, step=0)).spec


def test_a_slow_update_decode_prices_top_k_out_against_a_gradient_domain_ps() -> None:
    """Two sites' digits-cnn: top-k's fewer bytes looked 1-2 ms a step cheaper than powersgd:1, its
    forwarded update then took 2.8 ms to decode against 0.7 (the detours of docs/BENCHMARKS.md)."""
    assert first_choice(pair_policy(2, {})) == "topk:0.01+fp16"
    assert first_choice(pair_policy(2, {TK: 0.0028, P1: 0.0007})) == "powersgd:1"
    # with one pass the update comes back at the downlink's level, which the uplink does not choose
    one = [pair_policy(1, d) for d in ({}, {TK: 0.0028, P1: 0.0007})]
    assert first_choice(one[0]) == first_choice(one[1])


def test_the_uplink_feeds_a_steps_update_decode_to_its_level_from_the_second() -> None:
    policy = make_policy("netsense", Ladder.parse("fp32,fp16,qsgd:4"))
    assert isinstance(policy, NetsensePolicy)
    up = UplinkController(policy, payload_bytes=S)
    link = LinkState(0.0, None, 0.002, 0.002)
    for step in range(STARTUP_STEPS + 3):  # the safe level throughout (bandwidth unknown)
        policy.passes = 1 if step == STARTUP_STEPS + 2 else 2
        assert up.choose(link, started=float(step)).spec == "fp16"
        up.observe(bytes_sent=S, comm_s=0.003, update_decode_s=[0.5, 0.05, 0.0005, 0.9][step - STARTUP_STEPS + 1])
    # startup's step and the level's first decode (codec set-up) are skipped; one pass is no sample
    assert policy.costs.level(1).return_s(S) == pytest.approx(0.0005)
    policy.passes = 2
    up.choose(link, started=9.0)
    up.observe(bytes_sent=S, comm_s=0.003)  # not known (another worker's level came back): nothing
    assert policy.costs.level(1).return_s(S) == pytest.approx(0.0005)


def test_a_levels_update_decode_is_checked_and_survives_a_calibration_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    for bad in (-0.1, math.nan, math.inf):
        with pytest.raises(ConfigError, match="return_decode_s_per_mb"):
            replace(LADDER[TK], return_decode_s_per_mb=bad)
    timed = Ladder((replace(LADDER[TK], return_decode_s_per_mb=0.02), LADDER[P1]))
    timed.save(tmp_path / "ladder.json")
    back = Ladder.load(tmp_path / "ladder.json")
    assert back[0].return_decode_s_per_mb == 0.02 and back[1].return_decode_s_per_mb is None


def test_a_new_decode_figure_of_a_timed_level_moves_the_ratio_the_others_borrow() -> None:
    costs = CodecCosts(LADDER)
    costs.observe(P1, dense_bytes=S, decode_s=0.0004)
    costs.observe_return(P1, dense_bytes=S, decode_s=0.0008)
    costs.observe(TK, dense_bytes=S, decode_s=0.0006)
    assert costs.level(TK).return_s(S) == pytest.approx(0.0012)  # ratio 2, read and cached
    for seconds in (0.0004, 0.0008, 0.0008):  # powersgd:1's decode median 0.0004 -> 0.0006: ratio 4/3
        costs.observe(P1, dense_bytes=S, decode_s=seconds)
    assert costs.level(TK).return_s(S) == pytest.approx(0.0006 * 0.0008 / 0.0006)
