"""transport/listener.py's pre-authentication gate: a small receive window and a byte budget until
the session opens the window, then the configuration's full windows.

A stranger that streams megabytes before authenticating is closed after half the small window; the
same connection, once opened, carries a message far larger than that window.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from aioquic.quic.configuration import QuicConfiguration

from quic_certs import self_signed
from netsense.transport.channel import open_connection
from netsense.transport.listener import ServerConnection, server_port, start_server
from netsense.transport.sensing.aioquic_private import received_stream_bytes
from netsense.transport.wire import Ack, Hello, Message, Probe

WINDOW = 16 * 1024


class Session:
    """Opens the window on HELLO (standing in for the PS's AUTH); answers PROBE with ACK."""

    def __init__(self, conn: ServerConnection, seen: list[ServerConnection]) -> None:
        self.conn = conn
        seen.append(conn)

    async def handle(self, msg: Message) -> Message:
        if isinstance(msg, Hello):
            self.conn.open_window()
        return Ack(0)


async def _serve(seen: list[ServerConnection]) -> tuple[Any, int]:
    cert, key = self_signed()
    cfg = QuicConfiguration(is_client=False, max_data=64 << 20, max_stream_data=64 << 20)
    cfg.certificate, cfg.private_key = cert, key
    server = await start_server("127.0.0.1", 0, cfg, lambda c: Session(c, seen), preauth_window_bytes=WINDOW)
    return server, server_port(server)


def _client() -> QuicConfiguration:
    return QuicConfiguration(is_client=True, verify_mode=ssl.CERT_NONE, max_data=64 << 20, max_stream_data=64 << 20)


async def test_a_stranger_streaming_before_it_opened_the_window_is_closed_early() -> None:
    seen: list[ServerConnection] = []
    server, port = await _serve(seen)
    try:
        async with open_connection("127.0.0.1", port, _client()) as conn:
            quic = conn.quic
            sid = quic.get_next_available_stream_id()
            quic.send_stream_data(sid, b"\0" * (8 << 20))  # 8 MiB, never finished
            conn.transmit()
            for _ in range(100):
                if conn.closed_reason is not None:
                    break
                await asyncio.sleep(0.05)
            assert conn.closed_reason is not None and "before authenticating" in conn.closed_reason
        (srv,) = seen
        # The server granted WINDOW and closed the connection once half was used: it never held more.
        assert received_stream_bytes(srv.quic) <= WINDOW
        assert srv.bytes_in <= WINDOW
    finally:
        server.close()


async def test_once_opened_the_connection_gets_the_full_window() -> None:
    seen: list[ServerConnection] = []
    server, port = await _serve(seen)
    try:
        async with open_connection("127.0.0.1", port, _client()) as conn:
            assert isinstance(await conn.request(Hello("w0", 0, bytes(32)), 5), Ack)
            assert seen[0].window_open
            big = Probe(b"\0" * (4 << 20))  # 256x the pre-authentication window
            assert isinstance(await conn.request(big, 20), Ack)
            assert conn.closed_reason is None
    finally:
        server.close()


async def test_without_a_gate_nothing_changes() -> None:
    """Servers that do not authenticate (the probe's sink) keep their configured windows."""
    seen: list[ServerConnection] = []
    cert, key = self_signed()
    cfg = QuicConfiguration(is_client=False, max_data=8 << 20, max_stream_data=8 << 20)
    cfg.certificate, cfg.private_key = cert, key
    server = await start_server("127.0.0.1", 0, cfg, lambda c: Session(c, seen))
    try:
        async with open_connection("127.0.0.1", server_port(server), _client()) as conn:
            assert isinstance(await conn.request(Probe(b"\0" * (2 << 20)), 20), Ack)
            assert seen[0].window_open
    finally:
        server.close()
