"""Keyword settings of a policy: one frozen dataclass per policy, checked once, with errors that
name the policy and the setting (a config typo is a `ConfigError`, not a TypeError mid-run)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

from netsense.errors import ConfigError

from .base import Policy
from .ladder import Ladder
from .registry import PolicyFactory

_S = TypeVar("_S")


def build_settings(cls: type[_S], policy: str, settings: dict[str, Any]) -> _S:
    """`cls(**settings)`, with unknown or ill-typed keys reported as `ConfigError`."""
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ConfigError(
            f"policy {policy!r} has no setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    try:
        return cls(**settings)
    except TypeError as exc:
        raise ConfigError(f"policy {policy!r}: bad settings {settings!r}: {exc}") from exc


def settings_factory(name: str, policy: Callable[[Ladder, Any], Policy], settings_cls: type) -> PolicyFactory:
    """Factory for a policy that takes no argument and one settings dataclass of keywords."""

    def factory(arg: str | None, ladder: Ladder, /, **settings: Any) -> Policy:
        if arg is not None:
            raise ConfigError(f"policy {name!r} takes no argument, got {arg!r}")
        return policy(ladder, build_settings(settings_cls, name, settings))

    return factory


def require(ok: bool, policy: str, field: str, value: Any, rule: str) -> None:
    """Raise `ConfigError` naming `policy`'s setting `field` unless `ok` (`rule`: what it must be)."""
    if not ok:
        raise ConfigError(f"policy {policy!r}: setting {field}={value!r} must be {rule}")
