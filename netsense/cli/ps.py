"""`netsense ps`: run one parameter server until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys

from netsense.cli.flags import add_config_flag, add_job_flags, resolve_config
from netsense.config import override
from netsense.devcerts import ensure_certs
from netsense.errors import ConfigError
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
    p.add_argument("--checkpoint-dir", metavar="DIR", help="write atomic checkpoints here (default: none)")
    p.add_argument("--checkpoint-every", type=int, metavar="N", help="checkpoint every N applied steps (default 100)")
    p.add_argument("--checkpoint-every-s", type=float, metavar="S", help="also checkpoint every S seconds")
    p.add_argument(
        "--resume", nargs="?", const=True, default=None, metavar="DIR",
        help="resume from the newest valid checkpoint in DIR (default: --checkpoint-dir), and keep checkpointing there",
    )  # fmt: skip
    add_job_flags(p, staleness=True, metrics=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = resolve_config(args)
    config = override(
        config, server__host=args.host, server__port=args.port, server__policy=args.policy,
        server__decision_log=args.decision_log,
    )  # fmt: skip
    resume_dir = args.resume if isinstance(args.resume, str) else None
    config = override(
        config,
        server__checkpoint_dir=resume_dir or args.checkpoint_dir,
        server__checkpoint_every_steps=args.checkpoint_every,
        server__checkpoint_every_s=args.checkpoint_every_s,
    )
    state = None
    if args.resume is not None:
        if config.server.checkpoint_dir is None:
            raise ConfigError("--resume needs a folder: --resume DIR or --checkpoint-dir DIR")
        state, path = checkpoint.load_latest(config.server.checkpoint_dir)
        log.info("resuming from %s (version %d)", path, state["version"])
    certs = ensure_certs(config.security.certs_dir, create=config.security.certs_dir is None or config.security.insecure)
    secret = None if config.security.insecure else load_secret(certs.secret)
    quic_config = server_configuration(certs.cert, certs.key, config.transport)
    server = PSServer(config.server, secret=secret)
    if state is not None:
        server.restore(state)
    return run_loop(_serve(server, quic_config, config.transport.socket_buffer_bytes, args.metrics_port))


async def _serve(server: PSServer, quic_config, socket_buffer_bytes: int, metrics_port: int | None = None) -> int:  # type: ignore[no-untyped-def]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    port = await server.start(quic_config, socket_buffer_bytes)
    metrics = MetricsServer(PSCollector(server), metrics_port) if metrics_port is not None else None
    ready = {"event": "ready", "port": port, "version": server.store.version}
    if metrics is not None:
        ready["metrics_port"] = metrics.port
    print(json.dumps(ready), flush=True)
    await stop.wait()
    log.info("stopping at version %d", server.store.version)
    server.close()
    if metrics is not None:
        metrics.close()
    await server.flush_checkpoint()
    print(json.dumps({"event": "stopped", "version": server.store.version, "errors_sent": server.errors_sent, "applied_steps": server.store.applied_steps}), flush=True)
    sys.stdout.flush()
    return 0
