"""The fixed baselines: ``none`` (fp32), ``fp16`` and ``fixed:<spec>`` send one codec always."""

from __future__ import annotations

from typing import Any

from netsense.errors import ConfigError

from .base import Policy
from .decision import ChooseRequest, Decision
from .ladder import Ladder
from .registry import PolicyFactory, register_policy


class FixedPolicy(Policy):
    """Always the same codec: the baselines `none`, `fp16` and ``fixed:<spec>``."""

    def __init__(self, ladder: Ladder, spec: str, *, name: str) -> None:
        super().__init__(ladder, name=name)
        self.index, self.level = self.level_of(spec, 1 << 20)  # validates the spec now, not mid-run

    def choose(self, request: ChooseRequest) -> Decision:
        return self._decision(
            request, level_index=self.index, level=self.level, reason="fixed", bandwidth_Bps=request.link.bandwidth_Bps
        )


def _fixed_factory(preset: str | None, name: str) -> PolicyFactory:
    def factory(arg: str | None, ladder: Ladder, /, **settings: Any) -> Policy:
        if settings:
            raise ConfigError(f"policy {name!r} takes no settings, got {', '.join(sorted(settings))}")
        if preset is not None:
            if arg is not None:
                raise ConfigError(f"policy {name!r} takes no argument, got {arg!r}")
            return FixedPolicy(ladder, preset, name=name)
        if not arg:
            raise ConfigError("policy 'fixed' needs a codec spec, e.g. 'fixed:topk:0.01+fp16'")
        return FixedPolicy(ladder, arg, name=f"fixed:{arg}")

    return factory


register_policy("none", _fixed_factory("fp32", "none"))
register_policy("fp16", _fixed_factory("fp16", "fp16"))
register_policy("fixed", _fixed_factory(None, "fixed"))
