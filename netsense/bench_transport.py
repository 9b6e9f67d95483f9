"""`netsense bench transport`: goodput of one large PUSH vs a raw aioquic bulk transfer vs plain TCP.

All three run on loopback in this process, one after the other, with the same packet size, so
the ratios compare the protocol stacks and not the machine. The PUSH figure is end to end: encode,
msgpack, QUIC, validation, decode and accumulate at the PS, until the ack comes back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from aioquic.asyncio import QuicConnectionProtocol, connect, serve
from aioquic.quic.events import StreamDataReceived

from netsense.compression import make_codec
from netsense.ps.server import PSServer, ServerSettings
from netsense.transport.auth import load_secret
from netsense.transport.channel import _HighResLoop, tune_socket
from netsense.transport.loop import run as run_loop
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
    p.add_argument("--repeats", type=int, default=3, help="runs per stack; the median is reported")
    p.add_argument("--max-datagram-size", type=int, default=TransportSettings.max_datagram_size, help="QUIC packet payload")
    p.add_argument("--json", metavar="PATH", help="write results here")
    p.set_defaults(func=run)


class _Sink(QuicConnectionProtocol):
    """Raw aioquic server: counts a stream's bytes and answers one byte at FIN."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._loop = _HighResLoop(self._loop)  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        tune_socket(transport, TransportSettings.socket_buffer_bytes)

    def quic_event_received(self, event: object) -> None:
        if isinstance(event, StreamDataReceived) and event.end_stream:
            self._quic.send_stream_data(event.stream_id, b"k", end_stream=True)
            self.transmit()


class _Source(QuicConnectionProtocol):
    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._loop = _HighResLoop(self._loop)  # type: ignore[assignment]
        self.done: asyncio.Future[None] = asyncio.get_event_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        tune_socket(transport, TransportSettings.socket_buffer_bytes)

    def quic_event_received(self, event: object) -> None:
        if isinstance(event, StreamDataReceived) and event.end_stream and not self.done.done():
            self.done.set_result(None)


async def _raw_quic(data: bytes, settings: TransportSettings, certs: Any) -> float:
    server = await serve("127.0.0.1", 0, configuration=server_configuration(certs.cert, certs.key, settings), create_protocol=_Sink)
    port = server._transport.get_extra_info("sockname")[1]
    try:
        cfg = client_configuration(settings, ca=certs.ca, server_name="127.0.0.1")
        async with connect("127.0.0.1", port, configuration=cfg, create_protocol=_Source) as client:
            t0 = time.perf_counter()
            client._quic.send_stream_data(client._quic.get_next_available_stream_id(), data, end_stream=True)
            client.transmit()
            await client.done
            return time.perf_counter() - t0
    finally:
        server.close()


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


async def _push(numel: int, settings: TransportSettings, certs: Any) -> list[float]:
    ps = PSServer(ServerSettings(port=0), secret=load_secret(certs.secret))
    port = await ps.start(server_configuration(certs.cert, certs.key, settings), settings.socket_buffer_bytes)
    fp32 = make_codec("fp32")
    client = PSClient(
        "127.0.0.1", port, client_configuration(settings, ca=certs.ca, server_name="127.0.0.1"),
        Identity("bench", 0, load_secret(certs.secret)),
    )  # fmt: skip
    times = []
    try:
        await client.connect()
        await client.init({"w": fp32.encode(torch.zeros(numel))}, {"name": "sgd", "lr": 0.01, "momentum": 0.0})
        grad = torch.randn(numel)
        for step in range(settings_repeats(numel)):
            payload = fp32.encode(grad)
            t0 = time.perf_counter()
            await client.push(step, 1, 1, {"w": payload})
            times.append(time.perf_counter() - t0)
    finally:
        await client.close()
        ps.close()
    return times


_REPEATS = {"n": 3}


def settings_repeats(_: int) -> int:
    return _REPEATS["n"]


async def measure(mb: float, repeats: int, settings: TransportSettings) -> dict[str, Any]:
    """Median seconds and goodput (MB/s) of each stack for `mb` megabytes."""
    numel = int(mb * 1e6 / 4)
    data = bytes(numel * 4)
    _REPEATS["n"] = repeats
    with tempfile.TemporaryDirectory() as d:
        certs = make_dev_certs(d)
        push = await _push(numel, settings, certs)
        raw = [await _raw_quic(data, settings, certs) for _ in range(repeats)]
    tcp = [await _tcp(data) for _ in range(repeats)]
    out: dict[str, Any] = {"bytes": len(data), "max_datagram_size": settings.max_datagram_size, "stacks": {}}
    for name, times in (("push", push), ("raw_quic", raw), ("tcp", tcp)):
        med = statistics.median(times)
        out["stacks"][name] = {"seconds": med, "goodput_MBps": len(data) / med / 1e6}
    s = out["stacks"]
    out["push_vs_raw_quic"] = s["push"]["goodput_MBps"] / s["raw_quic"]["goodput_MBps"]
    out["push_vs_tcp"] = s["push"]["goodput_MBps"] / s["tcp"]["goodput_MBps"]
    return out


def run(args: argparse.Namespace) -> int:
    settings = TransportSettings(max_datagram_size=args.max_datagram_size)
    result = run_loop(measure(args.mb, args.repeats, settings))
    for name, r in result["stacks"].items():
        print(f"{name:9s} {r['goodput_MBps']:9.1f} MB/s  ({r['seconds']:.3f} s for {result['bytes'] / 1e6:.0f} MB)")
    print(f"push / raw QUIC = {result['push_vs_raw_quic']:.2f}   push / TCP = {result['push_vs_tcp']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0
