"""The netsense policy's start-up probe (`NetsensePolicy.probe_bytes` / `observe_probe`): a filler
send before the first decision gives that decision a bandwidth, so the first steps are chosen by
the law instead of going out at the unknown-bandwidth level (docs/POLICIES.md, `start_probe`)."""

from __future__ import annotations

import pytest

from netsense.compression.policy import ChooseRequest, NetsensePolicy, make_policy
from netsense.compression.policy.ladder import Ladder
from netsense.compression.policy.link import LinkState

S = 4_000_000  # dense fp32 payload, bytes
RTT = 0.02
PROBE = 256 * 1024


def policy(**settings: object) -> NetsensePolicy:
    p = make_policy("netsense", Ladder.default(), **settings)
    assert isinstance(p, NetsensePolicy)
    return p


def unknown(step: int = 0) -> ChooseRequest:
    """What the worker's uplink shows at its first steps: no bandwidth (worker/uplink.py masks it)."""
    link = LinkState(time_s=float(step), bandwidth_Bps=None, min_rtt_s=RTT, srtt_s=RTT)
    return ChooseRequest(link=link, payload_bytes=S, compute_s=0.0, step=step)


def test_the_probe_is_asked_for_once_before_the_first_decision() -> None:
    p = policy()
    assert p.probe_bytes(S) == PROBE == p.settings.min_sample_bytes
    assert p.probe_bytes(1000) == PROBE  # a payload under a sample's size: it never makes one itself
    assert policy(start_probe=False).probe_bytes(S) == 0
    p.choose(unknown())
    assert p.probe_bytes(S) == 0  # a decision was taken: too late to probe


def test_without_a_probe_the_first_steps_go_out_at_the_unknown_bandwidth_level() -> None:
    p = policy()
    d = p.choose(unknown())
    assert d.reason == "unknown-bandwidth" and d.bandwidth_Bps is None


def test_a_probe_makes_the_first_decision_a_law_decision_at_the_probed_rate() -> None:
    """2 Mbit/s measured (256 kB in ~1 s): 4 MB of fp32 would take 16 s a step, so the law goes to
    a heavy level at step 0 instead of sending the unknown-bandwidth level's ~1 MB."""
    p = policy()
    rate = 250_000.0  # bytes/s
    p.observe_probe(bytes_sent=PROBE, comm_s=PROBE / rate + RTT, min_rtt_s=RTT)
    d = p.choose(unknown())
    assert d.reason != "unknown-bandwidth"
    assert d.bandwidth_Bps == pytest.approx(rate, rel=1e-6)
    assert d.predicted_bytes < 0.05 * S
    slow = policy()
    assert slow.choose(unknown()).predicted_bytes > 0.2 * S  # what the probe saved: qsgd:8 or fp16


def test_a_latency_bound_probe_is_only_a_lower_bound() -> None:
    """A path whose bandwidth-delay product exceeds the probe (it took under two RTTs) measured
    latency: the rate it shows is a floor, so only levels that lose nothing may be chosen on it."""
    p = policy()
    p.observe_probe(bytes_sent=PROBE, comm_s=1.5 * RTT, min_rtt_s=RTT)
    d = p.choose(unknown())
    assert "lower bound" in d.reason
    q = p._lossless_q()
    assert d.level is not None and q[d.level] >= 1 - p.settings.progress_tol
