"""Stopping the PS with a PULL still waiting finishes the request's serve task.

Before, the serve task stayed pending until the connection's closing period ended, so a loop that
stopped first (a test's or an embedding program's) logged `Task was destroyed but it is pending!
... coro=<ServerConnection._serve() ...>` when the task was collected.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from tests.conftest import RunningPS, start_ps, stop_ps
from netsense.ps.server import PSServer, ServerSettings
from netsense.transport.auth import load_secret
from netsense.transport.channel import open_connection
from netsense.transport.handshake import authenticate
from netsense.transport.tls import CertPaths, TransportSettings, client_configuration
from netsense.transport.wire import Pull


def _serving(ps: RunningPS) -> int:
    """Serve tasks of the PS's loop not yet done."""

    async def count() -> int:
        return sum(1 for t in asyncio.all_tasks() if "_serve" in repr(t.get_coro()) and not t.done())

    return ps.net.run(count())


async def _pull_then(certs: CertPaths, ps: RunningPS, stop: Any) -> None:
    """Authenticate, leave a PULL waiting for a version that never comes, and run `stop(ps)`."""
    config = client_configuration(TransportSettings(), ca=certs.ca, server_name="127.0.0.1")
    async with open_connection("127.0.0.1", ps.port, config) as conn:
        await authenticate(conn, client_id="w0", rank=0, secret=load_secret(certs.secret), timeout_s=5, refused="refused")
        pull = asyncio.ensure_future(conn.request(Pull(-1, 5), 30))
        for _ in range(200):
            if await asyncio.to_thread(_serving, ps):
                break
            await asyncio.sleep(0.01)
        assert await asyncio.to_thread(_serving, ps) == 1
        await asyncio.to_thread(stop, ps)
        pull.cancel()
        await asyncio.gather(pull, return_exceptions=True)


def test_a_stop_with_a_pull_waiting_destroys_no_pending_task(certs: CertPaths) -> None:
    ps = start_ps(certs)
    seen: list[str] = []
    ps.net.loop.set_exception_handler(lambda _loop, ctx: seen.append(f"{ctx.get('message')} {ctx.get('task', '')!r}"))
    asyncio.run(_pull_then(certs, ps, stop_ps))
    del ps
    gc.collect()
    assert not [m for m in seen if "destroyed but it is pending" in m], seen


def test_after_stop_returns_no_serve_task_is_pending(certs: CertPaths) -> None:
    ps = start_ps(certs)
    left: list[int] = []

    def stop(ps: RunningPS) -> None:
        ps.net.run(ps.server.stop())
        left.append(_serving(ps))

    try:
        asyncio.run(_pull_then(certs, ps, stop))
    finally:
        ps.net.close()
    assert left == [0]


async def test_stop_before_start_and_twice_is_harmless() -> None:
    server = PSServer(ServerSettings(port=0), secret=b"x" * 32)
    await server.stop()
    await server.stop()
    assert server.connections == set()


