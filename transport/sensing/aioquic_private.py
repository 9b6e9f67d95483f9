"""The one module that reads aioquic's private state: the only file an aioquic upgrade changes.

aioquic exposes neither loss counters nor delivery-rate samples, its RTT / window / pacer state sits
in private attributes, and so do a stream's send progress, a protocol's connection, transport and
event loop, and a server's socket (docs/ARCHITECTURE.md). Every such read in the repo is a small
function here; `tests/transport/test_aioquic_private.py` checks that the paths still exist on
`TESTED_AIOQUIC_VERSION` (the version pyproject.toml pins) and that no other module reads them.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import aioquic

from netsense.errors import NetSenseError

if TYPE_CHECKING:
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.asyncio.server import QuicServer
    from aioquic.quic.congestion.base import QuicCongestionControl
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.connection import QuicConnection

TESTED_AIOQUIC_VERSION = "1.7.2"
"""The aioquic release whose internals the paths below describe (pinned in pyproject.toml)."""

PRIVATE_PATHS: tuple[str, ...] = (
    "_loss",
    "_loss._cc",
    "_loss._cc.congestion_window",
    "_loss._cc.bytes_in_flight",
    "_loss._cc.ssthresh",
    "_loss._rtt_smoothed",
    "_loss._rtt_min",
    "_loss._rtt_variance",
    "_loss._rtt_latest",
    "_loss._rtt_initialized",
    "_loss._pto_count",
    "_loss._pacer",
    "_loss._pacer.packet_time",
    "_network_paths",
    "_network_paths[0].bytes_sent",
    "_network_paths[0].addr",
    "_max_datagram_size",
    "_pacing_at",
    "_streams",
    "_close_event",
    "_local_max_data",
    "_local_max_data.used",
    "_local_max_data.value",
)
"""Every private attribute path of `QuicConnection` this module reads (checked by `check_internals`)."""

PROTOCOL_PRIVATE_PATHS: tuple[str, ...] = ("_quic", "_loop", "_transport", "_connected_waiter", "_process_events")
"""Private attributes of aioquic's asyncio `QuicConnectionProtocol` read here."""
SERVER_PRIVATE_PATHS: tuple[str, ...] = ("_transport", "_configuration")
"""Private attributes of aioquic's asyncio `QuicServer` read here."""


class QuicInternalsError(NetSenseError):
    """aioquic no longer has a private attribute NetSense reads: the pinned version was changed."""


def _resolve(obj: Any, path: str, root: str = "QuicConnection") -> Any:
    """Follow a dotted path such as `_network_paths[0].bytes_sent`; raise naming the first missing step."""
    walked = root
    for part in path.split("."):
        name, _, index = part.partition("[")
        try:
            obj = getattr(obj, name)
        except AttributeError:
            raise QuicInternalsError(
                f"aioquic {aioquic.__version__}: {walked}.{name} does not exist (needed for "
                f"{path!r}); update transport/sensing/aioquic_private.py for this aioquic version "
                f"or pin {TESTED_AIOQUIC_VERSION}"
            ) from None
        walked += f".{name}"
        if index:
            obj = obj[int(index.rstrip("]"))]
            walked += f"[{index}"
    return obj


def check_internals(quic: QuicConnection) -> None:
    """Raise `QuicInternalsError` naming the attribute if any path in `PRIVATE_PATHS` is gone."""
    for path in PRIVATE_PATHS:
        _resolve(quic, path)


# -- connection state -------------------------------------------------------------------------


def congestion_control(quic: QuicConnection) -> QuicCongestionControl:
    """The congestion controller aioquic created for `quic` (a sensing one, if so configured)."""
    return quic._loss._cc


def pacing_at(quic: QuicConnection) -> float | None:
    """When the pacer lets the next packet go if it stopped the last send attempt, else None."""
    return quic._pacing_at


def is_closing(quic: QuicConnection) -> bool:
    """True once the connection is closing or closed (aioquic has recorded its close event)."""
    return bool(quic._close_event)


def peer_host(quic: Any) -> str | None:
    """The peer's IP address on the active path; None before aioquic knows the path."""
    paths = getattr(quic, "_network_paths", None)
    return str(paths[0].addr[0]) if paths else None


def smoothed_rtt(quic: Any) -> float | None:
    """aioquic's smoothed RTT of `quic`, seconds, as it stands (0.0 before the first sample), for
    metrics; None where there is no recovery state to read."""
    return getattr(getattr(quic, "_loss", None), "_rtt_smoothed", None)


# -- receive flow control -----------------------------------------------------------------


def received_stream_bytes(quic: QuicConnection) -> int:
    """Stream bytes the peer has used of our connection window: the highest offset of each stream,
    summed, so bytes held out of order count too (the PS bounds what a stranger may send)."""
    return int(quic._local_max_data.used)


STREAM_WINDOW_PATH = "max_stream_data_local"
"""Private path on one aioquic `QuicStream`: the stream receive window we grant."""


def raise_receive_window(quic: QuicConnection, max_data: int, max_stream_data: int) -> None:
    """Grow our connection window and every open stream's window to at least these sizes; the
    next transmit sends MAX_DATA / MAX_STREAM_DATA. (aioquic grows a window by itself only once
    half of it is used, which the PS's pre-authentication budget never lets a stranger reach.)

    Streams the peer opens later still start at the initial window the handshake announced (the
    peer holds to that until told otherwise): raise each with `raise_stream_window`."""
    limit = quic._local_max_data
    limit.value = max(int(limit.value), max_data)
    for stream_id in list(_resolve(quic, "_streams")):
        raise_stream_window(quic, stream_id, max_stream_data)


def raise_stream_window(quic: QuicConnection, stream_id: int, max_stream_data: int) -> None:
    """Grow one stream's receive window to at least `max_stream_data` (MAX_STREAM_DATA goes out
    with the next transmit); nothing for a stream aioquic does not hold or one we only send on."""
    stream = _resolve(quic, "_streams").get(stream_id)
    if stream is None:
        return
    window = int(_resolve(stream, STREAM_WINDOW_PATH))
    if 0 < window < max_stream_data:  # 0: a stream we opened to send only
        stream.max_stream_data_local = max_stream_data


# -- stream send progress -------------------------------------------------------------------


def stream_unsent(quic: QuicConnection, stream_id: int) -> bool:
    """True while `stream_id` holds bytes aioquic has not yet sent once (pipelined pushes pace on
    it: a stream whose bytes are all in flight no longer competes in the round robin)."""
    stream = _resolve(quic, "_streams").get(stream_id)
    return stream is not None and not _resolve(stream, STREAM_UNSENT_PATH)


STREAM_UNSENT_PATH = "sender.buffer_is_empty"
"""Private path on one aioquic `QuicStream` (not on the connection, so `check_internals` cannot
check it up front; `stream_unsent` raises `QuicInternalsError` naming it, and a test reads it)."""


STREAM_SEND_PATHS = ("sender._buffer_start", "sender.highest_offset", "sender._buffer_fin")
"""Private paths on one aioquic `QuicStream` that `stream_send_state` reads: the acknowledged
prefix, the highest offset ever sent, and the final size once the FIN was written (None before)."""


class StreamSendState(NamedTuple):
    """How far one stream's send has got, in bytes of its payload."""

    acked: int
    """The contiguous prefix the peer acknowledged."""
    sent: int
    """The highest offset sent at least once."""
    final: int | None
    """The stream's final size once the application ended it, else None."""

    @property
    def fin_sent(self) -> bool:
        """True once the last byte (and with it the FIN) has left at least once: from then on the
        peer may hold the whole message, so the stream must not be abandoned."""
        return self.final is not None and self.sent >= self.final


def stream_send_state(quic: QuicConnection, stream_id: int) -> StreamSendState | None:
    """The send progress of `stream_id`, or None for a stream aioquic does not (or no longer) hold."""
    stream = _resolve(quic, "_streams").get(stream_id)
    if stream is None:
        return None
    acked, sent, final = (_resolve(stream, path) for path in STREAM_SEND_PATHS)
    return StreamSendState(int(acked), int(sent), None if final is None else int(final))


# -- asyncio protocol and server ---------------------------------------------------------------


def connection_of(protocol: QuicConnectionProtocol) -> QuicConnection:
    """The `QuicConnection` behind an asyncio protocol (client or server side)."""
    quic = getattr(protocol, "_quic", None)
    if quic is None:
        raise QuicInternalsError(
            f"aioquic {aioquic.__version__}: QuicConnectionProtocol._quic does not exist"
        )
    return quic


def drop_connect_waiter(protocol: QuicConnectionProtocol) -> None:
    """Retrieve the outcome of a handshake wait that was given up (a connect timeout).

    `wait_connected` shields its future, so cancelling the wait leaves that future behind; when
    the connection is torn down aioquic sets `ConnectionError` on it, and asyncio logged "Future
    exception was never retrieved" once per retried connect attempt."""
    waiter = getattr(protocol, "_connected_waiter", None)
    if waiter is not None:
        waiter.add_done_callback(lambda f: f.cancelled() or f.exception())


def receive_datagram(protocol: QuicConnectionProtocol, data: bytes, addr: Any) -> None:
    """aioquic's `datagram_received` without the transmit at its end (the caller transmits)."""
    protocol._quic.receive_datagram(data, addr, now=protocol._loop.time())
    protocol._process_events()


def transport_of(endpoint: QuicConnectionProtocol | QuicServer) -> Any:
    """The UDP transport of an asyncio protocol or server; None before it is connected."""
    return endpoint._transport


def bound_port(endpoint: QuicConnectionProtocol | QuicServer) -> int:
    """The local UDP port of a connected protocol or a serving server (what port 0 became)."""
    return int(transport_of(endpoint).get_extra_info("sockname")[1])


async def serve_per_peer(
    host: str, port: int, configuration: QuicConfiguration, pick: Callable[[str], QuicConfiguration], create_protocol: Any
) -> QuicServer:
    """aioquic's `serve`, but each new connection gets `pick(peer address)`'s configuration
    (transport/localpeer.py: a peer on this host gets larger datagrams). aioquic builds a
    server's connections from its private `_configuration`; this sets it before every datagram
    (a cached lookup), so only a datagram that opens a connection makes it matter."""
    from aioquic.asyncio.server import QuicServer

    class _PerPeerServer(QuicServer):
        def datagram_received(self, data: bytes | str, addr: Any) -> None:
            self._configuration = pick(addr[0])
            super().datagram_received(data, addr)

    loop = asyncio.get_running_loop()
    _, server = await loop.create_datagram_endpoint(
        lambda: _PerPeerServer(configuration=configuration, create_protocol=create_protocol), local_addr=(host, port)
    )
    return server


class _MonotonicLoop:
    """Loop proxy whose clock is `time.monotonic`.

    uvloop's ``loop.time()`` advances in 1 ms steps and is frozen within an iteration; aioquic takes
    every timestamp from it, so RTTs quantise and the pacer spins (docs/ARCHITECTURE.md). Both
    clocks are CLOCK_MONOTONIC, so timers converted through ``call_later`` stay consistent.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def time(self) -> float:
        return time.monotonic()

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> asyncio.TimerHandle:
        return self._loop.call_later(max(0.0, when - time.monotonic()), callback, *args)  # type: ignore[return-value]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loop, name)


def use_monotonic_clock(protocol: QuicConnectionProtocol) -> None:
    """Make aioquic's timestamps and timers on `protocol` use `time.monotonic` (see `_MonotonicLoop`);
    call it in the protocol's `__init__`, before any timer is armed."""
    protocol._loop = _MonotonicLoop(protocol._loop)  # type: ignore[assignment]


# -- recovery ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecoveryState:
    """What aioquic's recovery object knows of one connection, read at one instant."""

    congestion_window: int
    """Congestion window, bytes."""
    bytes_in_flight: int
    """Unacknowledged bytes counted against the window."""
    ssthresh: int | None
    """Slow-start threshold, bytes; None while still in the first slow start."""
    srtt_s: float | None
    """Smoothed RTT, seconds; None before the first RTT sample."""
    min_rtt_s: float | None
    """Minimum RTT, seconds (floored at 1 ms by aioquic); None before the first RTT sample."""
    latest_rtt_s: float | None
    """Latest RTT sample, seconds (floored at 1 ms, ack delay removed); None before the first."""
    rttvar_s: float | None
    """RTT variance as aioquic computes it (from |min_rtt - latest|), seconds."""
    pto_count: int
    """Consecutive probe timeouts without an ack (reset on ack)."""
    pacing_rate_Bps: float | None
    """Pacer rate, bytes/s (cwnd / srtt); None before the first RTT sample."""
    bytes_sent: int
    """UDP payload bytes sent on the active path. (aioquic's `bytes_received` on a path stops counting
    once the path is validated -- it serves only the anti-amplification limit -- so it is not read.)"""
    max_datagram_size: int
    """Largest UDP payload the connection builds, bytes."""


def read_recovery(quic: QuicConnection) -> RecoveryState:
    """Snapshot the private recovery / path state of `quic` (one place for every private read)."""
    loss = quic._loss
    cc = loss._cc
    path = quic._network_paths[0]
    initialized = bool(loss._rtt_initialized)
    packet_time = loss._pacer.packet_time
    mds = int(quic._max_datagram_size)
    return RecoveryState(
        congestion_window=int(cc.congestion_window),
        bytes_in_flight=int(cc.bytes_in_flight),
        ssthresh=cc.ssthresh,
        srtt_s=loss._rtt_smoothed if initialized else None,
        min_rtt_s=loss._rtt_min if math.isfinite(loss._rtt_min) else None,
        latest_rtt_s=loss._rtt_latest if initialized else None,
        rttvar_s=loss._rtt_variance if initialized else None,
        pto_count=int(loss._pto_count),
        pacing_rate_Bps=mds / packet_time if packet_time else None,
        bytes_sent=int(path.bytes_sent),
        max_datagram_size=mds,
    )
