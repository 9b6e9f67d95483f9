"""Policies by name, as codecs are: ``make_policy("netsense", ladder, eps=0.2)`` or
``make_policy("fixed:topk:0.01+fp16", ladder)``; each policy module registers itself on import."""

from __future__ import annotations

from typing import Any, Protocol

from netsense.errors import ConfigError

from .base import Policy
from .ladder import DEFAULT_LADDER, Ladder


class PolicyFactory(Protocol):
    """Builds a policy from the text after ``name:`` (or None), the ladder and keyword settings."""

    def __call__(self, arg: str | None, ladder: Ladder, /, **settings: Any) -> Policy: ...


_REGISTRY: dict[str, PolicyFactory] = {}


def register_policy(name: str, factory: PolicyFactory) -> None:
    """Register `factory` under `name` so that ``make_policy(name[:arg], ...)`` finds it."""
    if not name or ":" in name:
        raise ValueError(f"policy name {name!r} must be non-empty without ':'")
    _REGISTRY[name] = factory


def policy_names() -> list[str]:
    """Names of every registered policy."""
    return sorted(_REGISTRY)


def make_policy(spec: str, ladder: Ladder, **settings: Any) -> Policy:
    """Build the policy `spec` names (``"netsense"``, ``"fixed:qsgd:4"``) over `ladder`.

    Raises `ConfigError` for an unknown name, a missing or unexpected argument, or a bad setting.
    """
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"policy spec must be a non-empty string, got {spec!r}")
    name, sep, arg = spec.partition(":")
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ConfigError(f"unknown policy {name!r} in {spec!r}; known: {', '.join(policy_names())}")
    return factory(arg if sep else None, ladder, **settings)


def build_policy(policy: str | Policy, ladder: str | Ladder | None, settings: dict[str, Any] | None = None) -> Policy:
    """A policy from a spec (``"netsense"``, ``"fixed:qsgd:4"``) over `ladder` (spec string or
    object; None: `DEFAULT_LADDER`), or `policy` itself when it is already built. What a worker's
    and a PS's configuration name, made into a policy the same way for both directions."""
    if isinstance(policy, Policy):
        return policy
    lad = ladder if isinstance(ladder, Ladder) else Ladder.parse(ladder or DEFAULT_LADDER)
    return make_policy(policy, lad, **(settings or {}))
