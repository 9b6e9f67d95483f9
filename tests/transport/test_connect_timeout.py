"""A connect attempt given up by its timeout leaves nothing for asyncio to complain about: aioquic
shields its handshake wait, and the abandoned future used to log "Future exception was never
retrieved ... ConnectionError" once per retried first connect (transport/channel.py)."""

from __future__ import annotations

import asyncio
import gc
import socket

from netsense.transport.channel import open_connection
from netsense.transport.tls import TransportSettings, client_configuration


async def test_a_timed_out_connect_leaves_no_unretrieved_exception() -> None:
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # bound, never answers: the handshake hangs
    silent.bind(("127.0.0.1", 0))
    port = silent.getsockname()[1]
    loop = asyncio.get_running_loop()
    reported: list[dict] = []  # type: ignore[type-arg]
    old = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx))
    try:
        config = client_configuration(TransportSettings(), ca=None, server_name="localhost", insecure=True)
        for _ in range(3):
            cm = open_connection("127.0.0.1", port, config)
            try:
                await asyncio.wait_for(cm.__aenter__(), 0.2)
            except asyncio.TimeoutError:
                pass
        await asyncio.sleep(0.05)
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(old)
        silent.close()
    assert not [c for c in reported if "never retrieved" in c.get("message", "")], reported
