"""Link rates over time, for the link emulator (docs/EMULATOR.md): pure, no I/O but reading a trace file.

Every rate is modelled by its *capacity curve* C(t), the bytes the link can deliver in [0, t]. The
emulator serves its queue against that curve, which makes a constant rate, a step list and a
Mahimahi packet-delivery trace one mechanism (a token bucket whose fill is C). `linkspec` parses
the spec fields that name them.
"""

from __future__ import annotations

import bisect
import csv
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

from netsense.errors import ConfigError

MAHIMAHI_PACKET_BYTES = 1500
"""Bytes one Mahimahi delivery opportunity may carry (Mahimahi's fixed MTU-sized slot)."""


class RateTrace(ABC):
    """A link rate over time, as the capacity curve C(t) the emulator serves its queue against."""

    @abstractmethod
    def rate_at(self, t: float) -> float:
        """The rate in bits/s at trace time ``t`` seconds (t >= 0)."""

    @abstractmethod
    def capacity(self, t: float) -> float:
        """Bytes deliverable in [0, t]: non-decreasing, 0 at t = 0."""

    @abstractmethod
    def time_for(self, cum_bytes: float) -> float:
        """The earliest t with ``capacity(t) >= cum_bytes``; ``math.inf`` if the link never gets there."""

    @property
    @abstractmethod
    def mean_bps(self) -> float:
        """The average rate, used to turn a queue limit given in time into bytes."""


@dataclass(frozen=True)
class ConstantRate(RateTrace):
    """A fixed rate."""

    bps: float
    """Bits per second, > 0."""

    def rate_at(self, t: float) -> float:
        return self.bps

    def capacity(self, t: float) -> float:
        return self.bps / 8.0 * max(t, 0.0)

    def time_for(self, cum_bytes: float) -> float:
        return max(cum_bytes, 0.0) * 8.0 / self.bps

    @property
    def mean_bps(self) -> float:
        return self.bps


@dataclass(frozen=True)
class StepRate(RateTrace):
    """A piecewise-constant rate; the last step holds forever, or until `period_s`, from which the
    steps repeat (a cycle every run sees in full, whatever its speed). A 0 step is a blackout."""

    steps: tuple[tuple[float, float], ...]
    """(start time s, bits/s) pairs, the first at 0 s, times strictly increasing."""
    period_s: float | None = None
    """Loop period (after the last step's start), or None: no loop."""
    _cum: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _times: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.steps or self.steps[0][0] != 0.0:
            raise ConfigError(f"rate trace: the first step must start at 0s, got {self.steps[:1]}")
        if self.period_s is not None and not (math.isfinite(self.period_s) and self.period_s > self.steps[-1][0]):
            raise ConfigError(
                f"rate trace: the loop time must come after the last step ({self.steps[-1][0]}s), got {self.period_s}s"
            )
        cum = [0.0]
        for (t0, r0), (t1, _) in zip(self.steps, self.steps[1:]):
            if t1 <= t0:
                raise ConfigError(f"rate trace: step times must increase, got {t0}s then {t1}s")
            cum.append(cum[-1] + r0 / 8.0 * (t1 - t0))
        if any(r < 0 for _, r in self.steps):
            raise ConfigError(f"rate trace: rates must be >= 0, got {self.steps}")
        if all(r == 0 for _, r in self.steps):
            raise ConfigError("rate trace: every step has rate 0; the link would never deliver")
        if self.period_s is not None:
            cum.append(cum[-1] + self.steps[-1][1] / 8.0 * (self.period_s - self.steps[-1][0]))
        object.__setattr__(self, "_cum", tuple(cum))
        object.__setattr__(self, "_times", tuple(t for t, _ in self.steps))

    def _index(self, t: float) -> int:
        return max(bisect.bisect_right(self._times, t) - 1, 0)

    def _fold(self, t: float) -> tuple[int, float]:
        """(whole loops before t, time within the loop); no loop: (0, t)."""
        if self.period_s is None:
            return 0, t
        loops = math.floor(t / self.period_s)
        return loops, t - loops * self.period_s

    def rate_at(self, t: float) -> float:
        return self.steps[self._index(self._fold(t)[1])][1]

    def capacity(self, t: float) -> float:
        if t <= 0.0:
            return 0.0
        loops, t = self._fold(t)
        i = self._index(t)
        start, bps = self.steps[i]
        return loops * self._cum[-1] + self._cum[i] + bps / 8.0 * (t - start)

    def time_for(self, cum_bytes: float) -> float:
        if cum_bytes <= 0.0:
            return 0.0
        offset = 0.0
        if self.period_s is not None:
            loops = math.ceil(cum_bytes / self._cum[-1]) - 1  # whole loops that fall short of it
            offset, cum_bytes = loops * self.period_s, cum_bytes - loops * self._cum[-1]
        i = bisect.bisect_left(self._cum, cum_bytes, hi=len(self.steps)) - 1  # last step whose start has less
        start, bps = self.steps[i]
        if bps == 0.0:
            return math.inf  # only possible on the last step of a trace without a loop: a blackout forever
        return offset + start + (cum_bytes - self._cum[i]) * 8.0 / bps

    @property
    def mean_bps(self) -> float:
        """Time-weighted over one loop, or over the listed steps (the last one counted for as long
        as the previous) when the trace does not loop."""
        if self.period_s is not None:
            return self._cum[-1] * 8.0 / self.period_s
        if len(self.steps) == 1:
            return self.steps[0][1]
        end = self.steps[-1][0] + (self.steps[-1][0] - self.steps[-2][0])
        return self.capacity(end) * 8.0 / end


@dataclass(frozen=True)
class MahimahiTrace(RateTrace):
    """Mahimahi's packet-delivery trace: one 1500-byte delivery opportunity per listed millisecond.

    The trace loops with a period equal to its last timestamp, as in Mahimahi. Capacity not used
    when the queue is empty is lost (the emulator never banks it beyond its burst allowance).
    """

    opportunities_ms: tuple[int, ...]
    """Non-decreasing millisecond timestamps; repeats mean several packets in that millisecond."""

    def __post_init__(self) -> None:
        ts = self.opportunities_ms
        if not ts:
            raise ConfigError("mahimahi trace: no delivery opportunities")
        if ts[0] < 0 or any(b < a for a, b in zip(ts, ts[1:])):
            raise ConfigError("mahimahi trace: timestamps must be >= 0 and non-decreasing")
        if ts[-1] <= 0:
            raise ConfigError(f"mahimahi trace: the last timestamp sets the period and must be > 0, got {ts[-1]}")

    @property
    def period_s(self) -> float:
        """The loop period in seconds."""
        return self.opportunities_ms[-1] / 1000.0

    def opportunities(self, t: float) -> int:
        """Delivery opportunities in [0, t]."""
        if t < 0.0:
            return 0
        period = self.opportunities_ms[-1]
        t_ms = t * 1000.0
        loops = int(t_ms // period)
        return loops * len(self.opportunities_ms) + bisect.bisect_right(self.opportunities_ms, t_ms - loops * period)

    def rate_at(self, t: float, window_s: float = 0.1) -> float:
        """The average rate over the ``window_s`` starting at ``t`` (a single instant has no rate)."""
        return (self.capacity(t + window_s) - self.capacity(t)) * 8.0 / window_s

    def capacity(self, t: float) -> float:
        return float(self.opportunities(t) * MAHIMAHI_PACKET_BYTES)

    def time_for(self, cum_bytes: float) -> float:
        if cum_bytes <= 0.0:
            return 0.0
        k = math.ceil(cum_bytes / MAHIMAHI_PACKET_BYTES - 1e-9) - 1  # 0-based index of the opportunity
        loops, i = divmod(k, len(self.opportunities_ms))
        return (loops * self.opportunities_ms[-1] + self.opportunities_ms[i]) / 1000.0

    @property
    def mean_bps(self) -> float:
        return len(self.opportunities_ms) * MAHIMAHI_PACKET_BYTES * 8.0 / self.period_s


def load_trace(path: str | Path) -> RateTrace:
    """Read a trace file: Mahimahi (one integer ms per line) or CSV ``time_s,rate_mbit``.

    A ``mahimahi:`` or ``csv:`` prefix forces the format; otherwise a file whose every line is one
    integer is Mahimahi, anything else CSV (header optional).
    """
    text_path = str(path)
    kind = None
    for prefix in ("mahimahi:", "csv:"):
        if text_path.startswith(prefix):
            kind, text_path = prefix[:-1], text_path[len(prefix):]
    try:
        lines = [ln.strip() for ln in Path(text_path).read_text().splitlines()]
    except OSError as exc:
        raise ConfigError(f"link spec field 'trace': cannot read {text_path!r}: {exc.strerror}") from exc
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    if kind is None:
        kind = "mahimahi" if lines and all(ln.isdigit() for ln in lines) else "csv"
    if kind == "mahimahi":
        try:
            return MahimahiTrace(tuple(int(ln) for ln in lines))
        except ValueError as exc:
            raise ConfigError(f"mahimahi trace {text_path!r}: every line must be an integer ms timestamp") from exc
    return _parse_csv(lines, text_path)


def _parse_csv(lines: list[str], where: str) -> StepRate:
    steps = []
    for row_no, row in enumerate(csv.reader(lines), start=1):
        try:
            t, mbit = float(row[0]), float(row[1])
        except (ValueError, IndexError) as exc:
            if row_no == 1:
                continue  # the optional header
            raise ConfigError(f"csv trace {where!r} row {row_no}: expected time_s,rate_mbit, got {row}") from exc
        steps.append((t, mbit * 1e6))
    if not steps:
        raise ConfigError(f"csv trace {where!r}: no rows of time_s,rate_mbit")
    return StepRate(tuple(steps))
