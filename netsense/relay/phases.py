"""`SitePhases`: where a relayed site's step goes, one upstream shard at a time.

A site's step at its relay runs in four phases (docs/ARCHITECTURE.md, "Hierarchical aggregation"):

- **gather**: from the previous update being installed (the site's pulls answered) to the site's
  sum being taken: the local workers' decode, compute, encode and their pushes to the relay;
- **push**: the site's push upstream, first byte to last ack (the WAN, for a shard at another site);
- **update**: from that push acked to the upstream's update back (the upstream's barrier, which
  waits for the other sites, its optimizer step and the update on the wire);
- **install**: from the update in to the local pulls answered.

Without these a slow relayed step can only be read off the workers, which see one wait for all of
the last three. Pure: the relay passes clock readings in (`time.perf_counter`).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

PHASES = ("gather_s", "push_s", "update_s", "install_s")
WINDOW = 200
"""Steps the medians are taken over: the recent ones, so a long job's summary reflects its present."""


@dataclass(frozen=True)
class StepTimes:
    """One site step's phases, seconds; None where the phase was not measured (the first step's
    gather, a push retried after a reconnect)."""

    gather_s: float | None
    push_s: float | None
    update_s: float | None
    install_s: float


class SitePhases:
    """The phases of the latest `WINDOW` site steps of one upstream shard."""

    def __init__(self, window: int = WINDOW) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.steps: deque[StepTimes] = deque(maxlen=window)
        self.count = 0
        """Steps recorded over the whole run."""
        self._installed: float | None = None

    def record(self, *, taken: float, push_s: float | None, updated: float, installed: float) -> StepTimes:
        """A step whose sum was taken at `taken`, whose push took `push_s` (None: not timed), whose
        update came back at `updated` and was installed at `installed` (clock readings, seconds)."""
        gather = taken - self._installed if self._installed is not None and taken >= self._installed else None
        update = updated - taken - push_s if push_s is not None else None
        times = StepTimes(gather, push_s, max(0.0, update) if update is not None else None, max(0.0, installed - updated))
        self.steps.append(times)
        self.count += 1
        self._installed = installed
        return times

    def resync(self) -> None:
        """The site's version moved without a step of its own (a resync): the next gather is unknown."""
        self._installed = None

    def medians(self) -> dict[str, float | int] | None:
        """``steps`` (recorded over the run) and each phase's median over the window; None before
        the first step. A phase with no sample in the window is left out."""
        if not self.steps:
            return None
        out: dict[str, float | int] = {"steps": self.count}
        for name in PHASES:
            values = [v for v in (getattr(s, name) for s in self.steps) if v is not None]
            if values:
                out[name] = statistics.median(values)
        return out

    def summary(self) -> str:
        """One log line's worth: steps and the medians in ms."""
        m = self.medians()
        if m is None:
            return "no site step yet"
        parts = [f"{name.removesuffix('_s')} {1000 * float(m[name]):.1f}" for name in PHASES if name in m]
        return f"{m['steps']} steps; median ms: " + ", ".join(parts)
