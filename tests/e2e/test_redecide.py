"""A push redecided mid-flight (worker/redecide.py): withdrawn, re-encoded heavier, applied once, exactly,
also when the PS restarts while the withdrawn push is re-encoded.

In-process PS behind a `LinkEmulator` at 8 Mbit/s, one worker, a ~1 MB model: an fp32 push takes
about a second, and a test policy predicts it in a millisecond, so the step redecides it at 0.2 s.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from netsense.compression.policy import ChooseRequest, Decision, Policy
from netsense.compression.policy.decisionlog import read_decision_log
from netsense.compression.policy.ladder import DEFAULT_LADDER, Ladder
from netsense.compression.policy.link import LinkState
from netsense.ps import checkpoint
from netsense.ps.server import PSServer, ServerSettings
from netsense.transport.auth import load_secret
from netsense.transport.emulation.emulator import LinkEmulator
from netsense.transport.tls import CertPaths, TransportSettings, server_configuration
from netsense.worker.netthread import NetThread
from netsense.worker.optimizer import NetSenseOptimizer

from ..conftest import RunningPS, stop_ps

LINK = "rate=8mbit,delay=5ms,queue=100ms"


class RedecideOnce(Policy):
    """fp32 predicted at ~1 ms (so a push over the slow link is redecided); the first redecision
    asks for `to`, later ones let the push finish."""

    def __init__(self, to: str) -> None:
        super().__init__(Ladder.parse(DEFAULT_LADDER), name="redecide-once")
        self.to = self.ladder.find(to)
        self.redecisions: list[tuple[int, float]] = []

    def choose(self, request: ChooseRequest) -> Decision:
        return self._decision(request, level_index=0, level=self.ladder[0], reason="test", bandwidth_Bps=1e12)

    def redecide(self, *, link: LinkState, sent: Decision, bytes_acked: int, elapsed_s: float) -> Decision | None:
        self.redecisions.append((bytes_acked, elapsed_s))
        if len(self.redecisions) > 1:
            return None
        assert self.to is not None
        return self._decision(
            sent.request(link), level_index=self.to, level=self.ladder[self.to], reason="redecide: test", bandwidth_Bps=1e6
        )


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(512, 512)  # 262,656 parameters: 1.05 MB of fp32


@pytest.mark.slow
def test_a_redecided_push_is_withdrawn_re_encoded_applied_once_and_exact(ps: RunningPS, tmp_path: Path) -> None:
    emu_net = NetThread("redecide-emu")
    emu = LinkEmulator(upstream=("127.0.0.1", ps.port), spec=LINK)
    emu_net.run(emu.start())
    host, port = emu.address
    model = _model()
    start = [p.detach().clone() for p in model.parameters()]
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(p.shape, generator=gen) * 0.01 for p in model.parameters()]
    policy = RedecideOnce("qsgd:8")
    log = tmp_path / "up.jsonl"
    try:
        with NetSenseOptimizer(
            model, connect=replace(ps.connect_settings(), host=host, port=port), optimizer={"name": "sgd", "lr": 1.0, "momentum": 0.0},
            policy=policy, decision_log=log,
        ) as opt:  # fmt: skip
            for p, g in zip(model.parameters(), grads):
                p.grad = g.clone()
            first = opt.step(samples=1)
            assert first.codec == "qsgd:8"
            assert opt.uplink.withdrawals == 1
            after_one = [p.detach().clone() for p in model.parameters()]
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
            second = opt.step(samples=1, codec="fp32")  # flushes the residual error feedback kept
            assert second.version == 2
    finally:
        emu_net.run(emu.close())
        emu_net.close()
    assert ps.server.store.version == 2  # the withdrawn push counted nothing
    bytes_acked, elapsed = policy.redecisions[0]
    assert 0.2 <= elapsed < 1.0 and 0 < bytes_acked < 4 * 262_656  # redecided mid-push
    # Step 1 applied qsgd:8 of the gradient (not the fp32 push that was on the wire) ...
    assert any((a - (s - g)).abs().max() > 1e-6 for a, s, g in zip(after_one, start, grads))
    # ... and with the residual flushed, exactly the gradient: nothing lost, nothing twice.
    for p, s, g in zip(model.parameters(), start, grads):
        torch.testing.assert_close(p.detach(), s - g, rtol=0, atol=2e-6)
    records: list[dict[str, Any]] = read_decision_log(log)
    assert [(r["spec"], bool(r.get("withdrawn"))) for r in records] == [("fp32", True), ("qsgd:8", False)]
    assert records[1]["reason"].startswith("redecide")
    assert records[1]["bytes_sent"] < records[0]["predicted_bytes"]  # the re-encoded push is the smaller one


def _ps_from(certs: CertPaths, settings: ServerSettings, state: dict[str, Any] | None) -> RunningPS:
    net = NetThread("redecide-ps")
    server = PSServer(settings, secret=load_secret(certs.secret))
    if state is not None:
        server.restore(state)

    async def start() -> int:
        return await server.start(server_configuration(certs.cert, certs.key, TransportSettings()))

    return RunningPS(server, net, net.run(start()), certs)


@pytest.mark.slow
def test_a_push_withdrawn_just_before_the_ps_restarts_is_retried_re_encoded_and_exact(certs: CertPaths, tmp_path: Path) -> None:
    """The PS goes away while the training thread re-encodes a withdrawn push and comes back from
    the checkpoint of the step's own version: the retry must send the re-encoded bucket (error
    feedback counts it as sent), so the run stays exact, and nothing is left unretrieved."""
    settings = ServerSettings(port=0, checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every_steps=1)
    box = {"ps": _ps_from(certs, settings, None)}
    port = box["ps"].port
    emu_net = NetThread("redecide-emu")
    emu = LinkEmulator(upstream=("127.0.0.1", port), spec=LINK)
    emu_net.run(emu.start())
    host, emu_port = emu.address
    model = _model()
    start = [p.detach().clone() for p in model.parameters()]
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(p.shape, generator=gen) * 0.01 for p in model.parameters()]
    policy = RedecideOnce("qsgd:8")
    connect = replace(box["ps"].connect_settings(), host=host, port=emu_port, connect_timeout_s=2.0, reconnect_backoff_max_s=0.5)
    try:
        with NetSenseOptimizer(model, connect=connect, optimizer={"name": "sgd", "lr": 1.0, "momentum": 0.0}, policy=policy) as opt:
            tasks: list[asyncio.Task[Any]] = []
            opt._exchange.net.loop.set_task_factory(
                lambda loop, coro, **kw: tasks.append(asyncio.Task(coro, loop=loop, **kw)) or tasks[-1]  # type: ignore[arg-type, func-returns-value]
            )
            settle = opt._exchange.settle

            def restart_then_settle(withdrawal: Any, outcome: Any) -> None:
                old = box["ps"]
                conn = opt.client.conn
                stop_ps(old)
                deadline = time.monotonic() + 10
                while conn is not None and conn.closed_reason is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                state, _ = checkpoint.load_latest(tmp_path / "ckpt")
                assert state["version"] == 1  # the step's own version: its gradients still fit
                box["ps"] = _ps_from(certs, replace(settings, port=port), state)
                settle(withdrawal, outcome)

            opt._exchange.settle = restart_then_settle  # type: ignore[method-assign]
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
            assert opt.step(samples=1, codec="fp32").version == 1  # a zero step: the checkpoint at version 1
            for p, g in zip(model.parameters(), grads):
                p.grad = g.clone()
            second = opt.step(samples=1)  # redecided; the PS restarts while it is re-encoded
            assert second.codec == "qsgd:8" and second.version == 2
            assert opt.uplink.withdrawals == 1 and opt.reconnects == 1
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
            assert opt.step(samples=1, codec="fp32").version == 3  # flushes the residual
            # No task's exception left for the garbage collector to log ("never retrieved"):
            assert [t for t in tasks if t.done() and getattr(t, "_log_traceback", False)] == []
    finally:
        emu_net.run(emu.close())
        emu_net.close()
        stop_ps(box["ps"])
    for p, s, g in zip(model.parameters(), start, grads):
        torch.testing.assert_close(p.detach(), s - g, rtol=0, atol=2e-6)  # nothing lost, nothing twice
