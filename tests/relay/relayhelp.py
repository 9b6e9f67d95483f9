"""In-process jobs with and without a relay: a PS and each relay on their own loop threads,
workers on threads; a small MLP on scikit-learn's digits, so a few steps take a second."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from netsense.ps.server import PSServer, ServerSettings
from netsense.relay import RelaySettings, RunningRelay, start_relay
from netsense.transport.auth import load_secret
from netsense.transport.tls import CertPaths, TransportSettings, server_configuration
from netsense.worker.connect import ConnectSettings
from netsense.worker.netthread import NetThread
from netsense.worker.optimizer import NetSenseOptimizer

OPTIMIZER = {"name": "sgd", "lr": 0.2, "momentum": 0.9}


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return torch.tensor(d.data, dtype=torch.float32) / 16.0, torch.tensor(d.target, dtype=torch.long)


def model() -> torch.nn.Module:
    """~9.6k parameters (38 KB in fp32): big enough that a step's bytes dwarf the headers."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


MODEL_BYTES = 4 * sum(p.numel() for p in model().parameters())


@dataclass
class PS:
    server: PSServer
    net: NetThread
    port: int

    def call(self, fn: Any) -> Any:
        async def _run() -> Any:
            return fn()

        return self.net.run(_run())

    def stop(self) -> None:
        self.call(self.server.close)
        self.net.close()


def start_ps(certs: CertPaths, site: str | None = None, **kw: Any) -> PS:
    net = NetThread("relay-test-ps")
    kw.setdefault("port", 0)
    server = PSServer(ServerSettings(**kw), secret=load_secret(certs.secret), site=site)

    async def start() -> int:
        return await server.start(server_configuration(certs.cert, certs.key, TransportSettings()))

    return PS(server, net, net.run(start()))


def connect(certs: CertPaths, port: int, **kw: Any) -> ConnectSettings:
    kw.setdefault("connect_timeout_s", 3.0)
    kw.setdefault("reconnect_deadline_s", 30.0)
    return ConnectSettings("127.0.0.1", port, ca=str(certs.ca), secret_file=str(certs.secret), **kw)


def relay(certs: CertPaths, ps_port: int, site: str = "a", *, barrier_timeout_s: float = 30.0, **kw: Any) -> RunningRelay:
    settings = RelaySettings(
        upstream=(connect(certs, ps_port),), site=site, server=ServerSettings(port=0, barrier_timeout_s=barrier_timeout_s), **kw
    )
    return start_relay(settings, cert=str(certs.cert), key=str(certs.key), secret=load_secret(certs.secret))


@dataclass
class Worker:
    """One training worker on a thread: rank `rank` of `world`, the same batches whatever it
    connects to; `hook(worker)` runs after each step."""

    rank: int
    world: int
    settings: ConnectSettings
    steps: int
    data: tuple[torch.Tensor, torch.Tensor]
    batch: int = 16
    hook: Any = None
    opt: NetSenseOptimizer | None = None
    model: torch.nn.Module = field(default_factory=model)
    error: BaseException | None = None
    started: threading.Event = field(default_factory=threading.Event)
    crash: bool = False
    """Set by a hook: stop without BYE, like a killed process."""
    gate: threading.Barrier | None = None
    spread: int = 4
    """Rank r takes `batch` + `spread` r samples: unequal batches, so a sum must weight by samples."""
    options: dict[str, Any] = field(default_factory=dict)
    """More `NetSenseOptimizer` arguments (codec, overlap, ...)."""

    def run(self) -> None:
        try:
            self.opt = NetSenseOptimizer(
                self.model, connect=self.settings, rank=self.rank, worker_id=f"w{self.rank}", optimizer=OPTIMIZER, **self.options
            )
            self.started.set()
            if self.gate is not None:
                self.gate.wait(60)
            x, y = self.data
            while self.opt.version < self.steps:
                g = torch.Generator().manual_seed(self.opt.version)
                sizes = [self.batch + self.spread * r for r in range(self.world)]
                idx = torch.randperm(len(x), generator=g)[: sum(sizes)]
                start = sum(sizes[: self.rank])
                idx = idx[start : start + sizes[self.rank]]
                self.opt.zero_grad()
                F.cross_entropy(self.model(x[idx]), y[idx]).backward()
                self.opt.step(samples=len(idx))
                if self.hook is not None:
                    self.hook(self)
                if self.crash:
                    self.opt._exchange.net.close()  # the loop stops mid-connection: no BYE
                    return
            self.opt.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
            self.started.set()


def run_workers(workers: list[Worker], timeout: float = 120) -> None:
    """Rank 0 first (it initializes the job), then the others; every worker connects before any
    trains, so step 0 has all of them."""
    threads = []
    gate = threading.Barrier(len(workers))
    for w in sorted(workers, key=lambda w: w.rank):
        w.gate = gate
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


def params_of(ps: PS) -> dict[str, torch.Tensor]:
    return ps.call(lambda: {k: v.clone() for k, v in ps.server.store.params.items()})
