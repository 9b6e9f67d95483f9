"""`netsense probe`: measure a path with a bulk QUIC transfer and print what the signal sees."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from netsense.errors import ConfigError
from netsense.transport.emulation.linkspec import parse_link
from netsense.transport.loop import run as run_loop
from netsense.transport.auth import load_secret
from netsense.transport.emulation.probe import probe_link, probe_ps
from netsense.transport.tls import TransportSettings, client_configuration

EPILOG = """\
Examples:
  netsense probe --link rate=50mbit,delay=10ms --seconds 3
  netsense probe --link rate=100mbit,delay=10ms --max-datagram-size 16000 --json probe.json
  netsense probe --trace cellular.trace --link delay=30ms
  netsense probe --ps 10.0.0.5:4433 --ca certs/ca.pem --secret certs/secret --seconds 3
Prints and (with --json) writes {goodput_mbit, bw_estimate_mbit, min_rtt_ms, srtt_ms, loss_rate, samples}.
The sink, the emulator and the sender share this machine's CPU: at 100 Mbit/s on 2 cores use large
datagrams (loopback carries up to 65 kB) or the sender, not the link, is the bottleneck.
--ps measures the real path to a running PS instead: it authenticates like a worker (same CA and
secret) with role "probe", so it never joins the training barrier; the PS acknowledges and drops
the PROBE payloads (at most 16 MiB each)."""


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
    p.add_argument("--ps", metavar="HOST:PORT", help="probe the path to this running PS instead of an emulated link")
    p.add_argument("--ca", metavar="FILE", help="with --ps: CA certificate to verify the PS against")
    p.add_argument("--secret", metavar="FILE", help="with --ps: the job's shared secret file")
    p.add_argument("--server-name", metavar="NAME", help="with --ps: name in the PS certificate (default: HOST)")
    p.add_argument("--insecure", action="store_true", help="with --ps: no TLS verification, no secret (local only)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.seconds > 0:
        raise ConfigError(f"--seconds must be > 0, got {args.seconds}")
    transport = TransportSettings()
    if args.max_datagram_size:
        transport = TransportSettings(max_datagram_size=args.max_datagram_size, local_max_datagram_size=0)  # a PS on this host too
    if args.ps:
        doc = {"ps": args.ps, **_probe_ps(args, transport).to_dict()}
    else:
        spec = parse_link(args.link, trace=args.trace)
        doc = {"link": spec.describe(), **run_loop(probe_link(spec, args.seconds, transport)).to_dict()}
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


def _probe_ps(args: argparse.Namespace, transport: TransportSettings):  # type: ignore[no-untyped-def]
    if args.link or args.trace:
        raise ConfigError("--ps measures the real path to a PS: drop --link/--trace")
    host, sep, port = args.ps.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"--ps must be HOST:PORT, got {args.ps!r}")
    if not args.insecure and not (args.ca and args.secret):
        raise ConfigError("--ps needs --ca FILE and --secret FILE (from `netsense certs`), or --insecure")
    config = client_configuration(
        transport, ca=args.ca, server_name=args.server_name or host, insecure=args.insecure
    )
    secret = None if args.insecure else load_secret(args.secret)
    return run_loop(
        probe_ps(host, int(port), config, args.seconds, secret=secret, socket_buffer_bytes=transport.socket_buffer_bytes)
    )
