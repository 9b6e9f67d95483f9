"""Padded probes (`probe_pad`): where the sender can pad a send (`ChooseRequest.pad_ok`, a worker's
uplink), netsense probes by sending the committed level with filler up to a bandwidth sample's
size instead of a lighter level (docs/POLICIES.md, "Probes")."""

from __future__ import annotations

import pytest

from probe_ladder import LADDER, MBIT, RTT, S, TC
from netsense.compression.policy import ChooseRequest, NetsensePolicy, SendReport, make_policy
from netsense.compression.policy.link import LinkState
from netsense.compression.policy.netsense import PADDED

SAMPLE = 256 * 1024  # min_sample_bytes: at 20 Mbit/s and 20 ms, 8 RTTs at twice the rate is more


def policy(**settings: object) -> NetsensePolicy:
    settings.setdefault("progress_aware", False)
    settings.setdefault("probe_pad", True)
    p = make_policy("netsense", LADDER, probe_interval=5, probe_interval_s=0, probe_backoff_max=1, probe_unseen_s=0, **settings)
    assert isinstance(p, NetsensePolicy)
    return p


def request(step: int, *, pad_ok: bool, app_limited: bool = True, mbit: float = 20) -> ChooseRequest:
    link = LinkState(time_s=float(step), bandwidth_Bps=mbit * MBIT, min_rtt_s=RTT, srtt_s=RTT, app_limited=app_limited)
    return ChooseRequest(link=link, payload_bytes=S, compute_s=TC, step=step, pad_ok=pad_ok)


def first_probe(p: NetsensePolicy, *, pad_ok: bool):  # type: ignore[no-untyped-def]
    committed = p.choose(request(0, pad_ok=pad_ok, app_limited=False))
    for step in range(1, 12):
        d = p.choose(request(step, pad_ok=pad_ok))
        if d.reason.startswith("probe"):
            return committed, d
        assert d.level == committed.level and d.pad_bytes == 0
    raise AssertionError("no probe in 11 app-limited steps")


def test_a_probe_pads_the_committed_level_to_a_bandwidth_sample() -> None:
    committed, probe = first_probe(policy(), pad_ok=True)
    assert committed.spec == "topk:0.01+fp16" and committed.predicted_bytes < SAMPLE
    assert probe.level == committed.level and probe.spec == committed.spec
    assert probe.pad_bytes == SAMPLE - probe.predicted_bytes
    assert probe.reason == f"probe: topk:0.01+fp16 padded by {probe.pad_bytes} B"


def test_without_padding_a_probe_sends_a_lighter_level() -> None:
    """A sender that cannot pad (`pad_ok` false), or `probe_pad` off (the default): the old probe, the
    heaviest lighter level that carries a sample's bytes (qsgd:4, 607 kB)."""
    default = make_policy("netsense", LADDER, progress_aware=False, probe_interval=5, probe_interval_s=0, probe_backoff_max=1, probe_unseen_s=0)
    assert isinstance(default, NetsensePolicy)
    for p, pad_ok in ((policy(), False), (policy(probe_pad=False), True), (default, True)):
        committed, probe = first_probe(p, pad_ok=pad_ok)
        assert probe.level == 3 and probe.pad_bytes == 0 and committed.level == 4
        assert probe.reason == "probe: 1 lighter than topk:0.01+fp16"


def test_a_level_already_big_enough_still_probes_lighter() -> None:
    """Filler cannot make a send that already carries a sample's bytes measure more."""
    p = policy(min_sample_bytes=16 * 1024)
    committed, probe = first_probe(p, pad_ok=True)
    assert committed.predicted_bytes >= 16 * 1024 and probe.level == committed.level - 1 and probe.pad_bytes == 0


def test_a_padded_send_is_a_bandwidth_sample_and_its_own_transport_point() -> None:
    """The padded send ran at 80 Mbit/s where the small pushes only bounded the rate: the estimate
    rises to it; the send's size does not land in the level's point."""
    p = policy()
    committed, probe = first_probe(p, pad_ok=True)
    sent = probe.predicted_bytes + probe.pad_bytes
    p.observe(SendReport(step=probe.step, level=probe.level, bytes_sent=sent, comm_s=RTT + sent / (80 * MBIT), pad_bytes=probe.pad_bytes))
    assert p.transport.count(PADDED) == 1 and p.transport.count(committed.level) == 0  # type: ignore[arg-type]
    after = p.choose(request(probe.step + 1, pad_ok=True))
    assert p.bandwidth.value_Bps == pytest.approx(80 * MBIT, rel=0.01)
    assert after.bandwidth_Bps == pytest.approx(80 * MBIT, rel=0.01)


def test_the_padded_send_is_predicted_with_its_filler() -> None:
    """A padded send as fast as predicted is not a slow send (which would stop the next probe)."""
    p = policy()
    _, probe = first_probe(p, pad_ok=True)
    sent = probe.predicted_bytes + probe.pad_bytes
    p.observe(SendReport(step=probe.step, level=probe.level, bytes_sent=sent, comm_s=RTT + sent / (20 * MBIT), pad_bytes=probe.pad_bytes))
    assert not p._last_send_slow  # noqa: SLF001
    record = probe.to_record(request(probe.step, pad_ok=True).link)
    assert record["pad_bytes"] == probe.pad_bytes
