"""`netsense emulate`: run the userspace link emulator between clients and one server."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

from netsense.errors import ConfigError
from netsense.transport.emulation.emulator import EmulatorStats, LinkEmulator
from netsense.transport.emulation.linkspec import DuplexSpec, parse_link

EPILOG = """\
Spec fields (comma-separated, for both directions unless prefixed up. or down.):
  rate=50mbit | rate=0s:100mbit,20s:10mbit   bit/kbit/mbit/gbit/bps; step list; 0 = blackout; last Ns:loop repeats
  trace=FILE       CSV (time_s,rate_mbit) or Mahimahi packet-delivery trace
  delay=20ms       one-way propagation delay (us/ms/s)
  queue=100ms | queue=64kb   drop-tail limit, time at the mean rate or bytes (default 100ms)
  loss=0.01        random loss fraction      burst=3kb   token-bucket depth     seed=N
Example (a PS on :4433, workers connect to :5433 through a 50 Mbit/s, 40 ms RTT link):
  netsense emulate --listen 127.0.0.1:5433 --upstream 127.0.0.1:4433 \\
      --link rate=50mbit,delay=20ms,queue=50ms,up.rate=10mbit --stats-every 2
See docs/EMULATOR.md."""


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `emulate` subcommand."""
    parser = sub.add_parser(
        "emulate",
        help="relay UDP (QUIC) through an emulated link: rate, queue, delay, loss",
        description="A UDP relay that shapes each direction like a bottleneck link (docs/EMULATOR.md).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--listen", type=_host_port, default=("127.0.0.1", 0), metavar="HOST:PORT",
                        help="where clients send (default 127.0.0.1 and a free port)")
    parser.add_argument("--upstream", type=_host_port, required=True, metavar="HOST:PORT",
                        help="the server to relay to")
    parser.add_argument("--link", default="", metavar="SPEC",
                        help="link spec, e.g. rate=50mbit,delay=20ms,loss=0.01")
    parser.add_argument("--trace", default=None, metavar="FILE",
                        help="rate trace for both directions (CSV or Mahimahi); --link adds delay/queue/loss")
    parser.add_argument("--seconds", type=float, default=None, metavar="S",
                        help="stop after S seconds (default: run until Ctrl-C)")
    parser.add_argument("--stats-every", type=float, default=1.0, metavar="S",
                        help="print counters every S seconds; 0 = only at the end")
    parser.set_defaults(func=run)


def format_stats(stats: EmulatorStats, previous: EmulatorStats | None = None) -> str:
    """One line per direction: rate since ``previous`` (or start), drops by cause, queue now and at worst."""
    seconds = max(stats.uptime_s - (previous.uptime_s if previous else 0.0), 1e-9)
    lines = []
    for name in ("up", "down"):
        d = getattr(stats, name)
        sent = d.bytes_forwarded - (getattr(previous, name).bytes_forwarded if previous else 0)
        lines.append(
            f"{stats.uptime_s:8.1f}s {name:4} fwd {d.packets_forwarded} pkt {d.bytes_forwarded} B "
            f"({sent * 8 / seconds / 1e6:.2f} Mbit/s) drop queue {d.dropped_queue} loss {d.dropped_loss} "
            f"send {d.dropped_send} queue {d.queue_bytes} B {d.queue_delay_s * 1000:.1f} ms "
            f"(max {d.max_queue_delay_s * 1000:.1f} ms)"
        )
    return "\n".join(lines) + f"\n{'':9} clients {stats.clients}"


def _restart(emu: LinkEmulator, spec: DuplexSpec) -> None:
    emu.set_spec(spec)
    print("trace restarted at its time 0", flush=True)


async def _serve(args: argparse.Namespace) -> None:
    spec = parse_link(args.link, trace=args.trace)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError):  # not on Windows
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with LinkEmulator(upstream=args.upstream, spec=spec, listen=args.listen) as emu:
        with contextlib.suppress(NotImplementedError):
            # SIGUSR1 restarts a trace at its time 0 (`netsense launch` sends it when training starts,
            # so every run meets the trace from the same point however long its set-up took).
            loop.add_signal_handler(signal.SIGUSR1, _restart, emu, spec)
        host, port = emu.address
        upstream = f"{args.upstream[0]}:{args.upstream[1]}"
        print(f"emulating {spec.describe()}\nlistening on {host}:{port} -> {upstream}", flush=True)
        deadline = None if args.seconds is None else loop.time() + args.seconds
        previous = None
        try:
            while not stop.is_set():
                wait = args.stats_every if args.stats_every > 0 else 3600.0
                if deadline is not None:
                    wait = min(wait, deadline - loop.time())
                    if wait <= 0:
                        break
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
                if args.stats_every > 0 and not stop.is_set():
                    now = emu.stats()
                    print(format_stats(now, previous), flush=True)
                    previous = now
        finally:
            print("final (averages since start):\n" + format_stats(emu.stats()), flush=True)


def run(args: argparse.Namespace) -> int:
    """Relay until --seconds pass, SIGTERM or Ctrl-C; 0 on a clean stop."""
    if args.seconds is not None and args.seconds <= 0:
        raise ConfigError(f"--seconds must be > 0, got {args.seconds}")
    if args.stats_every < 0:
        raise ConfigError(f"--stats-every must be >= 0, got {args.stats_every}")
    try:
        import uvloop  # ~3x the forwarding rate of the default loop (docs/EMULATOR.md)
    except ImportError:
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        runner(_serve(args))
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    return 0
