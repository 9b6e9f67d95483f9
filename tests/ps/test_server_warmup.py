"""A PS pays torch's one-time lazy costs before it listens, not on its event loop mid-job.

The first `torch.optim` optimizer a process builds imports torch._dynamo (sympy, inductor): 2 s on
an idle core, over 10 s at load ~16. The PS built it when rank 0's INIT arrived, on its event
loop, which then answered no packet for that long: a worker whose last packet was the INIT it had
just sent hit the 10 s QUIC idle timeout, and `netsense launch` lost a worker at job start.

Checked in a fresh interpreter (this one may have imported torch._dynamo already): after
`PSServer.start`, an INIT and the first step import nothing heavy.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from netsense.transport.tls import CertPaths

SCRIPT = r"""
import asyncio, json, sys

import torch

from netsense.compression import make_codec
from netsense.ps.server import PSServer, ServerSettings
from netsense.transport.tls import TransportSettings, server_configuration
from netsense.transport.wire import Push

cert, key, name = sys.argv[1:4]


async def main() -> list[str]:
    server = PSServer(ServerSettings(port=0), secret=None)
    await server.start(server_configuration(cert, key, TransportSettings()))
    fp32 = make_codec("fp32")
    before = set(sys.modules)
    store = server.store
    store.initialize({"w": fp32.encode(torch.ones(4)), "b": fp32.encode(torch.zeros(2))}, {"name": name}, 1)
    store.join("w0")
    grads = {"w": fp32.encode(torch.ones(4)), "b": fp32.encode(torch.ones(2))}
    assert store.push("w0", Push(0, 1, 2, grads)) is not None  # the step applied
    store.state()  # what a checkpoint snapshots on the loop
    new = sorted(set(sys.modules) - before)
    await server.stop()
    return new


print(json.dumps(asyncio.run(main())))
"""

HEAVY = ("torch._dynamo", "torch._inductor", "sympy")


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_init_and_first_step_import_nothing_heavy_on_the_loop(certs: CertPaths, optimizer: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(certs.cert), str(certs.key), optimizer],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    imported = json.loads(out.stdout.strip().splitlines()[-1])
    heavy = [m for m in imported if m.split(".")[0] == "sympy" or m.startswith(HEAVY)]
    assert not heavy, f"{len(heavy)} heavy modules imported on the PS loop by INIT / the first step, e.g. {heavy[:5]}"


def test_a_blocked_loop_is_one_warning(certs: CertPaths) -> None:
    """Whatever blocks the PS loop next is named in the log, not only seen as a worker's idle timeout."""
    import logging
    import time

    from netsense.ps.server import PSServer, ServerSettings
    from netsense.transport.tls import TransportSettings, server_configuration
    from netsense.worker.netthread import NetThread

    net = NetThread("test-ps-stall")
    server = PSServer(ServerSettings(port=0, barrier_timeout_s=0.4), secret=None)
    quic = server_configuration(certs.cert, certs.key, TransportSettings(idle_timeout_s=1.5))

    async def block() -> None:
        time.sleep(1.0)  # a third of the idle timeout is 0.5 s

    # A handler on the logger itself: another test's logging set-up (propagate off) cannot hide it.
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("netsense.ps.server")
    level = logger.level
    logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    try:
        net.run(server.start(quic))
        net.run(block())
        deadline = time.monotonic() + 15  # the watchdog's next tick notices (late on a loaded host)
        while not server.loop_stalls and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.loop_stalls >= 1  # more only if the loaded machine itself stalled it
        lines = [r.getMessage() for r in records if "event loop was blocked" in r.getMessage()]
        assert lines and all("closed after 1.5 s without a packet" in line for line in lines), lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        net.run(server.stop())
        net.close()
