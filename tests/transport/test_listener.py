"""transport/listener.py's stop: every request still being served is cancelled and has finished
when `Listener.stop` returns, and the listener forgets a connection once it terminated; a
connection's `replying` says whether a reply still has unsent bytes."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator

import pytest
import torch
from aioquic.quic.configuration import QuicConfiguration

from quic_certs import self_signed
from netsense.errors import PeerTimeout
from netsense.transport.channel import ClientConnection, open_connection
from netsense.compression import make_codec
from netsense.transport.listener import REPLIES_KEPT, Listener, ServerConnection, start_server
from netsense.transport.wire import Ack, Message, Params


class Waiting:
    """Never answers: stands in for a PULL waiting for a version that does not come."""

    def __init__(self, conn: ServerConnection, started: asyncio.Event, ended: list[str]) -> None:
        self.started, self.ended = started, ended

    async def handle(self, msg: Message) -> Message:
        self.started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.ended.append("cancelled")
            raise
        return Ack(0)


async def _listen(started: asyncio.Event, ended: list[str]) -> Listener:
    cert, key = self_signed()
    cfg = QuicConfiguration(is_client=False)
    cfg.certificate, cfg.private_key = cert, key
    return await start_server("127.0.0.1", 0, cfg, lambda c: Waiting(c, started, ended))


async def test_stop_cancels_and_awaits_the_requests_being_served() -> None:
    started, ended = asyncio.Event(), []
    listener = await _listen(started, ended)
    async with open_connection("127.0.0.1", listener.port, QuicConfiguration(is_client=True, verify_mode=ssl.CERT_NONE)) as conn:
        request = asyncio.ensure_future(conn.request(Ack(0), 30))
        await asyncio.wait_for(started.wait(), 10)
        (server_conn,) = listener.accepted
        assert len(server_conn._tasks) == 1
        await listener.stop()
        assert ended == ["cancelled"] and not server_conn._tasks
        await listener.stop()  # idempotent
        with pytest.raises(PeerTimeout):  # the client learns the connection closed
            await asyncio.wait_for(request, 10)
    for _ in range(100):  # the server side terminates after its closing period
        if not listener.accepted:
            break
        await asyncio.sleep(0.05)
    assert not listener.accepted



class Answers:
    """Answers every request with `reply`."""

    def __init__(self, reply: Message) -> None:
        self.reply = reply

    async def handle(self, msg: Message) -> Message:
        return self.reply


@contextlib.asynccontextmanager
async def _answering(reply: Message) -> AsyncIterator[tuple[Listener, ClientConnection]]:
    """A listener answering `reply` to everything, and a client connected to it."""
    cert, key = self_signed()
    cfg = QuicConfiguration(is_client=False)
    cfg.certificate, cfg.private_key = cert, key
    listener = await start_server("127.0.0.1", 0, cfg, lambda c: Answers(reply))
    try:
        async with open_connection("127.0.0.1", listener.port, QuicConfiguration(is_client=True, verify_mode=ssl.CERT_NONE)) as conn:
            yield listener, conn
    finally:
        await listener.stop()


async def test_replying_until_the_reply_has_left() -> None:
    """`ServerConnection.replying` (ps/release.py waits on it): True while a reply has unsent bytes.
    4 MB of parameters: more than a fresh connection may send at once."""
    async with _answering(Params(1, True, {"w": make_codec("fp32").encode(torch.zeros(1 << 20))})) as (listener, conn):
        request = asyncio.ensure_future(conn.request(Ack(0), 30))
        seen = []
        while not request.done():
            seen += [c.replying() for c in listener.accepted]
            await asyncio.sleep(0.0005)
        reply = request.result()
        assert isinstance(reply, Params) and reply.tensors["w"].shape == (1 << 20,)
        (server_conn,) = listener.accepted
        assert True in seen and not server_conn.replying()  # sent whole, and forgotten


async def test_sent_replies_are_forgotten() -> None:
    """A PS without a site never asks `replying`: the streams it remembers stay bounded anyway."""
    async with _answering(Ack(0)) as (listener, conn):
        for _ in range(3 * REPLIES_KEPT):
            await conn.request(Ack(0), 30)
        (server_conn,) = listener.accepted
        assert len(server_conn._replies) <= REPLIES_KEPT + 1
