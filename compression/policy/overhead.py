"""`StepOverhead`: the step's time that the step-time model leaves out, measured between decisions.

P_l = Tc + T_l prices what a level changes: the compute (with the wait for the last update) and
the level's encode and sends. A step also spends time the model does not see: the update's
decode and the replica's optimizer step, thread hops and the GIL's waits, a return slower than
priced. Nearly the same whichever level is sent, it does not move the step-time law, but the
progress-aware law divides P_l by q_l, so left out it prices a lossier level's progress too low:
across two sites digits-cnn's steps were 5.4 ms (41 %) longer than predicted at every level, and
`powersgd:1` against `:2` was a near-tie where the fixed runs have rank 2 ahead
(docs/POLICIES.md, "The step's unmodelled time"). Not all of it is the same at every level: a
sparse level's update takes milliseconds more to decode and apply, so a level sent for a few steps
is charged its own median from then on (`of_level`).
"""

from __future__ import annotations

import statistics
from collections import deque

SKIP_DECISIONS = 5
"""Decisions whose steps are not sampled: start-up (connections in slow start, codecs built)."""
LEVEL_MIN_SAMPLES = 3
"""Steps sent at one level before its own median replaces the common one for it (the median of
three drops one outlier: a codec's first use)."""
LEVEL_HORIZON = 4
"""A level's samples count for this many `window`s of decisions after they were taken."""


class StepOverhead:
    """Median over the last `window` steps of (time to the next decision) less the step the law
    predicted for the level sent, at least 0; 0 until `window` // 4 (at least 3) steps are in.
    The median, not a mean: a step that holds an evaluation or a checkpoint is longer by what the
    training loop did, not by what a level costs."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._samples: deque[float] = deque(maxlen=max(1, window))
        self._levels: dict[int, deque[tuple[int, float]]] = {}  # level -> (decision, sample)
        self._mark: tuple[float, float, int | None] | None = None
        self._decisions = 0

    @property
    def value(self) -> float:
        """Seconds to add to every level's predicted step (0 while off or too few samples)."""
        if self.window <= 0 or len(self._samples) < max(3, self.window // 4):
            return 0.0
        return max(0.0, statistics.median(self._samples))

    def of_level(self, level: int | None) -> float:
        """Seconds to add to `level`'s predicted step: the median of its own samples of the last
        `LEVEL_HORIZON` windows of decisions (at most `window` // 2 of them, at least 0) once it has
        `LEVEL_MIN_SAMPLES`, else `value`. A level never sent, or not lately, is charged the
        common figure: a sparse level is tried at the price the model gives it, then keeps its
        own (`topk:0.01+fp16` on digits-cnn across two sites: 18.4 ms a step against the 9.4
        predicted, `powersgd:1` 15.0 against 11.3)."""
        samples = self._levels.get(level) if level is not None and self.window > 0 else None
        if samples:
            recent = [x for at, x in samples if self._decisions - at <= LEVEL_HORIZON * self.window]
            if len(recent) >= LEVEL_MIN_SAMPLES:
                return max(0.0, statistics.median(recent))
        return self.value

    def extra(self, level: int | None) -> float:
        """`of_level` less `value`: what `level` costs beyond the common figure (may be < 0)."""
        return self.of_level(level) - self.value

    def decided(self, time_s: float, predicted_s: float | None, level: int | None = None) -> None:
        """A decision at `time_s` (the sender's clock) for ladder `level`, whose step was predicted
        at `predicted_s` without any overhead (None: none was, and its step is no sample). The step
        before it, if marked, ends here."""
        self._decisions += 1
        if self._mark is not None:
            at, predicted, sent = self._mark
            if time_s > at:
                sample = time_s - at - predicted
                self._samples.append(sample)
                if sent is not None:
                    cap = max(LEVEL_MIN_SAMPLES, self.window // 2)
                    self._levels.setdefault(sent, deque(maxlen=cap)).append((self._decisions, sample))
        marked = predicted_s is not None and self._decisions > SKIP_DECISIONS
        self._mark = (time_s, predicted_s, level) if marked and predicted_s is not None else None

    def drop(self) -> None:
        """The marked step is no sample (its push was withdrawn and sent again: `redecide`)."""
        self._mark = None
