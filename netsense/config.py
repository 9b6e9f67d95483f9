"""Configuration: one tree of frozen dataclasses, loaded from TOML (or JSON) with CLI overrides.

Each layer owns its settings dataclass and its defaults (`TransportSettings` in transport,
`ServerSettings` in ps, `TrainSettings` in worker); this module only composes them, so a
default is written in exactly one place. Unknown keys are errors, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netsense.errors import ConfigError
from netsense.ps.server import ServerSettings
from netsense.transport.tls import TransportSettings
from netsense.worker.trainer import TrainSettings


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
        if not 1 <= self.workers <= 256:
            raise ConfigError(f"workers must be in [1, 256], got {self.workers}")
        if not 1 <= self.servers <= 64:
            raise ConfigError(f"servers must be in [1, 64], got {self.servers}")


def _check_type(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            if arg is type(None) and value is None:
                return None
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _check_type(value, args[0], where)
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
    return from_dict(JobConfig, data)


def to_dict(config: Any) -> dict[str, Any]:
    """Plain dict of a config (JSON-safe), e.g. to hand the resolved config to child processes."""
    return dataclasses.asdict(config)


def override(config: Any, **changes: Any) -> Any:
    """Copy of `config` with dotted-path changes (``train.steps=10``); None values are skipped."""
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
