"""Sliding-window filters of the estimator: windowed max / min and a windowed loss fraction.

Pure (plain numbers and times, no aioquic): windows slide with the samples, not the wall clock, so
an idle connection keeps the estimate it last had.
"""

from __future__ import annotations

from collections import deque


class WindowedMax:
    """Running maximum over a sliding time window (monotone deque: O(1) amortised per update).

    The window slides with the newest sample, not the wall clock: when nothing is sampled (an idle
    parameter-server round, or only app-limited samples that are not admitted) the estimate is held,
    as Linux's minmax filter does; old samples expire only as newer ones arrive.
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        """Window length, seconds; may be changed between updates (RTT-scaled windows)."""
        self._samples: deque[tuple[float, float]] = deque()

    def update(self, time: float, value: float) -> None:
        """Admit `value` measured at `time` (times must not decrease) and expire old samples."""
        samples = self._samples
        while samples and samples[-1][1] <= value:
            samples.pop()
        samples.append((time, value))
        horizon = time - self.window_s
        while samples[0][0] < horizon:
            samples.popleft()

    @property
    def value(self) -> float | None:
        """The maximum over the window, or None before the first sample."""
        return self._samples[0][1] if self._samples else None

    @property
    def latest_time(self) -> float | None:
        """Time of the newest admitted sample."""
        return self._samples[-1][0] if self._samples else None


class WindowedMin(WindowedMax):
    """Running minimum over a sliding time window (a `WindowedMax` of negated values)."""

    def update(self, time: float, value: float) -> None:
        """Admit `value` measured at `time` (times must not decrease) and expire old samples."""
        super().update(time, -value)

    @property
    def value(self) -> float | None:
        """The minimum over the window, or None before the first sample."""
        top = super().value
        return None if top is None else -top


class LossWindow:
    """Fraction of packets declared lost among those whose fate was decided in a recent window.

    Counts live in buckets of window/8 so memory stays constant; like `WindowedMax` the window slides
    with events, so an idle connection keeps reporting the loss rate it last saw.
    """

    _BUCKETS = 8

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        """Window length, seconds."""
        self._buckets: deque[list[float]] = deque()  # [start_time, acked, lost]
        self._acked = 0
        self._lost = 0

    def _add(self, time: float, acked: int, lost: int) -> None:
        width = self.window_s / self._BUCKETS
        buckets = self._buckets
        if not buckets or time >= buckets[-1][0] + width:
            buckets.append([time, 0, 0])
        bucket = buckets[-1]
        bucket[1] += acked
        bucket[2] += lost
        self._acked += acked
        self._lost += lost
        horizon = time - self.window_s
        while buckets[0][0] + width <= horizon:
            _, old_acked, old_lost = buckets.popleft()
            self._acked -= int(old_acked)
            self._lost -= int(old_lost)

    def on_acked(self, time: float, packets: int = 1) -> None:
        """Count `packets` acknowledged at `time`."""
        self._add(time, packets, 0)

    def on_lost(self, time: float, packets: int) -> None:
        """Count `packets` declared lost at `time`."""
        self._add(time, 0, packets)

    @property
    def rate(self) -> float:
        """lost / (acked + lost) in the window; 0 with no decided packets."""
        decided = self._acked + self._lost
        return self._lost / decided if decided else 0.0
