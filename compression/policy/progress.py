"""What a policy makes of progress efficiency q: one EWMA per ladder level, seeded with the codec's
conservative prior (`Level.progress`), fed one step's figures (`netsense.compression.progress`) until
a progress window (`netsense.compression.window`) has priced the level over several steps; and the
hand-off of one candidate measurement (its q and what the codec cost) to the policy."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import torch

from ..base import Codec
from ..progress import measure_level, sender_encode_s
from ..window import NoiseScale
from .ladder import Ladder


DRIFT_ODDS_FLOOR = 0.01
"""One-step error odds below this (q above ~0.99) count as this in `ProgressEstimate.drift`: the
8-bit levels' figures wander between 0.995 and 1.0, a ratio of no meaning."""


def error_odds(q: float) -> float:
    """(1 - q) / q of a q > 0, at least `DRIFT_ODDS_FLOOR`: what the drift and the sent level's
    window compare, as a ratio."""
    return max(DRIFT_ODDS_FLOOR, (1 - q) / q)


class LevelObserver(Protocol):
    """What `measure_into` reports to: a policy (`netsense.compression.policy.Policy`)."""

    def observe_costs(
        self, *, level: int, dense_bytes: int, encode_s: float | None = None, decode_s: float | None = None
    ) -> None: ...

    def observe_progress(self, *, level: int, progress: float) -> None: ...


def measure_into(
    observer: LevelObserver,
    level: int,
    codec: Codec,
    tensors: Iterable[torch.Tensor],
    weights: Sequence[torch.Tensor] | None = None,
) -> float | None:
    """Measure ladder level `level` (`codec`) on `tensors` (in the metric `weights`, default the
    plain one: `measure_level`) and report its sender cost and q to the policy; returns the q (None
    when not measurable). The uplink's and the downlink's candidate rounds both do exactly this."""
    sample = measure_level(codec, tensors, weights=weights)
    if sample is None:
        return None
    observer.observe_costs(
        level=level, dense_bytes=sample.dense_bytes, encode_s=sender_encode_s(codec, sample), decode_s=sample.decode_s
    )
    if sample.progress is not None:
        observer.observe_progress(level=level, progress=sample.progress)
    return sample.progress


class ProgressEstimate:
    """Per-level EWMA of q, starting from the ladder's priors; never below `floor`."""

    def __init__(self, ladder: Ladder, *, alpha: float = 0.3, floor: float = 0.01) -> None:
        self.alpha = alpha
        """Weight of the newest measurement."""
        self.floor = floor
        """Lowest q used (keeps P / q finite for a level that measured ~nothing)."""
        self.values = [1.0 if lv.lossless else max(floor, lv.progress) for lv in ladder]
        """Current q per level, in ladder order."""
        self.measured = [lv.lossless for lv in ladder]
        """Whether each level's q has been measured (a lossless level needs no measurement)."""
        self.windowed = [False] * len(ladder)
        """Whether each level has a windowed q (`update_window`): then one step's figures no longer count."""
        self.interim = [False] * len(ladder)
        """Whether each level's q is an interim window's (it, too, stops one step's figures)."""
        self.noise: NoiseScale | None = None
        """The gradient noise scale of the latest progress window (signal and noise EWMAs)."""
        self.pinned = [False] * len(ladder)
        """Whether each level's q is a calibrated figure (`pin`): then no run-time estimate moves it."""
        self.start = [False] * len(ladder)
        """Whether each level's windowed q is the run's first window's (`WindowResult.first`): the
        next full window replaces it instead of folding into it."""
        self.one_step: list[float | None] = [None] * len(ladder)
        """EWMA of each level's one-step figures, kept after a window priced it (`drift`)."""
        self._at_window: list[float | None] = [None] * len(ladder)  # `one_step` when the last full window ended

    def pin(self, level: int, q: float) -> None:
        """Fix level `level`'s q at `q` for the run (a level trial's figure, docs/POLICIES.md,
        "Calibrated q"): the one-step figures and windows are what it corrects, so they no longer
        count for this level."""
        self.values[level] = min(1.0, max(self.floor, q))
        self.measured[level] = self.pinned[level] = True

    def update(self, level: int, q: float, *, interim: bool = False) -> None:
        """Fold in one one-step measurement of level `level` (the first replaces the prior outright);
        ignored once the level has a windowed q: one step's error overprices error feedback (it
        still feeds `one_step`, which tells when that windowed q went stale). An `interim` figure
        replaces only the prior and leaves the level unmeasured, so that its next figure replaces
        it in turn (it is no sample of the stream: a fresh model's first update, of low rank)."""
        q1 = min(1.0, max(self.floor, q))
        if interim:
            if not self.measured[level]:
                self.values[level] = q1
            return
        old = self.one_step[level]
        self.one_step[level] = q1 if old is None else self._ewma(old, q1)
        if not self.windowed[level] and not self.interim[level] and not self.pinned[level]:
            self._fold(level, q)

    @property
    def windows_seen(self) -> bool:
        """Whether a progress window (interim or full) has priced any level yet."""
        return any(self.windowed) or any(self.interim)

    def update_window(self, level: int, q: float, *, interim: bool = False, first: bool = False) -> None:
        """Fold in a windowed q_W of `level`; the first replaces whatever one-step figure it had.
        An interim q_W (fewer steps credited) stands in only until the level's first full one. A
        figure of the run's first window (`first`) is replaced by the next full one: averaged with
        it, a fresh model's start held the transformer's (not in the repo) powersgd:2 at 0.86 where
        its second window said 0.72 (docs/POLICIES.md, "Windowed progress", the first window)."""
        if self.pinned[level]:
            return
        if interim:
            if not self.windowed[level]:
                self.values[level] = min(1.0, max(self.floor, q))
                self.measured[level] = self.interim[level] = True
            return
        if not self.windowed[level] or self.start[level]:
            self.measured[level] = False  # `_fold` replaces the figure
        self.windowed[level] = True
        self.start[level] = first
        self._at_window[level] = self.one_step[level]
        self._fold(level, q)

    def restate(self, level: int, q: float) -> None:
        """Replace level `level`'s q with `q` as a full window's figure (the sent level's window
        found the estimate stale: `NetsensePolicy.observe_sent_window`)."""
        if self.pinned[level]:
            return
        self.values[level] = min(1.0, max(self.floor, q))
        self.measured[level] = self.windowed[level] = True
        self.interim[level] = self.start[level] = False
        self._at_window[level] = self.one_step[level]

    def drift(self, level: int) -> float:
        """How far `level`'s one-step error odds (1 - q) / q moved since its last full window, as a
        ratio >= 1 either way (1: no window, or no one-step figure on one side). A window prices the
        gradient stream of its own steps; when the codec's one-step error on the stream moved by a
        large factor since, the stream changed (a higher-rank phase: charlm's powersgd:2 one-step q
        went 0.67 -> 0.28 in 50 steps) and the windowed q is stale (docs/POLICIES.md, "Windowed
        progress", drift)."""
        then, now = self._at_window[level], self.one_step[level]
        if then is None or now is None:
            return 1.0
        a, b = error_odds(then), error_odds(now)
        return max(a / b, b / a)

    def update_noise(self, noise: NoiseScale) -> None:
        """Fold in a window's noise scale: signal and noise separately (a ratio of means, not a mean
        of ratios, which one window with |G|^2 ~ 0 would swamp)."""
        if self.noise is None:
            self.noise = noise
            return
        self.noise = NoiseScale(
            signal=self._ewma(self.noise.signal, noise.signal), noise=self._ewma(self.noise.noise, noise.noise)
        )

    def _fold(self, level: int, q: float) -> None:
        q = min(1.0, max(self.floor, q))
        if not self.measured[level]:
            self.values[level], self.measured[level] = q, True
        else:
            self.values[level] = self._ewma(self.values[level], q)

    def _ewma(self, old: float, new: float) -> float:
        """`new` folded into `old` with weight `alpha`."""
        return self.alpha * new + (1 - self.alpha) * old

    def __getitem__(self, level: int) -> float:
        return self.values[level]
