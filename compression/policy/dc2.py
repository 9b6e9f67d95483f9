"""``dc2``: the delay-aware baseline, compression scaled with the measured queueing delay."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Policy
from .decision import ChooseRequest, Decision
from .ladder import Ladder
from .registry import register_policy
from .settings import require, settings_factory


@dataclass(frozen=True)
class Dc2Settings:
    """Settings of the delay-aware baseline."""

    target_delay_s: float = 0.005
    """Queueing delay (srtt - min_rtt) tolerated before compressing at all."""
    alpha: float = 0.5
    """EWMA weight of the newest delay sample (1.0: no smoothing)."""


class Dc2Policy(Policy):
    """Delay-aware baseline after the idea of DC2 (Abdelmoniem & Canini, INFOCOM'21): the wire
    size allowed shrinks in proportion to how far the smoothed queueing delay d exceeds a target,
    ratio budget = min(1, target / d); send the least lossy level within it. Our reading of the
    idea (a standing queue drains when the offered load falls by target/d), not the paper's code."""

    def __init__(self, ladder: Ladder, settings: Dc2Settings) -> None:
        super().__init__(ladder, name="dc2")
        require(settings.target_delay_s > 0, "dc2", "target_delay_s", settings.target_delay_s, "> 0")
        require(0 < settings.alpha <= 1, "dc2", "alpha", settings.alpha, "in (0, 1]")
        self.settings = settings
        self.delay_s: float | None = None
        """Smoothed queueing delay, None before the first RTT sample."""

    def choose(self, request: ChooseRequest) -> Decision:
        link = request.link
        if link.srtt_s is not None and link.min_rtt_s is not None:
            q, a = link.queue_delay_s, self.settings.alpha
            self.delay_s = q if self.delay_s is None else a * q + (1 - a) * self.delay_s
        budget = 1.0 if self.delay_s is None else min(1.0, self.settings.target_delay_s / max(self.delay_s, 1e-12))
        # 1% slack: a measured ratio carries a few bytes of framing (fp16 measures 0.5000x, not 0.5).
        index = next((i for i, lv in enumerate(self.ladder) if lv.ratio <= 1.01 * budget), len(self.ladder) - 1)
        return self._decision(
            request,
            level_index=index,
            level=self.ladder[index],
            reason=f"dc2: delay={self.delay_s if self.delay_s is not None else float('nan'):.4f}s budget={budget:.4g}",
            bandwidth_Bps=link.bandwidth_Bps,
        )


register_policy("dc2", settings_factory("dc2", Dc2Policy, Dc2Settings))
