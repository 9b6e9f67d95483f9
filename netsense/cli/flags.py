"""Flags shared by several subcommands, and turning them into a `JobConfig`.

Precedence: defaults < ``--config FILE`` < flags. A flag left unset never overrides the file.
"""

from __future__ import annotations

import argparse
import socket
from typing import Any

from netsense.config import JobConfig, SettingError, host_problem, load_config, override
from netsense.errors import ConfigError


def add_metrics_flag(p: argparse.ArgumentParser, port_help: str | None = None) -> None:
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help=port_help or "serve Prometheus metrics on METRICS_HOST:PORT/metrics (0 = free port; default: no metrics)")
    p.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                   help="address the metrics endpoint binds (default 127.0.0.1; any other address, e.g. 0.0.0.0, "
                   "exposes the metrics, unauthenticated, to the network)")


def add_site_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--site", metavar="NAME", help="the site this process runs at: logged, in the ready event / "
                   "summary, and sent to the PS, which answers other sites' pulls before its own site's "
                   "(WAN-first release); `netsense launch --sites` sets it for every child")


def check_site(flag: str, name: str | None, config: JobConfig | None = None) -> None:
    """A site name flag (None: unset) that `netsense.launch.sites` accepts and, when the config
    names sites, one of them; else a one-line `ConfigError`."""
    from netsense.launch.sites import name_problem

    if name is None:
        return
    problem = name_problem(name)
    if problem:
        raise ConfigError(f"{flag}: {problem}")
    known = [s.name for s in config.sites] if config is not None else []
    if known and name not in known:
        raise ConfigError(f"{flag}: unknown site {name!r}; the config's sites are {', '.join(known)}")


def add_config_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML (or JSON) job config; flags override it")


def add_security_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--certs", metavar="DIR", help="folder from `netsense certs` (default: a per-user cache dir)")
    p.add_argument("--insecure", action="store_true", default=None, help="no TLS verification, no worker auth (local experiments only)")


def add_train_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="registered model (digits-cnn) or package.module:factory (modules are found in the current directory, then on PYTHONPATH)")
    p.add_argument("--steps", type=int, help="synchronous steps")
    p.add_argument("--batch-size", type=int, help="samples per worker per step")
    p.add_argument("--seed", type=int, help="seed of the model init and the batch order")
    p.add_argument("--codec", help="uplink codec: fp32, fp16, bf16, qsgd:8, topk:0.01+fp16, ...")
    p.add_argument("--downlink-codec", help="PS -> worker codec in the parameter domain (default fp32)")
    add_policy_flags(p)
    p.add_argument("--downlink-policy", help="the PS's parameter-domain downlink policy (default none: --downlink-codec; setting either keeps the parameter domain)")
    p.add_argument("--eval-every", type=int, help="rank 0 evaluates every N steps")
    p.add_argument("--lr", type=float, help="PS optimizer learning rate")
    p.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], help="PS optimizer")
    p.add_argument(
        "--device", metavar="DEV",
        help="where workers train: cpu (default), cuda (rank r on GPU r mod count) or cuda:N; "
        "model, gradients and codecs stay there, only encoded bytes go to the host",
    )  # fmt: skip
    p.add_argument(
        "--overlap", action=argparse.BooleanOptionalAction, default=None,
        help="full-duplex step: push each key from a gradient hook during backward and pull it as soon as the PS "
        "applied it (same result bit for bit); default: on against a sync PS unless the model has buffers, the "
        "policy redecides (netsense) or a step is one 1 MiB bucket; --no-overlap: the plain push, barrier, pull step",
    )  # fmt: skip
    p.add_argument("--job-id", metavar="ID", help="names the job to the PS, which refuses workers of another job "
                   "(default: train.job_id, else $NETSENSE_JOB_ID, else MODEL-sSEED; launch adds a random part)")
    p.add_argument("--resume", action="store_true", default=None,
                   help="continue the job the PS holds even if its job id differs (launch: the PS shards resume their checkpoints too)")


def add_policy_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--policy",
        help="adaptive policy: none, fp16, fixed:CODEC, dc2, netsenseml-paper, accordion, gravac, netsense "
        "(overrides --codec; --codec X is --policy fixed:X)",
    )
    p.add_argument("--ladder", help="levels the policy picks from, least lossy first, e.g. fp32,fp16,qsgd:8,topk:0.01+fp16")
    p.add_argument("--decision-log", metavar="PATH", help="JSONL decision log: one line per step and direction")
    add_progress_table_flag(p)


def add_progress_table_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--progress-table", metavar="FILE",
        help="q per level from `netsense calibrate` for the netsense policy (workers read its up table, the PS its down table)",
    )  # fmt: skip


def add_staleness_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--staleness", type=int, metavar="S",
        help="asynchronous PS: apply each push on arrival, a worker at most S versions ahead of the slowest (SSP); "
        "default: synchronous",
    )  # fmt: skip
    p.add_argument(
        "--downlink-domain", choices=["auto", "params", "gradient"],
        help="what a lossy downlink compresses: the step's gradient, at its smallest push's codec, every worker "
        "and relay running the PS's optimizer (synchronous only), or the parameters' change; default auto: "
        "gradient unless --staleness or a downlink policy/codec is set",
    )  # fmt: skip


def add_transport_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-datagram-size", type=int, help="QUIC packet payload bytes, for every peer (path MTU - 28; large on loopback)")
    p.add_argument("--barrier-timeout", type=float, help="seconds the PS waits for a slow worker before dropping it from a step")
    p.add_argument(
        "--idle-timeout", type=float, metavar="S",
        help="QUIC idle timeout, seconds (> 0): a silent peer counts as dead after this (default 10; workers ping every S/3)",
    )  # fmt: skip


def add_job_flags(
    p: argparse.ArgumentParser, *, train: bool = False, staleness: bool = False, metrics: bool = False, metrics_help: str | None = None
) -> None:
    """The flag groups that `ps`, `worker` and `launch` share, always in this order (their --help
    lists them so): training, staleness, metrics, then transport and security, which all three take."""
    if train:
        add_train_flags(p)
    if staleness:
        add_staleness_flag(p)
    if metrics:
        add_metrics_flag(p, metrics_help)
    add_transport_flags(p)
    add_security_flags(p)


FLAG_FIELDS: tuple[tuple[str, str], ...] = (
    ("model", "model"),
    ("workers", "workers"),
    ("servers", "servers"),
    ("relay", "relay"),
    ("steps", "train.steps"),
    ("batch_size", "train.batch_size"),
    ("seed", "train.seed"),
    ("codec", "train.codec"),
    ("policy", "train.policy"),
    ("ladder", "train.ladder"),
    ("decision_log", "train.decision_log"),
    ("progress_table", "train.progress_table"),
    ("progress_table", "server.progress_table"),
    ("overlap", "train.overlap"),
    ("device", "train.device"),
    ("job_id", "train.job_id"),
    ("resume", "train.resume"),
    ("downlink_policy", "server.policy"),
    ("ladder", "server.ladder"),
    ("eval_every", "train.eval_every"),
    ("downlink_codec", "server.downlink_codec"),
    ("barrier_timeout", "server.barrier_timeout_s"),
    ("staleness", "server.staleness"),
    ("downlink_domain", "server.downlink_domain"),
    ("max_datagram_size", "transport.max_datagram_size"),
    ("max_datagram_size", "transport.local_max_datagram_size"),  # the size asked, for peers on this host too
    ("idle_timeout", "transport.idle_timeout_s"),
    ("certs", "security.certs_dir"),
    ("insecure", "security.insecure"),
    ("lr", "optimizer.lr"),
    ("optimizer", "optimizer.name"),
)
"""(argparse dest, config field) of the shared flags; a dest may set several fields (--ladder)."""


def resolve_config(args: argparse.Namespace, fields: dict[str, str] | None = None) -> JobConfig:
    """The job config from --config and the flags present on `args`, checked (`netsense.config.RULES`).

    `fields` maps a command's own flags (dest -> field) and replaces the shared meaning of a dest
    (`ps --policy` is the downlink policy). A bad value is one `ConfigError` naming the flag when a
    flag set it, else the field and the file."""
    a: dict[str, Any] = vars(args)
    table = [(d, f) for d, f in FLAG_FIELDS if d not in (fields or {})] + list((fields or {}).items())
    path = a.get("config")
    try:
        config = load_config(path)
    except SettingError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    opt = dict(config.optimizer)
    changes: dict[str, Any] = {}
    for dest, field in table:
        if a.get(dest) is None or (dest == "resume" and a.get("command") == "ps"):  # `ps --resume DIR` is its checkpoint's
            continue
        if field.startswith("optimizer."):
            opt[field.removeprefix("optimizer.")] = a[dest]
        else:
            changes[field.replace(".", "__")] = a[dest]
    try:
        return override(config, optimizer=opt, **changes)
    except SettingError as exc:
        flags = [f"--{d.replace('_', '-')}" for d, f in table if f == exc.path and a.get(d) is not None]
        raise ConfigError(f"{flags[0]} {exc.detail}" if flags else f"{path or 'config'}: {exc}") from None


def check_port(flag: str, port: int | None) -> None:
    """A port flag (None: unset) in 0..65535, else a one-line `ConfigError`."""
    if port is not None and not 0 <= port <= 65535:
        raise ConfigError(f"{flag} must be in 0..65535, got {port}")


def check_host(flag: str, host: str) -> None:
    """A host flag that is an IP address or a well-formed name, else a one-line `ConfigError`."""
    problem = host_problem(host)
    if problem:
        raise ConfigError(f"{flag} {problem}")


def resolve_host(flag: str, host: str, port: int = 0) -> None:
    """Fail now, in one line, if `host` does not resolve (instead of at bind or connect time)."""
    check_host(flag, host)
    try:
        socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError) as exc:
        raise ConfigError(f"{flag}: host {host!r} does not resolve ({getattr(exc, 'strerror', None) or exc})") from None


def parse_hostports(value: str) -> list[tuple[str, int]]:
    """Comma-separated ``host:port`` list (one per PS shard, in shard order)."""
    return [parse_hostport(v.strip()) for v in value.split(",") if v.strip()]


def parse_hostport(value: str) -> tuple[str, int]:
    """``host:port`` (IPv6 as ``[::1]:4433``)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"address {value!r} must be HOST:PORT with a port in 1..65535")
    return host.strip("[]") or "127.0.0.1", int(port)

