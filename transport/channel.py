"""QUIC message channel on aioquic: one message per stream, request and response on the same stream.

A client opens a bidirectional stream, writes one encoded message with FIN, and the server answers
on the same stream with FIN. Keys travel on separate streams, so a lost packet of one tensor does
not block another (no head-of-line blocking). Everything here only moves bytes; what messages
mean is decided by the handler (the PS) or the caller (the worker). This module holds what both
sides share and the client; the server side (`ServerConnection`, `start_server`) is `listener`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
from aioquic.asyncio import QuicConnectionProtocol, connect
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import ConnectionTerminated, HandshakeCompleted, QuicEvent, StreamDataReceived, StreamReset

from netsense.errors import PeerError, PeerTimeout, ProtocolError, RequestAbandoned

from .gso import SegmentingTransport
from .localpeer import for_peer
from .sensing.aioquic_private import (
    connection_of,
    drop_connect_waiter,
    receive_datagram,
    stream_send_state,
    use_monotonic_clock,
)
from .wire import Error, Limits, Message, decode_message, encode_chunks

log = logging.getLogger(__name__)


def tune_socket(transport: asyncio.BaseTransport | None, buffer_bytes: int) -> None:
    """Raise the UDP socket's buffers: losses on loopback were receive-buffer overflows."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, buffer_bytes)
        except OSError as exc:  # capped by net.core.rmem_max; not fatal
            log.debug("setsockopt %s=%d failed: %s", opt, buffer_bytes, exc)


def abandon_stream(quic: QuicConnection, stream_id: int, error_code: int = 0) -> bool:
    """Reset the sending side of `stream_id` if its FIN has never left; True when it was reset.

    A stream whose last byte was never sent cannot have been received whole, so the peer drops the
    partial message (RESET_STREAM) and the sender may send its content again, re-encoded, on a new
    stream without it being counted twice. Once the FIN left, nothing is reset: the peer may
    already hold the message (a lost FIN still counts: it may have arrived after all)."""
    state = stream_send_state(quic, stream_id)
    if state is None or state.final is None or state.fin_sent:
        return False
    quic.reset_stream(stream_id, error_code)
    return True


class _Incoming:
    """The pieces of one stream's message so far, copied into one buffer at FIN.

    Growing one bytearray per packet cost ~30 ms per 32 MB message here (reallocations onto fresh
    pages) and a join ~18-40 ms, mostly first-touch page faults; a large message is copied into a
    numpy buffer instead, which Linux backs with transparent huge pages (512x fewer faults). A
    message that arrived in one piece (every control message) is used as is."""

    __slots__ = ("pieces", "size")
    HUGE = 4 << 20
    """Messages from this size on go to a huge-page buffer."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.size = 0

    def add(self, data: bytes) -> None:
        self.pieces.append(data)
        self.size += len(data)

    def message(self) -> bytes | memoryview:
        """The whole message; framed sections are then read in place (`decode_message`)."""
        if len(self.pieces) == 1:
            return self.pieces[0]
        if self.size < self.HUGE:
            return b"".join(self.pieces)
        buf = memoryview(np.empty(self.size, dtype=np.uint8))
        pos = 0
        for piece in self.pieces:
            buf[pos : pos + len(piece)] = piece
            pos += len(piece)
        self.pieces.clear()
        return buf


class MessageProtocol(QuicConnectionProtocol):
    """Reassembles one message per stream and hands complete messages to `message_received`."""

    limits: Limits = Limits()
    socket_buffer_bytes: int = 8 * 1024 * 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        use_monotonic_clock(self)
        self._connection = connection_of(self)
        self._buffers: dict[int, _Incoming] = {}
        self._refused: set[int] = set()
        self.bytes_in = 0
        self.bytes_out = 0
        self.segmenting: SegmentingTransport | None = None
        """The transport aioquic sends through: a transmit's datagrams leave as GSO runs
        (transport/gso.py; `transport.udp_gso`)."""
        self._transmit_handle: asyncio.Handle | None = None  # the coalesced transmit to come
        self._handshake_done = False  # until then every datagram is answered at once

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        enabled = getattr(self._connection.configuration, "udp_gso", True)
        self.segmenting = SegmentingTransport(transport, enabled=enabled)
        super().connection_made(self.segmenting)  # type: ignore[arg-type]  # a DatagramTransport's face
        tune_socket(transport, self.socket_buffer_bytes)

    def datagram_received(self, data: bytes | str, addr: Any) -> None:
        """aioquic transmits after every datagram; once the handshake is done, here one transmit
        follows the datagrams the loop hands over in one pass (libuv reads up to 32 a wake-up):
        every transmit builds packets even when it has nothing to send, 2.5-3 passes per datagram
        received in a 2 x 1 digits-cnn step (docs/ARCHITECTURE.md, "One transmit per burst").
        The handshake's flights still leave at once, before anything a callback may do to the
        connection (a PS refuses a connection over its caps one loop pass after it opened)."""
        receive_datagram(self, data, addr)  # type: ignore[arg-type]  # a UDP datagram: bytes
        if not self._handshake_done:
            self.transmit()
        elif self._transmit_handle is None:
            self._transmit_handle = asyncio.get_running_loop().call_soon(self._coalesced_transmit)

    def _coalesced_transmit(self) -> None:
        self._transmit_handle = None
        self.transmit()

    def transmit(self) -> None:
        handle, self._transmit_handle = self._transmit_handle, None
        if handle is not None:  # this transmit sends what the coalesced one would have
            handle.cancel()
        segmenting = self.segmenting
        if segmenting is None:
            super().transmit()
            return
        with segmenting.batch():
            super().transmit()

    @property
    def quic(self) -> Any:
        """The sans-I/O `QuicConnection` (for the network signal)."""
        return self._connection

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, HandshakeCompleted):
            self._handshake_done = True
        elif isinstance(event, StreamDataReceived):
            self._on_data(event)
        elif isinstance(event, StreamReset):
            self._buffers.pop(event.stream_id, None)
            self.stream_failed(event.stream_id, f"stream reset by peer (code {event.error_code})")
        elif isinstance(event, ConnectionTerminated):
            self._buffers.clear()
            self.terminated(event.reason_phrase or f"error {event.error_code}")

    def _on_data(self, event: StreamDataReceived) -> None:
        sid = event.stream_id
        if sid in self._refused:
            if event.end_stream:
                self._refused.discard(sid)
            return
        buf = self._buffers.get(sid)
        if buf is None:
            buf = self._buffers[sid] = _Incoming()
        buf.add(event.data)
        self.bytes_in += len(event.data)
        if buf.size > self.limits.max_message_bytes:
            # Refuse before buffering more: answer, then ask the peer to stop sending.
            del self._buffers[sid]
            self._refused.add(sid)
            self.message_failed(sid, ProtocolError("oversize", f"message exceeds {self.limits.max_message_bytes} bytes"))
            self._connection.stop_stream(sid, 0)
            self.transmit()
            return
        if event.end_stream:
            data = self._buffers.pop(sid).message()
            try:
                msg = decode_message(data, self.limits)
            except ProtocolError as exc:
                self.message_failed(sid, exc)
                return
            self.message_received(sid, msg)

    def send_message(self, stream_id: int, msg: Message | bytes) -> int:
        """Write one message on `stream_id` and end the stream; returns bytes written.

        A message goes as its chunks (`encode_chunks`): aioquic copies each into the stream's
        send buffer, so tensor bytes are copied once here, not packed into a message first."""
        chunks = [msg] if isinstance(msg, bytes) else encode_chunks(msg)
        size = 0
        for i, chunk in enumerate(chunks):
            self._connection.send_stream_data(stream_id, chunk, end_stream=i == len(chunks) - 1)
            size += len(chunk)
        self.bytes_out += size
        self.transmit()
        return size

    # hooks -------------------------------------------------------------------------------
    def message_received(self, stream_id: int, msg: Message) -> None:
        """A complete, validated message arrived."""

    def message_failed(self, stream_id: int, exc: ProtocolError) -> None:
        """A message failed validation (it is dropped)."""

    def stream_failed(self, stream_id: int, reason: str) -> None:
        """The peer reset a stream."""

    def terminated(self, reason: str) -> None:
        """The connection is gone."""


class ClientConnection(MessageProtocol):
    """Client side: `request(msg)` sends on a fresh stream and awaits the answer on it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting: dict[int, asyncio.Future[Message]] = {}
        self.closed_reason: str | None = None

    async def wait_connected(self) -> None:
        """aioquic's, but a wait given up (a connect timeout) retrieves the handshake's outcome."""
        try:
            await super().wait_connected()
        except asyncio.CancelledError:
            drop_connect_waiter(self)
            raise

    async def request(
        self, msg: Message | bytes, timeout: float | None = None, *, on_stream: Callable[[int], None] | None = None
    ) -> Message:
        """Send `msg`, return the reply; raise `PeerError` for ERROR, `PeerTimeout` on timeout.

        `on_stream` is called with the request's stream id before it is written (to `abandon` it)."""
        if self.closed_reason is not None:
            raise PeerTimeout(f"connection closed: {self.closed_reason}")
        sid = self._connection.get_next_available_stream_id()
        fut: asyncio.Future[Message] = asyncio.get_event_loop().create_future()
        self._waiting[sid] = fut
        if on_stream is not None:
            on_stream(sid)
        self.send_message(sid, msg)
        try:
            reply = await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise PeerTimeout(f"no answer to {type(msg).__name__} within {timeout:.3g} s") from None
        finally:
            self._waiting.pop(sid, None)
        if isinstance(reply, Error):
            raise PeerError(reply.code, reply.reason)
        return reply

    def abandon(self, stream_id: int) -> bool:
        """Withdraw the request on `stream_id` while its last byte has not left: the stream is
        reset (the peer drops the partial message and never answers it) and the request raises
        `RequestAbandoned`. False, and nothing changes, once the whole request was sent once."""
        fut = self._waiting.get(stream_id)
        if fut is None or fut.done() or not abandon_stream(self._connection, stream_id):
            return False
        fut.set_exception(RequestAbandoned(f"request on stream {stream_id} abandoned before it was sent"))
        self.transmit()
        return True

    def message_received(self, stream_id: int, msg: Message) -> None:
        fut = self._waiting.get(stream_id)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def message_failed(self, stream_id: int, exc: ProtocolError) -> None:
        fut = self._waiting.get(stream_id)
        if fut is not None and not fut.done():
            fut.set_exception(exc)

    def stream_failed(self, stream_id: int, reason: str) -> None:
        fut = self._waiting.get(stream_id)
        if fut is not None and not fut.done():
            fut.set_exception(PeerTimeout(reason))

    def terminated(self, reason: str) -> None:
        self.closed_reason = reason
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(PeerTimeout(f"connection closed: {reason}"))


@contextlib.asynccontextmanager
async def open_connection(
    host: str, port: int, configuration: QuicConfiguration, *, limits: Limits = Limits(), socket_buffer_bytes: int = 8 << 20
) -> AsyncIterator[ClientConnection]:
    """Async context manager yielding a connected `ClientConnection`.

    A failed handshake raises `ConnectionError` with the reason the connection closed (TLS's
    verification error, or the peer's): aioquic's own `ConnectionError` carries none."""
    protocol = type(
        "BoundClientConnection", (ClientConnection,), {"limits": limits, "socket_buffer_bytes": socket_buffer_bytes}
    )
    made: list[ClientConnection] = []

    def create(*args: Any, **kwargs: Any) -> ClientConnection:
        made.append(protocol(*args, **kwargs))
        return made[-1]

    try:  # the address aioquic's `connect` will use, for the datagram size (transport/localpeer.py)
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        configuration = for_peer(configuration, str(infos[0][4][0]))
    except (OSError, IndexError):
        pass  # `connect` reports an unresolvable host itself
    connected = False
    try:
        async with connect(host, port, configuration=configuration, create_protocol=create) as conn:
            connected = True
            yield conn
    except ConnectionError as exc:
        if connected or not made or not made[0].closed_reason:
            raise
        raise ConnectionError(made[0].closed_reason) from exc
