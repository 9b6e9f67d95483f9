"""`netsense ps`: run one parameter server until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys

from netsense.cli.flags import (
    add_config_flag,
    add_job_flags,
    add_progress_table_flag,
    add_site_flag,
    check_host,
    check_port,
    check_site,
    resolve_config,
    resolve_host,
)
from netsense.devcerts import check_cert_dates, ensure_certs
from netsense.errors import ConfigError
from netsense.launch.outputs import check_output_dir, check_output_file
from netsense.metrics import MetricsServer, PSCollector
from netsense.ps import checkpoint
from netsense.ps.server import PSServer
from netsense.transport.auth import load_secret
from netsense.transport.loop import run as run_loop
from netsense.transport.tls import server_configuration

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ps",
        help="run a parameter server",
        description="Run one parameter server. It prints one JSON line {\"event\": \"ready\", \"port\": N} "
        "on stdout once it listens, then serves until SIGINT/SIGTERM.",
        epilog="Example: netsense ps --host 0.0.0.0 --port 4433 --certs ./certs",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_flag(p)
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="UDP port (0 = pick a free one; default 4433)")
    p.add_argument("--downlink-codec", help="PS -> worker codec (default fp32; the same as --policy fixed:CODEC)")
    p.add_argument("--policy", help="downlink policy: none, fp16, fixed:CODEC, dc2, netsense (default: --downlink-codec)")
    p.add_argument("--ladder", help="levels the policy picks from, least lossy first")
    p.add_argument("--decision-log", metavar="PATH", help="JSONL downlink decision log: one line per update")
    add_progress_table_flag(p)
    p.add_argument("--checkpoint-dir", metavar="DIR", help="write atomic checkpoints here (default: none)")
    p.add_argument("--checkpoint-every", type=int, metavar="N", help="checkpoint every N applied steps (default 100)")
    p.add_argument("--checkpoint-every-s", type=float, metavar="S", help="also checkpoint every S seconds")
    p.add_argument(
        "--resume", nargs="?", const=True, default=None, metavar="DIR",
        help="resume from the newest valid checkpoint in DIR (default: --checkpoint-dir), and keep checkpointing there",
    )  # fmt: skip
    add_site_flag(p)
    add_job_flags(p, staleness=True, metrics=True)
    p.set_defaults(func=run)


PS_FIELDS = {
    "host": "server.host",
    "port": "server.port",
    "policy": "server.policy",
    "decision_log": "server.decision_log",
    "checkpoint_dir": "server.checkpoint_dir",
    "checkpoint_every": "server.checkpoint_every_steps",
    "checkpoint_every_s": "server.checkpoint_every_s",
}
"""The PS's own flags; here --policy and --decision-log are the downlink's."""


def run(args: argparse.Namespace) -> int:
    if isinstance(args.resume, str):
        args.checkpoint_dir = args.resume  # --resume DIR reads and keeps checkpointing there
    config = resolve_config(args, PS_FIELDS)
    check_port("--metrics-port", args.metrics_port)
    check_host("--metrics-host", args.metrics_host)
    check_site("--site", args.site, config)
    resolve_host("--host", config.server.host, config.server.port)  # before any certificate or socket
    # Before the PS listens: a bad log folder was a traceback, a bad checkpoint folder an error per checkpoint.
    check_output_file("--decision-log" if args.decision_log else "server.decision_log", config.server.decision_log)
    ckpt_flag = "--resume" if isinstance(args.resume, str) else "--checkpoint-dir"
    check_output_dir(ckpt_flag if args.checkpoint_dir else "server.checkpoint_dir", config.server.checkpoint_dir)
    state = None
    if args.resume is not None:
        if config.server.checkpoint_dir is None:
            raise ConfigError("--resume needs a folder: --resume DIR or --checkpoint-dir DIR")
        state, path = checkpoint.load_latest(config.server.checkpoint_dir)
        log.info("resuming from %s (version %d)", path, state["version"])
    certs = ensure_certs(config.security.certs_dir, create=config.security.certs_dir is None or config.security.insecure)
    check_cert_dates(certs)
    secret = None if config.security.insecure else load_secret(certs.secret)
    quic_config = server_configuration(certs.cert, certs.key, config.transport)
    server = PSServer(config.server, secret=secret, site=args.site)
    if state is not None:
        server.restore(state)
    metrics = (args.metrics_host, args.metrics_port) if args.metrics_port is not None else None
    if args.site is not None:
        log.info("parameter server at site %s", args.site)
    return run_loop(_serve(server, quic_config, config.transport.socket_buffer_bytes, metrics, args.site))


async def _serve(  # type: ignore[no-untyped-def]
    server: PSServer, quic_config, socket_buffer_bytes: int, metrics_at: tuple[str, int] | None = None,
    site: str | None = None,
) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        port = await server.start(quic_config, socket_buffer_bytes)
    except OSError as exc:  # a port in use, an address not on this machine: one line, not a traceback
        where = f"{server.settings.host}:{server.settings.port}"
        raise ConfigError(f"--host/--port: cannot listen on {where}: {exc.strerror or exc}") from None
    metrics = MetricsServer(PSCollector(server), metrics_at[1], metrics_at[0]) if metrics_at is not None else None
    ready: dict[str, object] = {"event": "ready", "port": port, "version": server.store.version}
    if site is not None:
        ready["site"] = site
    if metrics is not None:
        ready["metrics_port"] = metrics.port
    print(json.dumps(ready), flush=True)
    await stop.wait()
    log.info("stopping at version %d", server.store.version)
    await server.stop()
    if metrics is not None:
        metrics.close()
    await server.flush_checkpoint()
    print(json.dumps({
        "event": "stopped", "version": server.store.version, "errors_sent": server.errors_sent,
        "applied_steps": server.store.applied_steps, "refused_connections": server.refused_connections,
    }), flush=True)  # fmt: skip
    sys.stdout.flush()
    return 0
