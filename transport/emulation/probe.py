"""Path probing: a bulk QUIC transfer that reports what the network signal sees of a path.

`probe_path` sends as fast as the connection allows for a while and reads the sending side's
`NetworkSignal`; `ProbeSink` is the receiving end (a QUIC server that discards stream data and
counts it); `probe_link` runs sink, `LinkEmulator` and sender on loopback to measure an emulated
link; `probe_ps` measures the path to a running PS with PROBE messages over an authenticated
connection that never joins training. `netsense probe` is the CLI (docs/BENCHMARKS.md quotes its figures).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from aioquic.asyncio import QuicConnectionProtocol, connect, serve
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import QuicEvent, StreamDataReceived

from netsense.errors import AuthError, PeerError, ProtocolError

from ..channel import open_connection, tune_socket
from ..handshake import authenticate, expect_reply
from ..sensing.aioquic_private import bound_port, connection_of, transport_of, use_monotonic_clock
from ..sensing.signal import NetworkSignal, SignalReader
from ..tls import TransportSettings, client_configuration, make_dev_certs, server_configuration
from ..wire import Ack, Bye, Limits, Probe
from .emulator import LinkEmulator
from .linkspec import DuplexSpec

CHUNK = 256 * 1024
AHEAD_BYTES = 2 * 1024 * 1024
"""aioquic has no backpressure: keep this much queued beyond what was acknowledged, no more."""


@dataclass(frozen=True)
class ProbeResult:
    """What a bulk transfer measured. Rates in Mbit/s (10^6 bit/s), times in ms."""

    goodput_mbit: float
    """Stream bytes delivered per second over the transfer (receiver count when local, else acked)."""
    bw_estimate_mbit: float | None
    """The sensing controller's bottleneck estimate (windowed max delivery rate) at the end."""
    min_rtt_ms: float | None
    """Minimum RTT seen by the connection."""
    srtt_ms: float | None
    """Smoothed RTT at the end (includes the queue the transfer built)."""
    loss_rate: float
    """Lost / (acked + lost) packets over the recent loss window."""
    samples: int
    """Delivery-rate samples taken."""
    seconds: float
    """Length of the bulk phase."""
    emulator_late_fraction: float | None = None
    """Share of the data direction's datagrams the in-process emulator released late (CPU-starved:
    `DirectionStats.late_fraction`); None for a real path."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _SinkProtocol(QuicConnectionProtocol):
    sink: ProbeSink

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        use_monotonic_clock(self)

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, StreamDataReceived):
            self.sink.add(len(event.data))


class ProbeSink:
    """A QUIC server that accepts any connection and discards its stream data, counting it."""

    def __init__(self) -> None:
        self.received = 0
        self.first: float | None = None
        self.last = 0.0
        self._server: Any = None

    def add(self, size: int) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        self.last = now
        self.received += size

    def goodput_Bps(self) -> float:
        return self.received / max(self.last - (self.first or self.last), 1e-3)

    async def start(self, host: str, port: int, configuration: QuicConfiguration, socket_buffer_bytes: int) -> int:
        protocol = type("BoundSink", (_SinkProtocol,), {"sink": self})
        self._server = await serve(host, port, configuration=configuration, create_protocol=protocol)
        tune_socket(transport_of(self._server), socket_buffer_bytes)
        return bound_port(self._server)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


async def probe_path(
    host: str, port: int, configuration: QuicConfiguration, seconds: float, *, socket_buffer_bytes: int = 8 << 20
) -> tuple[NetworkSignal, float]:
    """Bulk-send to `host:port` for `seconds`; returns the final signal and the acked goodput (B/s)."""
    async with connect(host, port, configuration=configuration) as client:
        tune_socket(transport_of(client), socket_buffer_bytes)
        quic = connection_of(client)
        reader = SignalReader(quic)
        stream_id = quic.get_next_available_stream_id()
        chunk = b"\0" * CHUNK
        written = 0
        start = time.monotonic()
        base = reader.state.delivered
        while time.monotonic() < start + seconds:
            while written - (reader.state.delivered - base) < AHEAD_BYTES:
                quic.send_stream_data(stream_id, chunk)
                written += CHUNK
            client.transmit()
            await asyncio.sleep(0.002)
        signal = reader.read()
        acked = (reader.state.delivered - base) / max(time.monotonic() - start, 1e-3)
        client.close()
    return signal, acked


def _result(signal: NetworkSignal, goodput_Bps: float, seconds: float) -> ProbeResult:
    return ProbeResult(
        goodput_mbit=goodput_Bps * 8 / 1e6,
        bw_estimate_mbit=None if signal.bandwidth is None else signal.bandwidth * 8 / 1e6,
        min_rtt_ms=None if signal.min_rtt is None else signal.min_rtt * 1e3,
        srtt_ms=None if signal.srtt is None else signal.srtt * 1e3,
        loss_rate=signal.loss_rate,
        samples=signal.rate_samples,
        seconds=seconds,
    )


async def probe_link(
    spec: DuplexSpec | str, seconds: float, transport: TransportSettings | None = None
) -> ProbeResult:
    """Measure an emulated link: sink, emulator and sender on loopback, in this process."""
    # The emulator stands for a path: its packets are `max_datagram_size`, though its port is local.
    transport = replace(transport or TransportSettings(), local_max_datagram_size=0)
    sink = ProbeSink()
    # aioquic reads the CA file at handshake time: the folder lives until the transfer is over
    with tempfile.TemporaryDirectory(prefix="netsense-probe-") as d:
        certs = make_dev_certs(d, hosts=["127.0.0.1"])
        server_cfg = server_configuration(certs.cert, certs.key, transport)
        client_cfg = client_configuration(transport, ca=certs.ca, server_name="127.0.0.1")
        port = await sink.start("127.0.0.1", 0, server_cfg, transport.socket_buffer_bytes)
        try:
            async with LinkEmulator(upstream=("127.0.0.1", port), spec=spec) as emu:
                host, eport = emu.address
                signal, _ = await probe_path(
                    host, eport, client_cfg, seconds, socket_buffer_bytes=transport.socket_buffer_bytes
                )
                late = emu.stats().up.late_fraction
        finally:
            sink.close()
    return replace(_result(signal, sink.goodput_Bps(), seconds), emulator_late_fraction=late)


async def probe_remote(
    host: str, port: int, configuration: QuicConfiguration, seconds: float, *, socket_buffer_bytes: int = 8 << 20
) -> ProbeResult:
    """Measure the path to a remote sink (goodput from acknowledged bytes)."""
    signal, acked = await probe_path(host, port, configuration, seconds, socket_buffer_bytes=socket_buffer_bytes)
    return _result(signal, acked, seconds)


PS_PROBE_BYTES = 1024 * 1024
"""Payload of one PROBE message (well under the PS's `Limits.max_probe_bytes`)."""
PS_PROBE_IN_FLIGHT = 4
"""PROBE requests kept outstanding: enough to fill the window, bounded memory on both ends."""


async def probe_ps(
    host: str,
    port: int,
    configuration: QuicConfiguration,
    seconds: float,
    *,
    secret: bytes | None,
    probe_id: str = "netsense-probe",
    socket_buffer_bytes: int = 8 << 20,
) -> ProbeResult:
    """Measure the path to a running PS: authenticate with role ``probe`` (never a worker, never in
    the barrier), keep PROBE messages in flight for `seconds`, read the sending side's signal."""

    refused = f"PS at {host}:{port} refused the probe"

    async def request(conn: Any, msg: Any, expect: type) -> Any:
        try:
            reply = await conn.request(msg, 30.0)
        except PeerError as exc:
            if exc.code == "auth":
                raise AuthError(f"{refused}: {exc.reason}") from None
            raise
        return expect_reply(reply, expect)

    async with open_connection(host, port, configuration, limits=Limits(), socket_buffer_bytes=socket_buffer_bytes) as conn:
        await authenticate(conn, client_id=probe_id, rank=0, secret=secret, timeout_s=30.0, refused=refused, role="probe")
        reader = SignalReader(conn.quic)
        base, start = reader.state.delivered, time.monotonic()
        payload = Probe(b"\0" * PS_PROBE_BYTES)

        async def pump() -> None:
            while time.monotonic() < start + seconds:
                await request(conn, payload, Ack)

        await asyncio.gather(*(pump() for _ in range(PS_PROBE_IN_FLIGHT)))
        elapsed = max(time.monotonic() - start, 1e-3)
        signal = reader.read()
        acked = (reader.state.delivered - base) / elapsed
        try:
            await asyncio.wait_for(request(conn, Bye("probe done"), Ack), 2.0)
        except (asyncio.TimeoutError, PeerError, ProtocolError):
            pass  # best effort: the connection closes either way
    return _result(signal, acked, elapsed)
