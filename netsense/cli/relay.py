"""`netsense relay`: one site's relay (hierarchical aggregation) until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from dataclasses import replace

from netsense.cli.flags import (
    add_config_flag,
    add_security_flags,
    add_transport_flags,
    check_port,
    parse_hostports,
    resolve_config,
    resolve_host,
)
from netsense.compression import make_codec
from netsense.compression.feedback import require_feedback_safe
from netsense.compression.policy import build_policy
from netsense.compression.policy.calibration import progress_settings
from netsense.config import JobConfig
from netsense.devcerts import check_cert_dates, ensure_certs
from netsense.errors import ConfigError, NetSenseError
from netsense.launch.outputs import check_output_file
from netsense.relay import Relay, RelaySettings
from netsense.transport.auth import load_secret
from netsense.transport.loop import run as run_loop
from netsense.transport.messages import SITE_RE
from netsense.transport.tls import CertPaths, server_configuration
from netsense.transport.wire import JOB_ID_RE
from netsense.worker.connect import ConnectSettings

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "relay",
        help="run one site's relay: sum the site's gradients before the WAN, fan the update out",
        description="Run a relay for the workers of one site. To them it is a PS (shard i on --port + i, "
        "TLS + HMAC auth with the job's secret); to each upstream PS shard it is one worker, relay-SITE, "
        "that pushes the site's sample-weighted gradient once per step and pulls the update once. It prints "
        "one JSON line {\"event\": \"ready\", \"ports\": [...]} once it listens, then serves until SIGINT/SIGTERM.",
        epilog="Example: netsense relay --ps 10.0.0.5:4433 --site b --site-workers 2 --port 4500 --certs ./certs\n"
        "  (then the site's workers: netsense worker --ps <this host>:4500 ...)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_flag(p)
    p.add_argument("--ps", metavar="HOST:PORT[,...]", help="the upstream PS, or its shards in shard order (required)")
    p.add_argument("--host", help="address the site's workers reach the relay on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="UDP port of local shard 0, shard i on PORT + i (0 = free ports; default 4433)")
    p.add_argument("--site", help="site name: the relay joins upstream as worker relay-SITE (default: site)")
    p.add_argument("--site-workers", type=int, default=0, metavar="N",
                   help="local workers the site's first step waits for (default 0: whoever is connected)")
    p.add_argument("--upstream-world", type=int, default=0, metavar="N",
                   help="world size a passed-through INIT tells the upstream: its sites plus direct workers "
                   "(default: the INIT's world size - SITE_WORKERS + 1)")
    p.add_argument("--upstream-codec", default="fp32", metavar="SPEC",
                   help="codec of the site's push upstream (default fp32; lossy ones run under error feedback at the relay)")
    p.add_argument("--upstream-policy", metavar="SPEC",
                   help="adapt the site's push to each upstream path with this uplink policy, as a worker does "
                   "(netsense, dc2, ...; levels from the config's train.ladder, calibrated q from its train.progress_table); "
                   "replaces --upstream-codec")
    p.add_argument("--decision-log", metavar="PATH",
                   help="JSONL log of the adaptive push's decisions (with --upstream-policy; shard i of several: PATH-shard<i>)")
    p.add_argument("--server-name", help="name to verify in the upstream PS certificate (default: the PS host)")
    p.add_argument("--job-id", metavar="ID", help="the job's id, sent upstream (default: whatever job the upstream PS holds)")
    p.add_argument("--resume", action="store_true", default=None, help="continue the job the PS holds even if its id differs")
    add_transport_flags(p)
    add_security_flags(p)
    p.set_defaults(func=run)


RELAY_FIELDS = {"host": "server.host", "port": "server.port"}
"""The relay's own flags that set config fields: where it listens."""


def settings_from_args(args: argparse.Namespace, config: JobConfig, certs: CertPaths) -> RelaySettings:
    """Every relay flag checked, each with a one-line error naming it."""
    if not args.ps:
        raise ConfigError("--ps is required: HOST:PORT of the upstream PS (comma-separated for its shards)")
    addresses = parse_hostports(args.ps)
    if not addresses:
        raise ConfigError("--ps names no address: HOST:PORT of the upstream PS")
    for host, port in addresses:
        resolve_host("--ps", host, port)
    # The job's checkpoint settings are its PS shards': a relay holds no state of its own.
    server = replace(config.server, checkpoint_dir=None, checkpoint_every_steps=0, checkpoint_every_s=0.0)
    check_port("--port", server.port)
    if server.port and server.port + len(addresses) - 1 > 65535:
        raise ConfigError(f"--port {server.port} + {len(addresses)} shards runs past 65535")
    resolve_host("--host", server.host, server.port)
    site = "site" if args.site is None else args.site
    if not SITE_RE.fullmatch(site):  # it travels in HELLO (`Hello.site`)
        raise ConfigError(f"--site must be 1-32 characters of [A-Za-z0-9_.-], got {site!r}")
    for flag, value in (("--site-workers", args.site_workers), ("--upstream-world", args.upstream_world)):
        if value < 0:
            raise ConfigError(f"{flag} must be >= 0, got {value}")
    try:
        require_feedback_safe(make_codec(args.upstream_codec))
    except NetSenseError as exc:
        raise ConfigError(f"--upstream-codec is not a valid codec: {exc}") from None
    if args.decision_log is not None and args.upstream_policy is None:
        raise ConfigError("--decision-log logs the adaptive push: it needs --upstream-policy")
    if args.upstream_policy is not None:
        try:
            build_policy(args.upstream_policy, config.train.ladder, progress_settings(config.train.progress_table, "up", args.upstream_policy))
        except NetSenseError as exc:
            raise ConfigError(f"--upstream-policy: {exc}") from None
        check_output_file("--decision-log", args.decision_log)
    if config.train.job_id and not JOB_ID_RE.match(config.train.job_id):
        raise ConfigError(f"--job-id must be up to 128 characters of [A-Za-z0-9_.-:], got {config.train.job_id!r}")
    if server.staleness is not None:
        raise ConfigError("a relay aggregates synchronous steps: remove server.staleness (an asynchronous job needs no relay)")
    sec = config.security
    job = config.train.job_id or ""
    told = args.site or ""  # HELLO says the site only when it was given
    upstream = []
    for host, port in addresses:
        if sec.insecure:
            upstream.append(ConnectSettings(
                host, port, insecure=True, transport=config.transport, job_id=job, resume=config.train.resume, site=told
            ))  # fmt: skip
        else:
            upstream.append(ConnectSettings(
                host, port, ca=str(certs.ca), secret_file=str(certs.secret), server_name=args.server_name,
                transport=config.transport, job_id=job, resume=config.train.resume, site=told,
            ))  # fmt: skip
    return RelaySettings(
        upstream=tuple(upstream), site=site, server=server, site_workers=args.site_workers,
        upstream_world=args.upstream_world, upstream_codec=args.upstream_codec,
        upstream_policy=args.upstream_policy, ladder=config.train.ladder, decision_log=args.decision_log,
        progress_table=config.train.progress_table,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    config = resolve_config(args, RELAY_FIELDS)
    certs = ensure_certs(config.security.certs_dir, create=config.security.certs_dir is None or config.security.insecure)
    check_cert_dates(certs)
    settings = settings_from_args(args, config, certs)
    secret = None if config.security.insecure else load_secret(certs.secret)
    relay = Relay(settings, secret=secret)
    quic_config = server_configuration(certs.cert, certs.key, config.transport)
    return run_loop(_serve(relay, quic_config, config.transport.socket_buffer_bytes))


async def _serve(relay: Relay, quic_config, socket_buffer_bytes: int) -> int:  # type: ignore[no-untyped-def]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        ports = await relay.start(quic_config, socket_buffer_bytes)
    except OSError as exc:
        s = relay.settings.server
        raise ConfigError(f"--host/--port: cannot listen on {s.host}:{s.port}: {exc.strerror or exc}") from None
    print(json.dumps({"event": "ready", "ports": ports, "site": relay.settings.site}), flush=True)
    while not stop.is_set() and relay.failed is None:
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except asyncio.TimeoutError:
            pass
    sent, received = relay.wan_bytes()
    failed = relay.failed
    await relay.close()
    levels = relay.levels
    for shard in relay.shards:
        log.info("relay %s, shard %d, step phases: %s", relay.settings.site, shard.shard, shard.phases.summary())
    held = next((s.pushes.held_s for s in relay.shards if s.pushes is not None), None)
    if held is not None:
        log.info("WAN pushes first: the site's own shards waited %.2f s in all for the far pushes", held)
    print(json.dumps({"event": "stopped", "wan_bytes_sent": sent, "wan_bytes_received": received,
                      "error": str(failed) if failed else None, **({"levels": levels} if levels else {}),
                      "phases": relay.phases()}),
          flush=True)  # fmt: skip
    sys.stdout.flush()
    return 1 if failed is not None else 0
