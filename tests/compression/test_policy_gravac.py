"""gravac: GraVAC's compression-gain rule on synthetic gain and step-time streams (docs/POLICIES.md)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch

from netsense.compression import DEFAULT_LADDER, Ladder, make_policy
from netsense.compression.policy import ChooseRequest, Decision, GravacPolicy, SendReport
from netsense.compression.policy.gravac import Smoothed, family
from netsense.compression.policy.link import LinkState
from netsense.compression.policy.loop import PolicyLoop
from netsense.errors import ConfigError

LADDER = Ladder.parse(DEFAULT_LADDER)
FAMILY = family(0.1, 0.001, 0.5)


def _kept(spec: str) -> float:
    """The fraction a spec sends: top-k's ratio, 1 for anything dense."""
    return float(spec.split(":")[1].split("+")[0]) if spec.startswith("topk:") else 1.0


def _comm_by_size(spec: str) -> float:
    """A bandwidth-bound link: the push takes 10 s per dense payload."""
    return 10.0 * _kept(spec)


def _choose(policy: GravacPolicy, step: int) -> Decision:
    link = LinkState(time_s=float(step), bandwidth_Bps=2.5e6, min_rtt_s=0.02, srtt_s=0.02)
    return policy.choose(ChooseRequest(link=link, payload_bytes=4 << 20, compute_s=0.01, step=step))


def _run(
    q: Callable[[str], float], steps: int, comm: Callable[[str], float] = _comm_by_size, **settings: object
) -> tuple[GravacPolicy, list[str], list[int]]:
    """Each step: choose, report the send (compute 0.01 s), then feed q of the levels the policy
    asks for, as the worker's candidate round does; returns the specs sent and the factor per step."""
    policy = make_policy("gravac", LADDER, **settings)
    assert isinstance(policy, GravacPolicy)
    specs, factors = [], []
    for step in range(steps):
        d = _choose(policy, step)
        specs.append(d.spec)
        factors.append(policy.current)
        policy.observe(SendReport(step=step, level=d.level, bytes_sent=1, comm_s=comm(d.spec)))
        for level in policy.progress_candidates(step):
            policy.observe_progress(level=level, progress=q(policy.ladder[level].spec))
    return policy, specs, factors


def test_gains_above_epsilon_climb_to_the_most_compressed_factor() -> None:
    # Every factor keeps all the gain and each is faster than the last by far more than omega.
    policy, specs, _ = _run(lambda spec: 1.0, 40, window=4, interval=4)
    assert specs[:4] == ["topk:0.1+fp16"] * 4  # warm-up at theta_min
    assert policy.current == len(policy.ladder) - 1 and policy.searching
    assert specs[-5:] == ["topk:0.001+fp16"] * 5


def test_factor_moves_at_window_then_every_interval() -> None:
    _, specs, factors = _run(lambda spec: 1.0, 14, window=4, interval=3)
    assert factors[:4] == [1] * 4  # warm-up
    assert factors[4:] == [2, 2, 2, 3, 3, 3, 4, 4, 4, 5]
    # A new factor is measured at its first step (theta_min goes out) and sent from the next.
    assert specs[4] == "topk:0.1+fp16" and specs[5:7] == ["topk:0.05+fp16"] * 2
    assert specs[7] == "topk:0.1+fp16" and specs[8] == "topk:0.025+fp16"


def test_a_factor_below_epsilon_falls_back_to_the_first() -> None:
    # Gain 1 down to 1.25% kept; sqrt(0.25) = 0.5 < 0.75 beyond it.
    _, specs, factors = _run(lambda spec: 1.0 if _kept(spec) >= 0.0125 else 0.25, 40, window=4, interval=4)
    assert factors[12:16] == [4] * 4 and specs[13:16] == ["topk:0.0125+fp16"] * 3
    assert factors[16:20] == [5] * 4 and specs[17:20] == ["topk:0.1+fp16"] * 3  # theta_min, not factor 4
    assert specs[-5:] == ["topk:0.1+fp16"] * 5


def test_no_gain_anywhere_sends_dense() -> None:
    _, specs, _ = _run(lambda spec: 0.25, 20, window=4, interval=4)
    assert specs[:4] == ["topk:0.1+fp16"] * 4  # the warm-up sends theta_min whatever its gain
    assert set(specs[4:]) == {"fp32"}


def test_epsilon_reads_the_square_root_of_q() -> None:
    # q = 0.57 is a norm ratio of 0.755 >= epsilon = 0.75: compressed; q = 0.55 (0.742): dense.
    _, specs, _ = _run(lambda spec: 0.57, 10, window=4, interval=100)
    assert specs[4:] == ["topk:0.1+fp16"] + ["topk:0.05+fp16"] * 5
    _, specs, _ = _run(lambda spec: 0.55, 10, window=4, interval=100)
    assert specs[4:] == ["fp32"] * 6


def test_close_throughputs_stop_the_search_at_the_more_compressed() -> None:
    # A fast link: every send takes the same time, so factors 1 and 2 tie (within omega) at the first check.
    policy, specs, factors = _run(lambda spec: 1.0, 30, comm=lambda spec: 0.1, window=4, interval=4)
    assert not policy.searching
    assert factors[8:] == [2] * 22 and specs[-1] == "topk:0.05+fp16"
    assert "settled" in _choose(policy, 30).reason


def test_no_gains_hold_the_first_factor() -> None:
    policy = make_policy("gravac", LADDER, window=2, interval=2)
    assert isinstance(policy, GravacPolicy)
    assert {_choose(policy, t).spec for t in range(50)} == {"topk:0.1+fp16"}


def test_bad_figures_are_dropped() -> None:
    policy = make_policy("gravac", LADDER)
    assert isinstance(policy, GravacPolicy)
    for bad in (float("nan"), float("inf"), -1.0):
        policy.observe_progress(level=1, progress=bad)
    policy.observe_progress(level=99, progress=1.0)
    policy.observe_progress(level=0, progress=1.0)  # the dense level's gain is 1 by definition
    assert all(len(g) == 0 for g in policy.gains)
    policy.observe_progress(level=1, progress=1.0)
    for level, comm in ((1, float("nan")), (1, float("inf")), (1, -1.0), (None, 0.1), (99, 0.1), (2, 0.1)):
        policy.observe(SendReport(step=0, level=level, bytes_sent=1, comm_s=comm))  # level 2: no gain yet
    assert all(len(t) == 0 for t in policy.throughputs)


def test_smoothing_weights_the_newest_figure_most() -> None:
    s = Smoothed(window=2, alpha=0.5)
    assert s.value is None
    s.add(1.0)
    s.add(0.0)
    assert s.value == pytest.approx(0.5 / 1.5)  # weights 1 (newest) and 0.5
    s.add(0.0)  # the window drops the 1.0
    assert s.value == 0.0


def test_the_default_family_and_a_given_one() -> None:
    thetas = ["0.1", "0.05", "0.025", "0.0125", "0.00625", "0.00313", "0.00156", "0.001"]
    assert FAMILY == [f"topk:{t}+fp16" for t in thetas]  # halving from 10%, stopped at 0.1%
    assert make_policy("gravac", LADDER).ladder.specs == ("fp32", *FAMILY)
    calibrated = Ladder((*LADDER.levels[:-1], replace(LADDER[len(LADDER) - 1], ratio=0.5, calibrated=True)))
    policy = make_policy("gravac", calibrated, levels="powersgd:2, topk:0.001+fp16", dense="fp16")
    assert policy.ladder.specs == ("fp16", "powersgd:2", "topk:0.001+fp16")
    assert policy.ladder[2].ratio == 0.5  # the configured ladder's calibration carries over


def test_candidate_rounds_feed_the_gain() -> None:
    # The worker's path (`PolicyLoop.measure`): top-k 10% keeps the 100 entries of 3 among 900 of 1,
    # half the energy, so the gain (a norm ratio) is sqrt(1/2).
    policy = make_policy("gravac", LADDER)
    assert isinstance(policy, GravacPolicy)
    g = torch.ones(1000)
    g[:100] = 3.0
    PolicyLoop(policy, direction="up").measure(policy.progress_candidates(0), [g])
    assert policy.gain(1) == pytest.approx(math.sqrt(0.5), rel=1e-3)


def test_the_round_norms_make_the_gain_theirs() -> None:
    """Their gain is ||C(g + r)|| / ||g||: q on g + r gives ||C(g + r)|| / ||g + r||, and the round's
    ||g + r|| / ||g|| scales it. A residual that grew g + r's norm by 1.5x lifts q = 0.5 (0.707,
    under epsilon) to 1.06; q = 0.55 with the ratio 1 stays dense, with 1.2 it sends the factor."""
    policy = make_policy("gravac", LADDER)
    assert isinstance(policy, GravacPolicy) and policy.wants_round_norms
    policy.observe_round_norms(step=0, gradient_norm=2.0, input_norm=3.0)
    policy.observe_progress(level=1, progress=0.5)
    assert policy.gain(1) == pytest.approx(1.5 * math.sqrt(0.5))
    for bad in ((0.0, 1.0), (float("nan"), 1.0), (1.0, float("inf")), (1.0, -1.0)):
        policy.observe_round_norms(step=1, gradient_norm=bad[0], input_norm=bad[1])
    assert policy.inflation == 1.5  # bad figures leave the last ratio

    def inflated(ratio: float) -> list[str]:
        p = make_policy("gravac", LADDER, window=4, interval=100)
        assert isinstance(p, GravacPolicy)
        out = []
        for step in range(10):
            out.append(_choose(p, step).spec)
            p.observe_round_norms(step=step, gradient_norm=1.0, input_norm=ratio)
            for level in p.progress_candidates(step):
                p.observe_progress(level=level, progress=0.55)
        return out

    assert inflated(1.0)[4:] == ["fp32"] * 6
    assert inflated(1.2)[4:] == ["topk:0.1+fp16"] + ["topk:0.05+fp16"] * 5


@pytest.mark.parametrize(
    "settings",
    [
        {"theta_min": 0.0}, {"theta_min": 1.5}, {"theta_max": 0.2}, {"theta_max": 0.0}, {"step": 1.0},
        {"step": 0.0}, {"epsilon": 0.0}, {"epsilon": 1.5}, {"omega": 0.0}, {"window": 0}, {"window": 2.5},
        {"alpha": 0.0}, {"interval": 0}, {"levels": "nosuch:1"}, {"levels": "fp32"}, {"levels": "topk:0.1,"},
        {"dense": ""}, {"nosuch": 1},
    ],
)  # fmt: skip
def test_bad_settings_are_config_errors(settings: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        make_policy("gravac", LADDER, **settings)
