"""Losing the PS mid-step (worker/exchange.py, worker/connect.py): a slow push is not redecided
while its connection is being replaced, a step that gives up on its pushes and pull leaves no
unretrieved task exception, and a worker whose PS is not up yet waits for it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from netsense.compression.policy import ChooseRequest, Decision, Policy
from netsense.compression.policy.ladder import DEFAULT_LADDER, Ladder
from netsense.compression.policy.link import LinkState
from netsense.ps.server import ServerSettings
from netsense.transport.tls import CertPaths
from netsense.worker.optimizer import NetSenseOptimizer

from tests.conftest import RunningPS, reusable_port, start_ps, stop_ps


class PredictsFast(Policy):
    """fp32 predicted at about a millisecond, so any push still running 0.2 s later is redecided;
    records every redecision it is asked for and keeps the push."""

    def __init__(self) -> None:
        super().__init__(Ladder.parse(DEFAULT_LADDER), name="predicts-fast")
        self.asked: list[LinkState] = []

    def choose(self, request: ChooseRequest) -> Decision:
        return self._decision(request, level_index=0, level=self.ladder[0], reason="test", bandwidth_Bps=1e12)

    def redecide(self, *, link: LinkState, sent: Decision, bytes_acked: int, elapsed_s: float) -> Decision | None:
        self.asked.append(link)
        return None


def _ps_on(certs: CertPaths, port: int) -> RunningPS:
    return start_ps(certs, ServerSettings(port=port))


def _stop_and_wait_for_close(ps: RunningPS, opt: NetSenseOptimizer) -> None:
    """Stop the PS and wait until the worker's connection has seen its CONNECTION_CLOSE, so the
    next step finds the connection closed (not a silent one that times out much later)."""
    stop_ps(ps)
    conn, deadline = opt.client.conn, time.monotonic() + 10
    while conn is not None and conn.closed_reason is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert conn is not None and conn.closed_reason is not None


def _step(opt: NetSenseOptimizer, model: torch.nn.Module, codec: str | None = None) -> int:
    model(torch.randn(4, 16)).sum().backward()
    return opt.step(samples=4, codec=codec).version


@pytest.fixture
def loop_tasks() -> Iterator[list[asyncio.Task[Any]]]:
    """Every task created on a watched worker loop."""
    tasks: list[asyncio.Task[Any]] = []
    yield tasks


def _watch(opt: NetSenseOptimizer, tasks: list[asyncio.Task[Any]]) -> None:
    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **kw)
        tasks.append(task)
        return task

    opt._exchange.net.loop.set_task_factory(factory)  # type: ignore[arg-type]


def _unretrieved(tasks: list[asyncio.Task[Any]]) -> list[str]:
    """Tasks whose exception nobody retrieved: asyncio logs "Task exception was never retrieved"
    for each when it is collected (`_log_traceback` is the flag it logs on; the log itself comes
    only at garbage collection, which the test's log capture may delay)."""
    return [f"{t.get_coro().__qualname__}: {t.exception()!r}" for t in tasks if t.done() and getattr(t, "_log_traceback", False)]


def test_a_slow_push_is_not_redecided_while_its_connection_is_replaced(certs: CertPaths, loop_tasks: list[asyncio.Task[Any]]) -> None:
    """The PS goes away under a step whose push the policy would redecide at 0.2 s; it comes back
    only once the redecide crossing has run, so that crossing always meets the reconnect."""
    port = reusable_port()
    ps = _ps_on(certs, port)
    model, policy = torch.nn.Linear(16, 8), PredictsFast()
    settings = ps.connect_settings(connect_timeout_s=1.0, reconnect_deadline_s=60.0, reconnect_backoff_max_s=0.5)
    opt = NetSenseOptimizer(model, connect=settings, worker_id="w0", policy=policy)
    _watch(opt, loop_tasks)
    crossed = threading.Event()
    during: list[bool] = []
    redecide = opt._exchange.redecide

    def watched(decide: Any) -> Any:
        during.append(bool(getattr(opt._exchange, "_reconnecting", ())) or opt.client.conn is None)
        try:
            return redecide(decide)
        finally:
            crossed.set()

    opt._exchange.redecide = watched  # type: ignore[method-assign]
    box: dict[str, RunningPS] = {}

    def restart() -> None:
        crossed.wait(30)
        box["ps"] = _ps_on(certs, port)

    try:
        assert _step(opt, model) == 1
        _stop_and_wait_for_close(ps, opt)
        restarter = threading.Thread(target=restart, daemon=True)
        restarter.start()
        version = _step(opt, model)  # before the fix: AssertionError "not connected" from the redecide crossing
        restarter.join(30)
        assert during == [True] and policy.asked == []  # the crossing met the reconnect and asked nothing
        assert opt.reconnects == 1
        assert version == 0  # the new PS came back empty: rank 0 re-seeded it, the worker follows it
        assert _step(opt, model) == 1  # and trains on
        opt.close()
    finally:
        if "ps" in box:
            stop_ps(box["ps"])
    assert _unretrieved(loop_tasks) == []


def test_a_dropped_step_leaves_no_unretrieved_task_exception(certs: CertPaths, loop_tasks: list[asyncio.Task[Any]]) -> None:
    """The pull runs beside the pushes; when the connection drops, both fail and the step retries:
    the pull's PeerTimeout must be consumed, not left for the garbage collector to log."""
    port = reusable_port()
    ps = _ps_on(certs, port)
    model = torch.nn.Linear(16, 8)
    opt = NetSenseOptimizer(model, connect=ps.connect_settings(connect_timeout_s=1.0, reconnect_deadline_s=60.0), worker_id="w0")
    _watch(opt, loop_tasks)
    try:
        assert _step(opt, model, "fp32") == 1
        _stop_and_wait_for_close(ps, opt)
        threading.Timer(0.5, lambda: box.append(_ps_on(certs, port))).start()
        box: list[RunningPS] = []
        assert _step(opt, model, "fp32") == 0  # resynced to the re-seeded PS
        assert opt.reconnects == 1
        opt.close()
    finally:
        for p in box:
            stop_ps(p)
    assert _unretrieved(loop_tasks) == []


def test_the_first_connect_waits_for_a_ps_that_starts_late(certs: CertPaths) -> None:
    port = reusable_port()
    box: list[RunningPS] = []
    late = threading.Timer(1.5, lambda: box.append(_ps_on(certs, port)))
    late.start()
    settings = RunningPS(None, None, port, certs).connect_settings(  # type: ignore[arg-type]
        connect_timeout_s=0.5, reconnect_deadline_s=30.0, reconnect_backoff_max_s=0.5
    )
    t0 = time.monotonic()
    try:
        model = torch.nn.Linear(16, 8)
        with NetSenseOptimizer(model, connect=settings, worker_id="w0") as opt:
            assert time.monotonic() - t0 >= 1.0  # it did wait for the PS
            assert _step(opt, model, "fp32") == 1
            assert opt.reconnects == 0  # the first connect is no reconnect
    finally:
        late.join()
        for p in box:
            stop_ps(p)
