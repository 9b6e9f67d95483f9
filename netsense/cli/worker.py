"""`netsense worker`: train as one worker of a job against a running PS."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from netsense.cli.flags import (
    add_config_flag,
    add_job_flags,
    add_site_flag,
    check_host,
    check_port,
    check_site,
    parse_hostports,
    resolve_config,
    resolve_host,
)
from netsense.compression.policy.calibration import progress_settings
from netsense.config import JobConfig
from netsense.devcerts import worker_certs
from netsense.errors import ConfigError
from netsense.launch.env import DEFAULT_PS_PORT, from_environ, resolve_job_id
from netsense.launch.jsonout import strict_json
from netsense.launch.outputs import check_output_file
from netsense.metrics import MetricsServer, WorkerCollector
from netsense.models import load_task, task_optimizer
from netsense.worker.connect import ConnectSettings
from netsense.worker.device import resolve_device
from netsense.worker.optimizer import NetSenseOptimizer
from netsense.worker.trainer import build_model, train

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "worker",
        help="run one training worker",
        description="Run one worker: connect to the PS over QUIC (TLS verified against the pinned CA, "
        "HMAC-authenticated), train the model synchronously, print a summary.",
        epilog="Examples:\n  netsense worker --ps 10.0.0.5:4433 --rank 1 --world-size 2 --certs ./certs --model digits-cnn\n"
        "  NETSENSE_PS=10.0.0.5:4433 torchrun --nproc-per-node 2 -m netsense worker --certs ./certs",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_flag(p)
    p.add_argument("--ps", help="PS address HOST:PORT, or HOST:PORT,HOST:PORT,... for PS shards in shard order (default: $NETSENSE_PS, torchrun's MASTER_ADDR or Slurm's "
                   "first node with port 4433, else 127.0.0.1:4433)")
    p.add_argument("--rank", type=int, help="this worker's rank; 0 initializes the parameters (default: RANK / SLURM_PROCID, else 0)")
    p.add_argument("--world-size", type=int, help="number of workers (default: WORLD_SIZE / SLURM_NTASKS, else config `workers`)")
    p.add_argument("--worker-id", help="stable worker name (default host-rank)")
    p.add_argument("--server-name", help="name to verify in the PS certificate (default: the PS host)")
    p.add_argument("--events", action="store_true", help="print progress as JSON lines on stdout")
    p.add_argument("--summary-json", metavar="PATH", help="write the worker's summary here")
    add_site_flag(p)
    add_job_flags(p, train=True, metrics=True)
    p.set_defaults(func=run)


def connect_settings(config: JobConfig, host: str, port: int, server_name: str | None = None) -> ConnectSettings:
    """How a worker reaches and trusts one PS (shard), from the job config."""
    sec = config.security
    if sec.insecure:
        return ConnectSettings(host, port, insecure=True, transport=config.transport)
    certs = worker_certs(sec.certs_dir)  # ca.pem and secret only: what a worker machine is given
    return ConnectSettings(
        host, port, ca=str(certs.ca), secret_file=str(certs.secret), server_name=server_name, transport=config.transport
    )


def run(args: argparse.Namespace) -> int:
    config = resolve_config(args)
    check_port("--metrics-port", args.metrics_port)
    check_host("--metrics-host", args.metrics_host)
    check_site("--site", args.site, config)
    # Written once the job runs (the log after the PS is reached, the summary at the end): checked now.
    check_output_file("--decision-log" if args.decision_log else "train.decision_log", config.train.decision_log)
    check_output_file("--summary-json", args.summary_json)
    if args.world_size is not None and args.world_size < 1:
        raise ConfigError(f"--world-size must be >= 1, got {args.world_size}")
    env = from_environ()
    if args.ps:
        addresses = parse_hostports(args.ps)
    else:
        addresses = [(env.ps_host or "127.0.0.1", env.ps_port or DEFAULT_PS_PORT)]
    for host, port in addresses:  # before the task loads: a typo is one line now, not a timeout later
        resolve_host("--ps" if args.ps else "PS address", host, port)
    args.rank = args.rank if args.rank is not None else (env.rank or 0)
    world = args.world_size if args.world_size is not None else (env.world_size if env.world_size is not None else config.workers)
    if world < 1:
        raise ConfigError(f"world size must be >= 1, got {world} (from WORLD_SIZE / SLURM_NTASKS)")
    if not 0 <= args.rank < world:
        raise ConfigError(f"rank {args.rank} is outside world size {world}")
    # Before the task loads or anything connects: a missing GPU is a start-up error, not a CUDA
    # failure in the first step. torchrun's LOCAL_RANK picks the GPU; on one machine, the rank.
    device = resolve_device(config.train.device, local_rank=env.local_rank if env.local_rank is not None else args.rank)
    task = load_task(config.model)
    optimizer = task_optimizer(task, config.model, config.optimizer)  # the PS would refuse it at INIT: say it here
    model = build_model(task, config.train.seed).to(device)  # built on the CPU: the same init on every device

    def emit(event: dict[str, Any]) -> None:
        if args.events:
            print(json.dumps({"rank": args.rank, **event}), flush=True)

    worker_id = args.worker_id or f"{socket.gethostname()}-r{args.rank}"
    if args.site is not None:
        log.info("worker %s (rank %d) at site %s", worker_id, args.rank, args.site)
    job = resolve_job_id(config.model, config.train.seed, config.train.job_id, random_part=False)
    shards = [
        dataclasses.replace(
            connect_settings(config, host, port, args.server_name), job_id=job, resume=config.train.resume, site=args.site or "",
            wan_first=config.server.wan_first,
        )
        for host, port in addresses
    ]
    with NetSenseOptimizer(
        model,
        connect=shards,
        rank=args.rank,
        world_size=world,
        worker_id=worker_id,
        optimizer=optimizer,
        codec=config.train.codec,
        policy=config.train.policy,
        ladder=config.train.ladder,
        policy_settings=progress_settings(config.train.progress_table, "up", config.train.policy),
        decision_log=config.train.decision_log,
        overlap=config.train.overlap,
    ) as opt:
        metrics = (
            MetricsServer(WorkerCollector(opt), args.metrics_port, args.metrics_host) if args.metrics_port is not None else None
        )
        if metrics is not None:
            emit({"event": "metrics", "port": metrics.port})
        try:
            summary = train(task, model, opt, rank=args.rank, world_size=world, settings=config.train, emit=emit)
        finally:
            if metrics is not None:
                metrics.close()
    summary["rank"] = args.rank
    if args.site is not None:
        summary["site"] = args.site
    emit({"event": "done", **summary})
    if args.summary_json:
        Path(args.summary_json).write_text(strict_json(summary, indent=2))
    if not args.events:
        print(strict_json(summary, indent=2))
    log.info("worker %s (pid %d) finished", worker_id, os.getpid())
    sys.stdout.flush()
    return 0
