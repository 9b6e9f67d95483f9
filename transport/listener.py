"""The server side of the QUIC message channel: each connection's requests served as tasks, the
pre-authentication flow-control gate, and the listener that can stop them all.

Every request (one stream) is served by its own task, which hands the message to the connection's
session (the PS's `WorkerSession`) and answers on the same stream. The `Listener` knows every
connection it accepted, so a stop cancels and then awaits the requests still being served instead
of leaving their tasks pending for a loop that may close first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from aioquic.asyncio.server import QuicServer
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import StreamDataReceived

from netsense.errors import NetSenseError, ProtocolError

from .channel import MessageProtocol, tune_socket
from .localpeer import peer_picker
from .logsafe import LogLimiter, printable, suppressed_note
from .messages import Error, Limits, Message
from .sensing.aioquic_private import (
    bound_port,
    is_closing,
    raise_receive_window,
    raise_stream_window,
    received_stream_bytes,
    serve_per_peer,
    stream_unsent,
    transport_of,
)

log = logging.getLogger(__name__)


REPLIES_KEPT = 64
"""Reply streams remembered for `ServerConnection.replying` before the sent ones are forgotten."""


class ServerConnection(MessageProtocol):
    """Server side of one peer: decode, dispatch to the handler, answer on the same stream.

    With `preauth_budget` set, a connection starts with the small receive window the server's
    configuration grants and may use at most `preauth_budget` bytes of it until the handler calls
    `open_window` (the PS does once the peer authenticated): a stranger cannot make the server
    hold megabytes per connection."""

    handler_factory: Callable[[ServerConnection], Any] | None = None
    preauth_budget: int | None = None
    """Stream bytes a connection may send before `open_window`; None: no gate."""
    full_window: tuple[int, int] = (0, 0)
    """(max_data, max_stream_data) granted by `open_window`."""
    bad_message_log_interval_s: float = 10.0
    """At most one 'dropped bad message' line per connection per this long."""
    accepted: set[ServerConnection] | None = None
    """The listener's live connections (`start_server` sets it), so its stop reaches their requests."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gate = self.preauth_budget
        self._grow_streams = False  # after open_window: each new stream's window is raised too
        self._bad_log = LogLimiter(self.bad_message_log_interval_s)
        self.session: Any = self.handler_factory(self) if self.handler_factory else None
        self._replies: set[int] = set()  # streams whose reply may still hold unsent bytes (`replying`)
        self._tasks: set[asyncio.Task[None]] = set()
        self.max_concurrent = 256
        if self.accepted is not None:
            self.accepted.add(self)

    @property
    def window_open(self) -> bool:
        """True once `open_window` ran (or when there is no pre-authentication gate)."""
        return self._gate is None

    def open_window(self) -> None:
        """Grant the full flow-control windows (MAX_DATA / MAX_STREAM_DATA go out now)."""
        if self._gate is None:
            return
        self._gate = None
        self._grow_streams = True
        raise_receive_window(self._connection, *self.full_window)
        self.transmit()

    def _on_data(self, event: StreamDataReceived) -> None:
        if self._grow_streams and event.stream_id not in self._buffers and event.stream_id not in self._refused:
            # A new stream starts at the small window the handshake announced; grant it the full one.
            raise_stream_window(self._connection, event.stream_id, self.full_window[1])
        super()._on_data(event)

    def transmit(self) -> None:
        # aioquic calls this after every datagram it processed, before it would send a window
        # update: a gated connection over its budget is closed here, so it never earns more credit.
        gate = self._gate
        if gate is not None and received_stream_bytes(self._connection) > gate:
            self._gate = None
            reason = f"sent more than {gate} bytes before authenticating"
            if self.session is not None and hasattr(self.session, "refuse"):
                self.session.refuse(reason)
            else:
                self.close(error_code=0x1, reason_phrase=reason)
            return
        super().transmit()

    def message_received(self, stream_id: int, msg: Message) -> None:
        if len(self._tasks) >= self.max_concurrent:
            self.send_message(stream_id, Error("busy", f"more than {self.max_concurrent} requests in flight"))
            return
        task = asyncio.get_event_loop().create_task(self._serve(stream_id, msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, stream_id: int, msg: Message) -> None:
        try:
            reply = await self.session.handle(msg)
        except ProtocolError as exc:
            reply = Error(exc.code, exc.reason)
        except NetSenseError as exc:  # e.g. bad optimizer settings in INIT
            reply = Error("refused", str(exc))
        except Exception as exc:  # a handler bug must not take the server down
            log.exception("handler failed on %s", type(msg).__name__)
            reply = Error("internal", f"{type(exc).__name__}: {exc}")
        if reply is not None and not is_closing(self._connection):
            self.send_message(stream_id, reply)
            self._replies.add(stream_id)
            if len(self._replies) > REPLIES_KEPT:  # nobody asks at a PS without a site: forget the sent ones
                self.replying()

    def replying(self) -> bool:
        """Whether a reply of ours still has bytes aioquic has not sent once (it is past this host
        only when not; `ps/release.py` holds other peers' pulls on it)."""
        for sid in list(self._replies):
            if not stream_unsent(self._connection, sid):
                self._replies.discard(sid)
        return bool(self._replies)

    def stream_failed(self, stream_id: int, reason: str) -> None:
        """The peer withdrew a request (a push re-encoded mid-flight): it gets no answer, so our
        side of the stream is reset too, which lets both ends forget it."""
        try:
            self._connection.reset_stream(stream_id, 0)
        except ValueError as exc:  # not a stream we may send on
            log.debug("stream %d: %s (%s)", stream_id, reason, exc)
            return
        self.transmit()

    def message_failed(self, stream_id: int, exc: ProtocolError) -> None:
        suppressed = self._bad_log.allow(None)
        if suppressed is not None:
            peer = getattr(self.session, "peer", "?") if self.session is not None else "?"
            log.warning("dropped bad message from %s: %s%s", printable(peer), printable(exc), suppressed_note(suppressed))
        if self.session is not None and hasattr(self.session, "on_bad_message"):
            self.session.on_bad_message(exc)
        self.send_message(stream_id, Error(exc.code, exc.reason))

    def cancel_requests(self) -> list[asyncio.Task[None]]:
        """Cancel every request still being served; returns their tasks, for the caller to await."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        return tasks

    def terminated(self, reason: str) -> None:
        self.cancel_requests()
        if self.accepted is not None:
            self.accepted.discard(self)
        if self.session is not None and hasattr(self.session, "on_close"):
            self.session.on_close(reason)


async def start_server(
    host: str,
    port: int,
    configuration: QuicConfiguration,
    handler_factory: Callable[[ServerConnection], Any],
    *,
    limits: Limits = Limits(),
    socket_buffer_bytes: int = 8 * 1024 * 1024,
    preauth_window_bytes: int | None = None,
) -> Listener:
    """Listen for QUIC connections; each gets a session from `handler_factory(connection)`.

    `preauth_window_bytes` set: connections start with receive windows of that size (instead of
    the configuration's) and a budget of half of it, until the session calls `open_window`."""
    accepted: set[ServerConnection] = set()
    attrs: dict[str, Any] = {"handler_factory": staticmethod(handler_factory), "limits": limits, "socket_buffer_bytes": socket_buffer_bytes}
    attrs["accepted"] = accepted
    if preauth_window_bytes is not None:
        attrs["full_window"] = (configuration.max_data, configuration.max_stream_data)
        # Half the window: aioquic doubles a window once half of it is used; the gate closes first.
        attrs["preauth_budget"] = preauth_window_bytes // 2
        configuration = replace(
            configuration,
            max_data=min(configuration.max_data, preauth_window_bytes),
            max_stream_data=min(configuration.max_stream_data, preauth_window_bytes),
        )
    protocol = type("BoundServerConnection", (ServerConnection,), attrs)
    server = await serve_per_peer(host, port, configuration, peer_picker(configuration), protocol)
    tune_socket(transport_of(server), socket_buffer_bytes)
    return Listener(server, accepted)


class Listener:
    """A listening QUIC server and the connections it accepted.

    `close` alone leaves the cancelled requests to finish on the loop's next iterations; a loop
    stopped before then destroyed them pending ("Task was destroyed but it is pending!"), so a
    clean stop awaits them (`stop`)."""

    def __init__(self, quic: QuicServer, accepted: set[ServerConnection]) -> None:
        self.quic = quic
        self.accepted = accepted
        """Connections not yet terminated (each adds and removes itself)."""
        self._stopping: list[asyncio.Task[None]] | None = None

    @property
    def port(self) -> int:
        """The UDP port it listens on (useful with port 0)."""
        return server_port(self)

    def close(self) -> None:
        """Stop listening, close every connection and cancel the requests they are serving."""
        if self._stopping is not None:
            return
        self._stopping = [task for conn in list(self.accepted) for task in conn.cancel_requests()]
        self.quic.close()

    async def stop(self) -> None:
        """`close`, then wait until every cancelled request has finished."""
        self.close()
        await asyncio.gather(*(self._stopping or ()), return_exceptions=True)


def server_port(server: Listener) -> int:
    """The UDP port a server listens on (useful with port 0)."""
    return bound_port(server.quic)
