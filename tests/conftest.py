"""Shared fixtures: dev certificates and an in-process PS on its own event-loop thread."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import socket
import time
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Imported here, at collection, on purpose: hypothesis's pytest plugin otherwise imports it at the
# terminal summary of a run that had no hypothesis test, pytest's assertion rewriter then parses
# it, and CPython 3.11.7's AST depth bookkeeping (cpython#106905, fixed in 3.11.8) can fail that
# parse with "SystemError: AST constructor recursion depth mismatch", turning a green run red.
import hypothesis  # noqa: F401
import pytest
import torch

from netsense.ps.server import PSServer, ServerSettings
from netsense.transport.auth import load_secret
from netsense.transport.tls import CertPaths, TransportSettings, make_dev_certs, server_configuration
from netsense.worker.connect import ConnectSettings
from netsense.worker.netthread import NetThread


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertPaths:
    return make_dev_certs(tmp_path_factory.mktemp("certs"))


def run_ranks(work: Callable[[int], None], ranks: int = 2, timeout_s: float = 120.0) -> None:
    """`work(rank)` for each rank, each on its own thread (one training worker each, started in
    rank order); fails with what they raised."""
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            work(rank)
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    assert not errors, errors


@dataclass
class RunningPS:
    server: PSServer
    net: NetThread
    port: int
    certs: CertPaths

    def connect_settings(self, **kw: object) -> ConnectSettings:
        return ConnectSettings(
            "127.0.0.1", self.port, ca=str(self.certs.ca), secret_file=str(self.certs.secret), **kw  # type: ignore[arg-type]
        )

    def call(self, fn):  # type: ignore[no-untyped-def]
        """Run `fn()` on the PS loop thread (the store is not thread-safe)."""

        async def _run():  # type: ignore[no-untyped-def]
            return fn()

        return self.net.run(_run())


def start_ps(certs: CertPaths, settings: ServerSettings | None = None, insecure: bool = False, site: str | None = None) -> RunningPS:
    net = NetThread("test-ps")
    server = PSServer(settings or ServerSettings(port=0), secret=None if insecure else load_secret(certs.secret), site=site)

    async def start() -> int:
        return await server.start(server_configuration(certs.cert, certs.key, TransportSettings()))

    port = net.run(start())
    return RunningPS(server, net, port, certs)


def stop_ps(ps: RunningPS) -> None:
    ps.net.run(asyncio.sleep(0.05))
    ps.net.run(ps.server.stop())
    ps.net.run(asyncio.sleep(0.05))
    ps.net.close()


@pytest.fixture
def ps(certs: CertPaths) -> Iterator[RunningPS]:
    running = start_ps(certs)
    yield running
    stop_ps(running)


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


def traffic_per_step(opt, model: torch.nn.Module, steps: int) -> list[tuple[int, int]]:  # type: ignore[no-untyped-def]
    """Train `model` (64 inputs, 10 classes) `steps` steps on random batches of 16 through `opt`
    (a `NetSenseOptimizer`); the wire bytes (sent, received) of each step."""
    out = []
    for _ in range(steps):
        before = opt._exchange.traffic()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.randn(16, 64)), torch.randint(0, 10, (16,))).backward()
        opt.step(samples=16)
        after = opt._exchange.traffic()
        out.append((after[0] - before[0], after[1] - before[1]))
    return out


def _worker_index() -> int:
    """This process's pytest-xdist worker number ("gw3" -> 3); 0 in a run without workers."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0


_BAND = 1000
_next_port = itertools.count(random.randrange(_BAND))


def reusable_port() -> int:
    """A free UDP port on 127.0.0.1 for a server that must come back on the same port (a PS
    restarted under a connected worker); a server that can take port 0 should. Binding port 0 and
    closing it races: the kernel may hand the port to another test (a parallel worker) before the
    restart binds it. So the port is drawn below the kernel's ephemeral range, which bind(0) never
    returns, from a band of `_BAND` ports of this pytest-xdist worker's own."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    top = low - _BAND * _worker_index()
    for _ in range(_BAND):
        port = top - 1 - next(_next_port) % _BAND
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free UDP port in {top - _BAND}..{top - 1}")


SLOW_SEND_S = 0.2
"""How late `slow_sends` reports a push's last byte sent."""


@pytest.fixture
def slow_sends(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """Pushes on the connections whose `id` the test adds to the returned set report their last
    byte sent `SLOW_SEND_S` late, as a push held back by its congestion window would (loopback
    sends every byte at once). For "WAN pushes first" (worker/wanpushes.py)."""
    from netsense.worker import client

    slow: set[int] = set()
    until_sent = client._until_sent

    async def late(conn, stream_id, sent, poll_s=0.002):  # type: ignore[no-untyped-def]
        if id(conn) in slow:
            await asyncio.sleep(SLOW_SEND_S)
        await until_sent(conn, stream_id, sent, poll_s)

    monkeypatch.setattr(client, "_until_sent", late)
    return slow


def time_pushes(servers: list[Any], slow: int) -> list[dict[int, float]]:
    """Per server (anything with ``.server``, a `PSServer`), when each step's first PUSH reached its
    store; server `slow` then takes `SLOW_SEND_S` before it acks that push (blocking its loop), as
    the far end of a slow WAN push would. For "WAN pushes first" beside `slow_sends`."""
    arrived: list[dict[int, float]] = [{} for _ in servers]
    for i, ps in enumerate(servers):
        store, push = ps.server.store, ps.server.store.push

        def timed(worker_id: str, msg: Any, push: Any = push, i: int = i) -> Any:
            first = msg.step not in arrived[i]
            arrived[i].setdefault(msg.step, time.monotonic())
            if i == slow and first:
                time.sleep(SLOW_SEND_S)
            return push(worker_id, msg)

        store.push = timed
    return arrived
