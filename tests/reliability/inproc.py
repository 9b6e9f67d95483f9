"""In-process jobs for the reliability tests: a PS on its own loop thread, workers on threads.

A logistic-regression model on scikit-learn's digits trains in milliseconds per step, so fault
scenarios (PS restart, blackout, loss, address change, worker crash) run in seconds.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from netsense.ps.server import PSServer, ServerSettings
from netsense.transport.auth import load_secret
from netsense.transport.wire import Limits
from netsense.transport.tls import CertPaths, TransportSettings, server_configuration
from netsense.worker.connect import ConnectSettings
from netsense.worker.netthread import NetThread
from netsense.worker.optimizer import NetSenseOptimizer

OPTIMIZER = {"name": "sgd", "lr": 0.2, "momentum": 0.9}


def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    return x[:1400], y[:1400], x[1400:], y[1400:]


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(64, 10)


def accuracy(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((m(x).argmax(1) == y).float().mean())


@dataclass
class PS:
    server: PSServer
    net: NetThread
    port: int

    def call(self, fn):  # type: ignore[no-untyped-def]
        async def _run():  # type: ignore[no-untyped-def]
            return fn()

        return self.net.run(_run())

    def stop(self, crash: bool = False) -> None:
        """A clean stop writes the newest version; `crash` keeps only what was already due."""
        self.net.run(self.server.stop())
        self.net.run(self.server.flush_checkpoint(final=not crash))
        self.net.close()


def start_ps(certs: CertPaths, settings: ServerSettings, state: dict[str, Any] | None = None, limits: Limits = Limits()) -> PS:
    net = NetThread("rel-ps")
    server = PSServer(settings, secret=load_secret(certs.secret), limits=limits)
    if state is not None:
        server.restore(state)

    async def start() -> int:
        return await server.start(server_configuration(certs.cert, certs.key, TransportSettings()))

    return PS(server, net, net.run(start()))


def connect(certs: CertPaths, port: int, **kw: Any) -> ConnectSettings:
    kw.setdefault("connect_timeout_s", 3.0)
    kw.setdefault("reconnect_deadline_s", 60.0)
    return ConnectSettings("127.0.0.1", port, ca=str(certs.ca), secret_file=str(certs.secret), **kw)


@dataclass
class Worker:
    """One training worker on a thread; `result` holds its final model or the exception."""

    rank: int
    world: int
    settings: ConnectSettings
    steps: int
    data: tuple[torch.Tensor, ...]
    batch: int = 32
    hook: Any = None
    """Called with (worker, version) after each step (to inject faults)."""
    opt: NetSenseOptimizer | None = None
    model: torch.nn.Module = field(default_factory=model)
    error: BaseException | None = None
    started: threading.Event = field(default_factory=threading.Event)
    crash: bool = False
    """Set by a hook: stop without BYE, like a killed process."""
    gate: threading.Barrier | None = None
    """Every worker of a job connects before any trains, so step 0 already has all of them."""

    def run(self) -> None:
        try:
            self.opt = NetSenseOptimizer(
                self.model, connect=self.settings, rank=self.rank, worker_id=f"w{self.rank}", optimizer=OPTIMIZER
            )
            self.started.set()
            if self.gate is not None:
                self.gate.wait(60)
            x, y = self.data[0], self.data[1]
            while self.opt.version < self.steps:
                step = self.opt.version
                g = torch.Generator().manual_seed(step)
                idx = torch.randperm(len(x), generator=g)[: self.batch * self.world]
                idx = idx[self.rank * self.batch : (self.rank + 1) * self.batch]
                self.opt.zero_grad()
                F.cross_entropy(self.model(x[idx]), y[idx]).backward()
                self.opt.step(samples=len(idx))
                if self.hook is not None:
                    self.hook(self, self.opt.version)
                if self.crash:
                    self.opt._exchange.net.close()  # the loop stops mid-connection: no BYE, no CONNECTION_CLOSE
                    return
            self.opt.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
            self.started.set()


def run_workers(workers: list[Worker], timeout: float = 120) -> None:
    threads = []
    gate = threading.Barrier(len(workers))
    for w in workers:
        w.gate = gate  # rank 0 first: it initializes the PS
        t = threading.Thread(target=w.run, daemon=True)
        t.start()
        threads.append(t)
        if w.rank == 0:
            w.started.wait(30)
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "worker thread hung"
    for w in workers:
        if w.error is not None:
            raise w.error
