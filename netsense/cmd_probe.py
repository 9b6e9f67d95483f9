"""`netsense probe`: measure a path with a bulk QUIC transfer and print what the signal sees."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from netsense.errors import ConfigError
from netsense.transport.linkspec import parse_link
from netsense.transport.loop import run as run_loop
from netsense.transport.probe import probe_link
from netsense.transport.tls import TransportSettings

EPILOG = """\
Examples:
  netsense probe --link rate=50mbit,delay=10ms --seconds 3
  netsense probe --link rate=100mbit,delay=10ms --max-datagram-size 16000 --json probe.json
  netsense probe --trace cellular.trace --link delay=30ms
Prints and (with --json) writes {goodput_mbit, bw_estimate_mbit, min_rtt_ms, srtt_ms, loss_rate, samples}.
The sink, the emulator and the sender share this machine's CPU: at 100 Mbit/s on 2 cores use large
datagrams (loopback carries up to 65 kB) or the sender, not the link, is the bottleneck."""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "probe",
        help="measure a (emulated) path: bandwidth estimate, RTT, loss",
        description="Send bulk data over QUIC with the sensing congestion control for --seconds and report "
        "goodput and the network signal: a local sink behind `netsense emulate`'s link (--link / --trace).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--link", default="", metavar="SPEC", help="emulated link spec, e.g. rate=50mbit,delay=10ms")
    p.add_argument("--trace", metavar="FILE", help="rate trace for both directions (CSV or Mahimahi)")
    p.add_argument("--seconds", type=float, default=3.0, metavar="S", help="length of the bulk transfer (default 3)")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON here")
    p.add_argument("--max-datagram-size", type=int, help="QUIC packet payload bytes (default 1200)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.seconds > 0:
        raise ConfigError(f"--seconds must be > 0, got {args.seconds}")
    spec = parse_link(args.link, trace=args.trace)
    transport = TransportSettings()
    if args.max_datagram_size:
        transport = TransportSettings(max_datagram_size=args.max_datagram_size)
    result = run_loop(probe_link(spec, args.seconds, transport))
    doc = {"link": spec.describe(), **result.to_dict()}
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0
