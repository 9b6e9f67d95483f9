"""A relay runs the job's uplink policy on its push upstream, as a worker does: each step's level is
the policy's, the push is encoded at it under error feedback, and what it cost is fed back."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from netsense.compression.policy import Decision, Policy, make_policy, register_policy
from netsense.compression.policy.decision import ChooseRequest, SendReport
from netsense.compression.policy.ladder import Ladder
from netsense.errors import ConfigError
from netsense.relay import RelaySettings
from netsense.transport.tls import CertPaths

from .relayhelp import MODEL_BYTES, Worker, connect, digits, params_of, relay, run_workers, start_ps

STEPS = 6


class Alternate(Policy):
    """fp32 on even steps, qsgd:4 on odd ones; asks for a candidate round at step 0; records what
    it is told."""

    seen: list[Alternate] = []

    def __init__(self, ladder: Ladder) -> None:
        super().__init__(ladder, name="alternate")
        self.requests: list[ChooseRequest] = []
        self.reports: list[SendReport] = []
        self.progress: list[tuple[int, float]] = []
        Alternate.seen.append(self)

    def choose(self, request: ChooseRequest) -> Decision:
        self.requests.append(request)
        index, level = self.level_of("qsgd:4" if request.step % 2 else "fp32", request.payload_bytes)
        return self._decision(request, level_index=index, level=level, reason="test", bandwidth_Bps=request.link.bandwidth_Bps)

    def observe(self, report: SendReport) -> None:
        self.reports.append(report)

    def progress_candidates(self, step: int) -> list[int]:
        return [self.level_of("qsgd:4", 1)[0] or 0] if step == 0 else []

    def observe_progress(self, *, level: int, progress: float) -> None:
        self.progress.append((level, progress))


register_policy("test-alternate", lambda arg, ladder, /, **kw: Alternate(ladder))


def test_the_relay_pushes_at_the_policys_level_and_feeds_back_the_cost(certs: CertPaths, tmp_path: Path) -> None:
    Alternate.seen.clear()
    log = tmp_path / "relay.jsonl"
    ps = start_ps(certs)
    site = relay(certs, ps.port, site_workers=2, upstream_policy="test-alternate", ladder="fp32,qsgd:4", decision_log=str(log))
    try:
        workers = [Worker(r, 2, connect(certs, site.ports[0]), STEPS, digits()) for r in range(2)]
        run_workers(workers)
        assert ps.call(lambda: ps.server.store.version) == STEPS
        got = params_of(ps)
        levels = site.net.run(_levels(site))
    finally:
        site.stop()
        ps.stop()
    policy = Alternate.seen[-1]  # the first one built only checked the spec
    assert [r.step for r in policy.requests] == list(range(STEPS))
    assert all(r.payload_bytes == MODEL_BYTES for r in policy.requests)
    assert policy.requests[-1].compute_s > 0  # the site's step between two pushes
    # Step 0 runs in slow start and is no bandwidth evidence (as a worker's); the rest are fed back.
    sent = {r.step: r.bytes_sent for r in policy.reports}
    assert sorted(sent) == list(range(1, STEPS))
    assert all(r.comm_s > 0 for r in policy.reports)
    # Each push's ACK reports the update before it (complete once this push applied the next).
    assert all(r.returned is not None and r.returned[0] > 0 and r.returned[1] >= 0 for r in policy.reports)
    for step, n in sent.items():  # qsgd:4 is ~1/8 of the model, fp32 all of it
        assert (0.9 * MODEL_BYTES < n < 1.1 * MODEL_BYTES) if step % 2 == 0 else (n < 0.2 * MODEL_BYTES), (step, n)
    assert policy.progress and all(0 < q <= 1 for _, q in policy.progress)
    assert levels == {"fp32": 3, "qsgd:4": 3}
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(x["step"], x["spec"], x["worker_id"]) for x in lines] == [
        (s, "qsgd:4" if s % 2 else "fp32", "relay-a") for s in range(STEPS)]  # fmt: skip
    for key, value in got.items():  # the lossy steps' error is carried, not lost: training moved on
        assert torch.isfinite(value).all(), key


@pytest.mark.parametrize(("name", "weighed"), [("adam", True), ("sgd", False)])
def test_the_relays_windows_weigh_by_the_jobs_optimizer_as_a_workers_do(
    certs: CertPaths, monkeypatch: pytest.MonkeyPatch, name: str, weighed: bool
) -> None:
    """The relay learns the optimizer from its site's INIT, before its first push (docs/POLICIES.md,
    "Windowed progress": Adam's metric for an Adam job)."""
    from . import relayhelp

    monkeypatch.setattr(relayhelp, "OPTIMIZER", {"name": name, "lr": 0.01})
    ps = start_ps(certs)
    site = relay(certs, ps.port, site_workers=2, upstream_policy="test-alternate", ladder="fp32,qsgd:4")
    try:
        run_workers([Worker(r, 2, connect(certs, site.ports[0]), 2, digits()) for r in range(2)])
        adaptive = site.relay.shards[0].upstream.adaptive
    finally:
        site.stop()
        ps.stop()
    assert adaptive.precondition is weighed and adaptive.uplink.loop.precondition is weighed


async def _levels(site: Any) -> dict[str, int]:
    return site.relay.levels


def test_a_bad_upstream_policy_fails_before_any_connection(certs: CertPaths) -> None:
    with pytest.raises(ConfigError, match="unknown policy 'bogus'"):
        RelaySettings(upstream=(connect(certs, 1),), upstream_policy="bogus")


def test_encode_seconds_of_a_push_that_never_reached_observe_are_not_the_next_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """A push that failed before `observe` left its keys' encode seconds in the encoder; the next
    step's observed cost is its own encode alone (each key's encode is 1 s on this fake clock)."""
    import netsense.worker.encoding as encoding
    from netsense.compression.policy import make_policy
    from netsense.relay.adaptive import AdaptiveUpstream

    ticks = iter(range(1000))
    monkeypatch.setattr(encoding, "codec_clock", lambda: lambda: float(next(ticks)))
    upstream = AdaptiveUpstream(make_policy("fp16", Ladder.parse("fp32,fp16")))
    grads = {"w": torch.randn(8, 8), "b": torch.randn(8)}
    link = upstream.read_link(None, grads)
    upstream.encode(grads, link, 0.0)  # its push failed: no `observe`
    _, payloads = upstream.encode(grads, link, 0.0)
    seen: dict[str, Any] = {}
    assert upstream.uplink is not None
    monkeypatch.setattr(upstream.uplink, "observe", lambda **fields: seen.update(fields))
    upstream.observe(payloads, push_s=0.1, encode_s=0.1, wire_s=0.1, step=1)
    assert seen["codec_s"] == 2.0


def test_the_relays_push_is_priced_from_its_own_error_feedback_too() -> None:
    """A relay's adaptive push keeps the sent level's window as a worker's does (netsense only),
    over the site's keys, and hands the policy its q_W every W steps at one level."""
    from netsense.compression.policy.netsense import NetsensePolicy
    from netsense.relay.adaptive import AdaptiveUpstream

    fixed = AdaptiveUpstream(make_policy("fp16", Ladder.parse("fp32,fp16")))
    fixed.read_link(None, {"w": torch.zeros(8, 8)})
    assert fixed.encoder is not None and fixed.encoder.sent_window is None
    ladder = Ladder.parse("fp32,powersgd:1")
    policy = make_policy("netsense", ladder)
    assert isinstance(policy, NetsensePolicy)
    got: list[tuple[int, float]] = []
    policy.observe_sent_window = lambda *, level, progress: got.append((level, progress))  # type: ignore[method-assign]
    upstream = AdaptiveUpstream(policy)
    gen = torch.Generator().manual_seed(0)
    grads = {"w": torch.randn(16, 16, generator=gen), "b": torch.randn(16, generator=gen)}
    upstream.read_link(None, grads)
    assert upstream.encoder is not None and upstream.encoder.sent_window is not None
    decision = Decision(
        level=1, spec="powersgd:1", predicted_comm_s=None, predicted_step_s=None, reason="test", step=0,
        payload_bytes=0, predicted_bytes=0, compute_s=0.0, overlap=False,
    )
    for _ in range(16):
        upstream.encoder.grads = {k: torch.randn(v.shape, generator=gen) for k, v in grads.items()}
        for key, g in upstream.encoder.grads.items():
            upstream.encoder.encode(key, g, "powersgd:1")
        upstream.track_progress(decision)
    assert len(got) == 1 and got[0][0] == 1 and 0 < got[0][1] < 1


PAD = 120_000


class PadOdd(Alternate):
    """`Alternate`, with the odd steps padded by `PAD` bytes where the sender can pad."""

    def choose(self, request: ChooseRequest) -> Decision:
        d = super().choose(request)
        return dataclasses.replace(d, pad_bytes=PAD) if request.pad_ok and request.step % 2 else d


register_policy("test-pad-odd", lambda arg, ladder, /, **kw: PadOdd(ladder))


def test_the_relay_sends_a_padded_probes_filler_beside_its_push(certs: CertPaths, tmp_path: Path) -> None:
    """The relay's upstream probes by padding as a worker's uplink does: the filler crosses (the
    PS drops it), the push time runs to its ack, and the report counts it."""
    Alternate.seen.clear()
    ps = start_ps(certs)
    site = relay(certs, ps.port, site_workers=2, upstream_policy="test-pad-odd", ladder="fp32,qsgd:4")
    try:
        workers = [Worker(r, 2, connect(certs, site.ports[0]), STEPS, digits()) for r in range(2)]
        run_workers(workers)
        assert ps.call(lambda: ps.server.store.version) == STEPS
        sent = site.net.run(_sent_upstream(site))
    finally:
        site.stop()
        ps.stop()
    policy = Alternate.seen[-1]
    assert all(r.pad_ok for r in policy.requests)
    assert sent > sum(r.bytes_sent for r in policy.reports)  # the filler did cross (with step 0 and the pulls)
    padded = [r for r in policy.reports if r.step % 2]
    assert padded and all(r.pad_bytes == PAD and PAD < r.bytes_sent < PAD + 0.2 * MODEL_BYTES for r in padded)
    assert all(r.pad_bytes == 0 and r.bytes_sent > 0.9 * MODEL_BYTES for r in policy.reports if r.step % 2 == 0)


async def _sent_upstream(site: Any) -> int:
    return sum(s.upstream.client.bytes_sent for s in site.relay.shards)


register_policy(
    "test-netsense-small",
    lambda arg, ladder, /, **kw: make_policy("netsense", ladder, min_sample_bytes=16 * 1024, **kw),
)


def test_the_relay_probes_the_path_before_its_first_decision(certs: CertPaths, tmp_path: Path) -> None:
    """The start-up probe (`start_probe`) on the relay's upstream: step 0 is chosen on the probed
    bandwidth (the test model's 37 kB payload is a sample once `min_sample_bytes` is 16 kB)."""
    log = tmp_path / "relay.jsonl"
    ps = start_ps(certs)
    site = relay(certs, ps.port, site_workers=2, upstream_policy="test-netsense-small", decision_log=str(log))
    try:
        workers = [Worker(r, 2, connect(certs, site.ports[0]), 3, digits()) for r in range(2)]
        run_workers(workers)
        assert ps.call(lambda: ps.server.store.version) == 3
    finally:
        site.stop()
        ps.stop()
    first = json.loads(log.read_text().splitlines()[0])
    assert first["step"] == 0 and first["probe_bytes"] == 16 * 1024 and first["probe_s"] > 0
    assert first["reason"] != "unknown-bandwidth" and first["bw_used_Bps"] is not None
