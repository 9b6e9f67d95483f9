"""Flags shared by several subcommands, and turning them into a `JobConfig`.

Precedence: defaults < ``--config FILE`` < flags. A flag left unset never overrides the file.
"""

from __future__ import annotations

import argparse
from typing import Any

from netsense.config import JobConfig, load_config, override
from netsense.errors import ConfigError


def add_metrics_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics-port", type=int, metavar="PORT", help="serve Prometheus metrics on 127.0.0.1:PORT/metrics (0 = free port)")


def add_config_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML (or JSON) job config; flags override it")


def add_security_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--certs", metavar="DIR", help="folder from `netsense certs` (default: a per-user cache dir)")
    p.add_argument("--insecure", action="store_true", default=None, help="no TLS verification, no worker auth (local experiments only)")


def add_train_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="registered model (digits-cnn) or package.module:factory")
    p.add_argument("--steps", type=int, help="synchronous steps")
    p.add_argument("--batch-size", type=int, help="samples per worker per step")
    p.add_argument("--seed", type=int, help="seed of the model init and the batch order")
    p.add_argument("--codec", help="uplink codec: fp32, fp16, bf16, qsgd:8, topk:0.01+fp16, ...")
    p.add_argument("--downlink-codec", help="PS -> worker codec (default fp32)")
    add_policy_flags(p)
    p.add_argument("--downlink-policy", help="the PS's downlink policy (default none: --downlink-codec)")
    p.add_argument("--eval-every", type=int, help="rank 0 evaluates every N steps")
    p.add_argument("--lr", type=float, help="PS optimizer learning rate")
    p.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], help="PS optimizer")
    p.add_argument(
        "--device", metavar="DEV",
        help="where workers train: cpu (default), cuda (rank r on GPU r mod count) or cuda:N; "
        "model, gradients and codecs stay there, only encoded bytes go to the host",
    )  # fmt: skip
    p.add_argument(
        "--overlap", action="store_true", default=None,
        help="push each key from a gradient hook during backward, overlapping the push with compute",
    )  # fmt: skip


def add_policy_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--policy",
        help="adaptive policy: none, fp16, fixed:CODEC, dc2, netsenseml-paper, netsense "
        "(overrides --codec; --codec X is --policy fixed:X)",
    )
    p.add_argument("--ladder", help="levels the policy picks from, least lossy first, e.g. fp32,fp16,qsgd:8,topk:0.01+fp16")
    p.add_argument("--decision-log", metavar="PATH", help="JSONL decision log: one line per step and direction")


def add_staleness_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--staleness", type=int, metavar="S",
        help="asynchronous PS: apply each push on arrival, a worker at most S versions ahead of the slowest (SSP); "
        "default: synchronous",
    )  # fmt: skip


def add_transport_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-datagram-size", type=int, help="QUIC packet payload bytes (path MTU - 28; large on loopback)")
    p.add_argument("--barrier-timeout", type=float, help="seconds the PS waits for a slow worker before dropping it from a step")
    p.add_argument(
        "--idle-timeout", type=float, metavar="S",
        help="QUIC idle timeout, seconds (> 0): a silent peer counts as dead after this (default 10; workers ping every S/3)",
    )  # fmt: skip


def add_job_flags(p: argparse.ArgumentParser, *, train: bool = False, staleness: bool = False, metrics: bool = False) -> None:
    """The flag groups that `ps`, `worker` and `launch` share, always in this order (their --help
    lists them so): training, staleness, metrics, then transport and security, which all three take."""
    if train:
        add_train_flags(p)
    if staleness:
        add_staleness_flag(p)
    if metrics:
        add_metrics_flag(p)
    add_transport_flags(p)
    add_security_flags(p)


def resolve_config(args: argparse.Namespace) -> JobConfig:
    """The job config from --config and the flags present on `args`."""
    config = load_config(getattr(args, "config", None))
    a: dict[str, Any] = vars(args)
    opt = dict(config.optimizer)
    for flag, name in (("lr", "lr"), ("optimizer", "name")):
        if a.get(flag) is not None:
            opt[name] = a[flag]
    return override(
        config,
        model=a.get("model"),
        workers=a.get("workers"),
        servers=a.get("servers"),
        optimizer=opt,
        train__steps=a.get("steps"),
        train__batch_size=a.get("batch_size"),
        train__seed=a.get("seed"),
        train__codec=a.get("codec"),
        train__policy=a.get("policy"),
        train__ladder=a.get("ladder"),
        train__decision_log=a.get("decision_log"),
        train__overlap=a.get("overlap"),
        train__device=a.get("device"),
        server__policy=a.get("downlink_policy"),
        server__ladder=a.get("ladder"),
        train__eval_every=a.get("eval_every"),
        server__downlink_codec=a.get("downlink_codec"),
        server__barrier_timeout_s=a.get("barrier_timeout"),
        server__staleness=a.get("staleness"),
        transport__max_datagram_size=a.get("max_datagram_size"),
        transport__idle_timeout_s=a.get("idle_timeout"),
        security__certs_dir=a.get("certs"),
        security__insecure=a.get("insecure"),
    )


def parse_hostports(value: str) -> list[tuple[str, int]]:
    """Comma-separated ``host:port`` list (one per PS shard, in shard order)."""
    return [parse_hostport(v.strip()) for v in value.split(",") if v.strip()]


def parse_hostport(value: str) -> tuple[str, int]:
    """``host:port`` (IPv6 as ``[::1]:4433``)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"address {value!r} must be HOST:PORT with a port in 1..65535")
    return host.strip("[]") or "127.0.0.1", int(port)
