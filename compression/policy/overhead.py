"""`StepOverhead`: the step's time that the step-time model leaves out, measured between decisions.

P_l = Tc + T_l prices what a level changes: the compute (with the wait for the last update) and the
level's encode and sends (and, against a gradient-domain PS, the update's decode where the sender
timed it: `Level.return_s`). A step also spends time the model does not see: the replica's
optimizer step, thread hops and the GIL's waits, a return slower than priced. Nearly the same
whichever level is sent, it does not move the step-time law, but the progress-aware law divides P_l
by q_l, so left out it prices a lossier level's progress too low: across two sites digits-cnn's
steps were 5.4 ms (41 %) longer than predicted at every level, and `powersgd:1` against `:2` was a
near-tie where the fixed runs have rank 2 ahead
(docs/POLICIES.md, "The step's unmodelled time").
"""

from __future__ import annotations

import statistics
from collections import deque

SKIP_DECISIONS = 5
"""Decisions whose steps are not sampled: start-up (connections in slow start, codecs built)."""


class StepOverhead:
    """Median over the last `window` steps of (time to the next decision) less the step the law
    predicted for the level sent, at least 0; 0 until `window` // 4 (at least 3) steps are in.
    The median, not a mean: a step that holds an evaluation or a checkpoint is longer by what the
    training loop did, not by what a level costs."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._samples: deque[float] = deque(maxlen=max(1, window))
        self._mark: tuple[float, float] | None = None
        self._decisions = 0

    @property
    def value(self) -> float:
        """Seconds to add to every level's predicted step (0 while off or too few samples)."""
        if self.window <= 0 or len(self._samples) < max(3, self.window // 4):
            return 0.0
        return max(0.0, statistics.median(self._samples))

    def decided(self, time_s: float, predicted_s: float | None) -> None:
        """A decision at `time_s` (the sender's clock) whose step was predicted at `predicted_s`
        without the overhead (None: none was, and its step is no sample). The step before it, if
        marked, ends here."""
        self._decisions += 1
        if self._mark is not None:
            at, predicted = self._mark
            if time_s > at:
                self._samples.append(time_s - at - predicted)
        self._mark = (time_s, predicted_s) if predicted_s is not None and self._decisions > SKIP_DECISIONS else None

    def drop(self) -> None:
        """The marked step is no sample (its push was withdrawn and sent again: `redecide`)."""
        self._mark = None
