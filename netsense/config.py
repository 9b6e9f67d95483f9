"""Configuration: one tree of frozen dataclasses, loaded from TOML (or JSON) with CLI overrides.

Each layer owns its settings dataclass and its defaults (`TransportSettings` in transport,
`ServerSettings` in ps, `TrainSettings` in worker); this module only composes them, so a
default is written in exactly one place. Unknown keys are errors, never silently ignored.

Ranges and specs are checked here too, in one pass shared by TOML files and flags (`RULES`, then
`check_specs`), so a bad value stops the command before any process starts or socket opens, with
one line naming the field (the CLI swaps in the flag's name) and what is allowed.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import math
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netsense.compression import DEFAULT_LADDER, Ladder, make_codec, make_policy
from netsense.compression.policy.calibration import progress_settings
from netsense.errors import CompressionError, ConfigError
from netsense.launch.sites import Site, sites_problem
from netsense.ps.optim import OptimizerSettings
from netsense.ps.server import ServerSettings
from netsense.transport.tls import TransportSettings
from netsense.worker.trainer import TrainSettings


class SettingError(ConfigError):
    """One setting is out of range or names no codec/policy; `path` is its dotted TOML name, so the
    command line can name the flag that set it instead."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"{path} {detail}")
        self.path = path
        """Dotted name, e.g. ``server.port``."""
        self.detail = detail
        """What is wrong, starting with a verb: ``must be in 0..65535, got 70000``."""


@dataclass(frozen=True)
class Rule:
    """The check of one setting."""

    allowed: str
    """What is allowed, for docs/CONFIG.md: ``in 0..65535``, ``a codec spec``."""
    problem: typing.Callable[[Any], str | None]
    """None when a value is fine, else what is wrong, starting with a verb (``must be >= 1, got 0``)."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def in_range(lo: float, hi: float | None = None, *, open_lo: bool = False) -> Rule:
    """Numbers in [lo, hi] (or (lo, hi] with `open_lo`); None passes (it means "the default")."""
    if hi is not None:
        text = f"in {lo}..{hi}"
    else:
        text = f"> {lo}" if open_lo else f">= {lo}"

    def check(value: Any) -> str | None:
        if value is None:
            return None
        ok = _number(value) and (value > lo if open_lo else value >= lo) and (hi is None or value <= hi)
        return None if ok else f"must be {text}, got {value!r}"

    return Rule(text, check)


_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def host_problem(host: Any) -> str | None:
    """None for an IP literal or a well-formed DNS name; ``999.1.1.1`` is neither (all-digit labels
    are an IPv4 address or nothing). Syntax only: whether a name resolves is the caller's question."""
    if not isinstance(host, str) or not host:
        return f"must be an IP address or host name, got {host!r}"
    try:
        ipaddress.ip_address(host.strip("[]"))
        return None
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    if len(host) <= 253 and all(_LABEL.match(x) for x in labels) and not all(x.isdigit() for x in labels):
        return None
    return f"must be an IP address or host name, got {host!r}"


def _spec(build: typing.Callable[[str], Any], what: str) -> Rule:
    def check(value: Any) -> str | None:
        if value is None:
            return None
        try:
            build(value)
        except (ConfigError, CompressionError) as exc:
            return f"is not a valid {what}: {exc}"
        return None

    return Rule(f"a {what} spec", check)


def _datagram_or_off(value: Any) -> str | None:
    if value is None or value == 0 or in_range(1200, 65507).problem(value) is None:
        return None
    return f"must be 0 or in 1200..65507, got {value!r}"


def _staleness(value: Any) -> str | None:
    if value is None or (_number(value) and value >= 0):
        return None
    return f"must be >= 0 (or unset for synchronous training), got {value!r}"


RULES: dict[str, Rule] = {
    "workers": in_range(1, 256),
    "servers": in_range(1, 64),
    "sites": Rule("unique names, shards >= 1 and workers >= 0 at each site, >= 1 worker in all", sites_problem),
    "train.steps": in_range(1),
    "train.batch_size": in_range(1),
    "train.seed": in_range(0, 2**32 - 1),
    "train.eval_every": in_range(0),
    "train.codec": _spec(make_codec, "codec"),
    "train.ladder": _spec(Ladder.parse, "ladder"),
    "server.host": Rule("an IP address or host name", host_problem),
    "server.port": in_range(0, 65535),
    "server.barrier_timeout_s": in_range(0, open_lo=True),
    "server.pull_timeout_s": in_range(0, open_lo=True),
    "server.downlink_codec": _spec(make_codec, "codec"),
    "server.ladder": _spec(Ladder.parse, "ladder"),
    "server.checkpoint_every_steps": in_range(0),
    "server.checkpoint_every_s": in_range(0),
    "server.checkpoint_keep": in_range(1),
    "server.handshake_timeout_s": in_range(0, open_lo=True),
    "server.staleness": Rule(">= 0 or unset", _staleness),
    "transport.max_datagram_size": in_range(1200, 65507),
    "transport.local_max_datagram_size": Rule("0 or in 1200..65507", _datagram_or_off),
    "transport.max_data": in_range(1),
    "transport.max_stream_data": in_range(1),
    "transport.idle_timeout_s": in_range(0, open_lo=True),
    "transport.socket_buffer_bytes": in_range(0),
}
"""Per-field checks by dotted name. Policies are checked against their ladder in `check_specs`."""


def check_setting(path: str, value: Any) -> None:
    """Raise `SettingError` when `value` breaks the rule of `path` (no rule: anything goes)."""
    rule = RULES.get(path)
    problem = rule.problem(value) if rule else None
    if problem:
        raise SettingError(path, problem)


def check_specs(config: JobConfig) -> None:
    """Every field rule over the whole tree, then what spans fields: each policy over its ladder,
    and each optimizer override. Cheap (no calibration), so every `JobConfig` runs it."""
    for name in ("workers", "servers", "sites"):
        check_setting(name, getattr(config, name))
    for section in ("train", "server", "transport"):
        sub = getattr(config, section)
        for f in dataclasses.fields(sub):
            check_setting(f"{section}.{f.name}", getattr(sub, f.name))
    readers = [config.train.policy, config.server.policy]
    for section, direction in (("train", "up"), ("server", "down")):
        sub = getattr(config, section)
        settings = _progress_settings(f"{section}.progress_table", sub.progress_table, sub.policy, readers, direction)
        if sub.policy is not None:
            try:
                make_policy(sub.policy, Ladder.parse(sub.ladder or DEFAULT_LADDER), **(settings or {}))
            except (ConfigError, CompressionError) as exc:
                raise SettingError(f"{section}.policy", f"is not a valid policy: {exc}") from None
    for key, value in config.optimizer.items():
        try:
            OptimizerSettings.from_dict({key: value})
        except ConfigError as exc:
            raise SettingError(f"optimizer.{key}", f"is invalid: {exc}") from None


def _progress_settings(
    path: str, table: str | None, policy: str | None, policies: list[str | None], direction: str
) -> dict[str, Any] | None:
    """The settings a progress table file makes for `policy` (None: no file, or a policy that reads
    none: one --progress-table serves both directions), or the `SettingError` of a table that no
    policy of the job reads (only ``netsense`` does) or of a file that is not one."""
    if table is None:
        return None
    if "netsense" not in policies:
        up, down = (p or "a fixed codec" for p in policies)
        raise SettingError(path, f"is read by the netsense policy only; this job's uplink runs {up}, its downlink {down}")
    try:
        return progress_settings(table, direction, policy)
    except ConfigError as exc:
        raise SettingError(path, f"is not usable: {exc}") from None


@dataclass(frozen=True)
class SecuritySettings:
    """TLS material and worker authentication."""

    certs_dir: str | None = None
    """Folder from `netsense certs` (ca.pem, server.pem, server.key, secret); default: a cache dir."""
    insecure: bool = False
    """No TLS verification, no worker authentication. Local experiments only."""


@dataclass(frozen=True)
class JobConfig:
    """A whole job: what to train, how many workers, and how the pieces talk."""

    model: str = "digits-cnn"
    """Registered model name or ``package.module:factory``."""
    workers: int = 2
    """Worker processes (``netsense launch``)."""
    servers: int = 1
    """PS shard processes (``netsense launch``); keys are spread over them by size."""
    sites: tuple[Site, ...] = ()
    """``[[sites]]`` tables (name, workers, shards): where `netsense launch` runs each worker and PS shard; when given, workers and servers are their sums (docs/ARCHITECTURE.md, "Sites")."""
    relay: bool = True
    """With sites: a relay at every site of two or more workers when there is more than one site (``netsense launch --no-relay``: each worker crosses the WAN alone); docs/ARCHITECTURE.md, "Hierarchical aggregation"."""
    optimizer: dict[str, Any] = field(default_factory=dict)
    """PS optimizer overrides on top of the task's default (see OptimizerSettings)."""
    train: TrainSettings = field(default_factory=TrainSettings)
    """Training loop settings."""
    server: ServerSettings = field(default_factory=ServerSettings)
    """Parameter-server settings."""
    transport: TransportSettings = field(default_factory=TransportSettings)
    """QUIC settings."""
    security: SecuritySettings = field(default_factory=SecuritySettings)
    """Certificates and authentication."""

    def __post_init__(self) -> None:
        check_specs(self)


def _check_type(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            if arg is type(None) and value is None:
                return None
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _check_type(value, args[0], where)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be an array, got {value!r}")
        item = typing.get_args(hint)[0]
        return tuple(_check_type(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a table, got {value!r}")
        return from_dict(hint, value, where)
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a table, got {value!r}")
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool) and (type(value) is not hint):
        raise ConfigError(f"{where} must be {hint.__name__}, got {value!r}")
    return value


def from_dict(cls: type, data: dict[str, Any], where: str = "config") -> Any:
    """Build dataclass `cls` from a dict, checking names and types; ConfigError names the field."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ConfigError(f"unknown setting(s) {', '.join(f'{where}.{u}' for u in sorted(unknown))}; known: {sorted(names)}")
    kwargs = {k: _check_type(v, hints[k], f"{where}.{k}") for k, v in data.items()}
    for k, v in kwargs.items():  # before the settings class runs its own checks: one message style
        check_setting(f"{where}.{k}".removeprefix("config."), v)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def load_config(path: str | Path | None) -> JobConfig:
    """Load a TOML (or JSON) config file; None gives the defaults."""
    if path is None:
        return JobConfig()
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {p}: {exc}") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"config {p} is not valid {'JSON' if p.suffix == '.json' else 'TOML'}: {exc}") from None
    return with_sites(from_dict(JobConfig, data), set(data))


def with_sites(config: JobConfig, given: set[str] | None = None) -> JobConfig:
    """`config` with workers and servers the sums of its sites (unchanged without sites).

    `given` names the fields the file or flags set: one of them that disagrees with the sites is
    a `SettingError` (which count is meant cannot be guessed)."""
    if not config.sites:
        return config
    sums = {"workers": sum(s.workers for s in config.sites), "servers": sum(s.shards for s in config.sites)}
    for name, total in sums.items():
        if name in (given or set()) and getattr(config, name) != total:
            raise SettingError(name, f"is {getattr(config, name)} but the sites hold {total}; set one of them")
    return dataclasses.replace(config, **sums)


def to_dict(config: Any) -> dict[str, Any]:
    """Plain dict of a config (JSON-safe), e.g. to hand the resolved config to child processes."""
    return dataclasses.asdict(config)


def override(config: Any, **changes: Any) -> Any:
    """Copy of `config` with dotted-path changes (``train.steps=10``); None values are skipped.

    On a `JobConfig` each change is checked against `RULES` first, so a bad value is a
    `SettingError` naming its field whatever the settings class itself would say."""
    if isinstance(config, JobConfig):
        for key, value in changes.items():
            if value is not None:
                check_setting(key.replace("__", "."), value)
    nested: dict[str, dict[str, Any]] = {}
    flat: dict[str, Any] = {}
    for key, value in changes.items():
        if value is None:
            continue
        head, _, rest = key.partition("__")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            flat[key] = value
    for head, sub in nested.items():
        flat[head] = override(getattr(config, head), **sub)
    try:
        return dataclasses.replace(config, **flat)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
