"""`netsense bench transport`: goodput of one large PUSH vs a raw aioquic bulk transfer vs plain TCP.

All three run on loopback in this process with the same packet size, so the ratios compare the
protocol stacks and not the machine. The PUSH figure is end to end from the encoded payload:
msgpack framing, QUIC, validation, decode, finite check and the optimizer step at the PS, until
the ack comes back. PUSH and raw QUIC alternate on two warm connections and PUSH / raw QUIC is the
median of the per-pair ratios, so a pair shares the load of the moment; CPU seconds per MB (both
ends are this process) are reported beside, as a measure of work that load does not inflate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import torch
from aioquic.asyncio import QuicConnectionProtocol, connect, serve
from aioquic.quic.events import StreamDataReceived

from netsense.compression import make_codec
from netsense.errors import ConfigError
from netsense.ps.server import PSServer, ServerSettings
from netsense.transport.auth import load_secret
from netsense.transport.channel import tune_socket
from netsense.transport.loop import run as run_loop
from netsense.transport.sensing.aioquic_private import connection_of, transport_of, use_monotonic_clock
from netsense.transport.tls import TransportSettings, client_configuration, make_dev_certs, server_configuration
from netsense.worker.client import Identity, PSClient


def register(kinds: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = kinds.add_parser(
        "transport",
        help="goodput of a large PUSH vs raw aioquic vs TCP on loopback",
        description=__doc__,
        epilog="Example: netsense bench transport --mb 64 --max-datagram-size 1200 --json transport.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--mb", type=float, default=32.0, help="payload size in MB (default 32)")
    p.add_argument("--repeats", type=int, default=5, help="PUSH / raw QUIC pairs and TCP runs; medians are reported (default 5)")
    p.add_argument("--max-datagram-size", type=int, default=TransportSettings.max_datagram_size, help="QUIC packet payload")
    p.add_argument("--json", metavar="PATH", help="write results here")
    p.set_defaults(func=run)


class _Sink(QuicConnectionProtocol):
    """Raw aioquic server: counts a stream's bytes and answers one byte at FIN."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        use_monotonic_clock(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        tune_socket(transport, TransportSettings.socket_buffer_bytes)

    def quic_event_received(self, event: object) -> None:
        if isinstance(event, StreamDataReceived) and event.end_stream:
            connection_of(self).send_stream_data(event.stream_id, b"k", end_stream=True)
            self.transmit()


class _Source(QuicConnectionProtocol):
    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        use_monotonic_clock(self)
        self.done: asyncio.Future[None] = asyncio.get_event_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        tune_socket(transport, TransportSettings.socket_buffer_bytes)

    def quic_event_received(self, event: object) -> None:
        if isinstance(event, StreamDataReceived) and event.end_stream and not self.done.done():
            self.done.set_result(None)


class _RawQuic:
    """One raw aioquic connection to a `_Sink`; each `transfer` sends the bytes on a new stream."""

    def __init__(self, client: _Source) -> None:
        self.client = client

    async def transfer(self, data: bytes) -> None:
        quic = connection_of(self.client)
        self.client.done = asyncio.get_event_loop().create_future()
        quic.send_stream_data(quic.get_next_available_stream_id(), data, end_stream=True)
        self.client.transmit()
        await self.client.done


async def _tcp(data: bytes) -> float:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = 0
        while chunk := await reader.read(1 << 20):
            n += len(chunk)
        writer.write(b"k")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        t0 = time.perf_counter()
        writer.write(data)
        await writer.drain()
        writer.write_eof()
        await reader.read(1)
        elapsed = time.perf_counter() - t0
        writer.close()
        return elapsed
    finally:
        server.close()


async def _timed(fn: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one awaited transfer. Both ends run here, so
    the CPU time is the whole stack's work, which other processes' load does not inflate."""
    c0, t0 = time.process_time(), time.perf_counter()
    await fn()
    return time.perf_counter() - t0, time.process_time() - c0


async def _pair_runs(numel: int, repeats: int, settings: TransportSettings, certs: Any) -> dict[str, list[tuple[float, float]]]:
    """PUSH and raw QUIC timed in turn, `repeats` times each, on two warm connections.

    Alternating puts both figures of a pair under the same load; warm connections (PUSH after the
    INIT, raw QUIC after one untimed transfer) keep slow start out of both."""
    ps = PSServer(ServerSettings(port=0), secret=load_secret(certs.secret))
    port = await ps.start(server_configuration(certs.cert, certs.key, settings), settings.socket_buffer_bytes)
    sink = await serve("127.0.0.1", 0, configuration=server_configuration(certs.cert, certs.key, settings), create_protocol=_Sink)
    sink_port = transport_of(sink).get_extra_info("sockname")[1]
    fp32 = make_codec("fp32")
    cfg = client_configuration(settings, ca=certs.ca, server_name="127.0.0.1")
    client = PSClient("127.0.0.1", port, cfg, Identity("bench", 0, load_secret(certs.secret)))
    grad = torch.randn(numel)
    data = bytes(numel * 4)
    runs: dict[str, list[tuple[float, float]]] = {"push": [], "raw_quic": []}
    try:
        await client.connect()
        await client.init({"w": fp32.encode(torch.zeros(numel))}, {"name": "sgd", "lr": 0.01, "momentum": 0.0})
        async with connect("127.0.0.1", sink_port, configuration=cfg, create_protocol=_Source) as raw_client:
            raw = _RawQuic(raw_client)
            await raw.transfer(data)  # warm-up: the PUSH connection is warm from the INIT
            for step in range(repeats):
                payload = fp32.encode(grad)  # outside the timed window, as a worker's encode is
                runs["push"].append(await _timed(lambda: client.push(step, 1, 1, {"w": payload})))
                runs["raw_quic"].append(await _timed(lambda: raw.transfer(data)))
    finally:
        await client.close()
        await ps.stop()
        sink.close()
    return runs


async def measure(mb: float, repeats: int, settings: TransportSettings) -> dict[str, Any]:
    """Median seconds, goodput (MB/s) and CPU seconds per MB of each stack for `mb` megabytes;
    PUSH / raw QUIC as the median of the per-pair ratios, by wall time and by CPU time."""
    numel = int(mb * 1e6 / 4)
    nbytes = numel * 4
    with tempfile.TemporaryDirectory() as d:
        runs = await _pair_runs(numel, repeats, settings, make_dev_certs(d))
    runs["tcp"] = [(await _tcp(bytes(nbytes)), float("nan")) for _ in range(repeats)]
    out: dict[str, Any] = {"bytes": nbytes, "max_datagram_size": settings.max_datagram_size, "repeats": repeats, "stacks": {}}
    for name, pairs in runs.items():
        wall = statistics.median(w for w, _ in pairs)
        out["stacks"][name] = {
            "seconds": wall,
            "goodput_MBps": nbytes / wall / 1e6,
            "cpu_s_per_MB": statistics.median(c for _, c in pairs) / (nbytes / 1e6),
            "runs_s": [round(w, 4) for w, _ in pairs],
        }
    push, raw = runs["push"], runs["raw_quic"]
    out["push_vs_raw_quic_runs"] = [round(r / p, 4) for (p, _), (r, _) in zip(push, raw)]
    out["push_vs_raw_quic"] = statistics.median(r / p for (p, _), (r, _) in zip(push, raw))
    out["push_vs_raw_quic_cpu"] = statistics.median(rc / pc for (_, pc), (_, rc) in zip(push, raw))
    out["push_vs_tcp"] = out["stacks"]["push"]["goodput_MBps"] / out["stacks"]["tcp"]["goodput_MBps"]
    return out


def run(args: argparse.Namespace) -> int:
    if args.mb <= 0 or args.repeats < 1:
        raise ConfigError(f"--mb must be > 0 and --repeats >= 1, got {args.mb} and {args.repeats}")
    # Both ends run on loopback at the datagram size asked: no larger size for peers on this host.
    settings = TransportSettings(max_datagram_size=args.max_datagram_size, local_max_datagram_size=0)
    result = run_loop(measure(args.mb, args.repeats, settings))
    for name, r in result["stacks"].items():
        cpu = f"  {r['cpu_s_per_MB'] * 1e3:6.2f} CPU ms/MB" if name != "tcp" else ""
        print(f"{name:9s} {r['goodput_MBps']:9.1f} MB/s  ({r['seconds']:.3f} s for {result['bytes'] / 1e6:.0f} MB){cpu}")
    print(
        f"push / raw QUIC = {result['push_vs_raw_quic']:.2f} (median of pairs {result['push_vs_raw_quic_runs']}); "
        f"by CPU time {result['push_vs_raw_quic_cpu']:.2f}; push / TCP = {result['push_vs_tcp']:.3f}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0
