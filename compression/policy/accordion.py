"""``accordion``: light compression in a critical regime (the gradient norm moving fast), heavy otherwise.

Theirs (Agarwal et al., "Accordion: Adaptive Gradient Communication via Critical Learning Regime
Identification", MLSys 2021; the authors' code, github.com/uw-mad-dash/Accordion, `auto_scale.py`
and `main.py`): every `switch_freq` epochs (10 for the CIFAR models, 5 for the LSTM) compare the
norm of the gradient accumulated over the epoch with that of the previous check,
ratio = |prev - new| / prev; ratio >= eta (0.5, never changed in their runs) is a critical regime
and gets the light level (PowerSGD rank 2, their `auto_scale_high`), otherwise the heavy level
(rank 1, `auto_scale_low`); the first check, with nothing to compare, and a previous norm of 0 count
as critical. The decision holds until the next check.

Ours: the unit is steps, not epochs (a policy knows no epoch): a check every `interval` steps
compares the mean per-step norm of the last `interval` gradients with the window before it (the
mean of the steps' norms rather than the norm of their sum, which needs a model-sized accumulator);
one level for the whole model (theirs decides per layer; our push has one level per step); each
worker decides from its own gradient (theirs: rank 0 decides and broadcasts); the two levels are
codec specs (`light`, `heavy`; default their PowerSGD ranks 2 and 1, on or off the ladder). Their
second rule (light again at a learning-rate decay) is not implemented: a policy does not see the
learning rate. The norms come through `Policy.observe_gradient`; a direction that feeds none (the
PS's downlink today) holds the light level. The link is not consulted: Accordion is a
network-oblivious peer (docs/POLICIES.md, "accordion").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .base import Policy
from .decision import ChooseRequest, Decision
from .ladder import Ladder
from .registry import register_policy
from .settings import require, settings_factory


@dataclass(frozen=True)
class AccordionSettings:
    """Settings of the accordion peer; `eta` is the paper's, the rest are our step-based mapping."""

    light: str = "powersgd:2"
    """Level of a critical regime (low compression): their PowerSGD rank 2."""
    heavy: str = "powersgd:1"
    """Level outside one (high compression): their PowerSGD rank 1."""
    eta: float = 0.5
    """Relative change of the gradient norm between two checks that marks a critical regime."""
    interval: int = 20
    """Steps per check (their 10 epochs; our runs are a few hundred steps, so ~20 checks a run)."""


class AccordionPolicy(Policy):
    """Accordion's rule: light while ||g|| changes by >= eta between checks, heavy otherwise."""

    wants_gradient_norm = True

    def __init__(self, ladder: Ladder, settings: AccordionSettings) -> None:
        super().__init__(ladder, name="accordion")
        s = settings
        require(isinstance(s.eta, (int, float)) and s.eta > 0, self.name, "eta", s.eta, "> 0")
        require(isinstance(s.interval, int) and s.interval >= 1, self.name, "interval", s.interval, "an int >= 1")
        require(isinstance(s.light, str) and bool(s.light), self.name, "light", s.light, "a codec spec")
        require(isinstance(s.heavy, str) and bool(s.heavy), self.name, "heavy", s.heavy, "a codec spec")
        self.settings = s
        self.level_of(s.light, 1 << 20)  # fail at config time on an unknown codec, not mid-run
        self.level_of(s.heavy, 1 << 20)
        self.critical = True
        """Whether the last check found a critical regime (True until a check finds otherwise)."""
        self.ratio: float | None = None
        """|prev - new| / prev of the last check, None before the second window."""
        self._window: list[float] = []  # per-step norms since the last check
        self._previous: float | None = None  # mean norm of the window before

    @property
    def spec(self) -> str:
        """The codec spec the current regime sends."""
        return self.settings.light if self.critical else self.settings.heavy

    def observe_gradient(self, *, step: int, norm: float) -> None:
        """One step's gradient norm; the `interval`-th since the last check runs the check."""
        if not (isinstance(norm, (int, float)) and math.isfinite(norm) and norm >= 0):
            return  # a non-finite step is no evidence of a regime (the encoder zeroes such keys)
        self._window.append(float(norm))
        if len(self._window) < self.settings.interval:
            return
        new = sum(self._window) / len(self._window)
        self._window.clear()
        prev, self._previous = self._previous, new
        if prev is None:
            self.critical, self.ratio = True, None
            return
        # A previous norm of 0 counts as critical, as theirs does (ratio 9 there).
        self.ratio = abs(prev - new) / prev if prev > 0 else math.inf
        self.critical = self.ratio >= self.settings.eta

    def choose(self, request: ChooseRequest) -> Decision:
        index, level = self.level_of(self.spec, request.payload_bytes)
        ratio = "n/a" if self.ratio is None else f"{self.ratio:.3g}"
        return self._decision(
            request,
            level_index=index,
            level=level,
            reason=f"accordion: {'critical' if self.critical else 'stable'} ratio={ratio} eta={self.settings.eta:g}",
            bandwidth_Bps=request.link.bandwidth_Bps,
        )


register_policy("accordion", settings_factory("accordion", AccordionPolicy, AccordionSettings))
