"""Link specs and rate traces for the link emulator (DESIGN.md §7); pure, no I/O but reading a trace file.

A spec is a comma-separated list of ``key=value`` fields, e.g.
``rate=50mbit,delay=20ms,queue=100ms,loss=0.01``. A field applies to both directions unless it is
prefixed ``up.`` (client -> upstream server) or ``down.`` (server -> client). A step trace may be
written inline as the rate, its steps continuing after commas: ``rate=0s:100mbit,20s:10mbit``.

Every rate is modelled by its *capacity curve* C(t), the bytes the link can deliver in [0, t]. The
emulator serves its queue against that curve, which makes a constant rate, a step list and a
Mahimahi packet-delivery trace one mechanism (a token bucket whose fill is C).
"""

from __future__ import annotations

import bisect
import csv
import math
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from pathlib import Path

from netsense.errors import ConfigError

MAHIMAHI_PACKET_BYTES = 1500
"""Bytes one Mahimahi delivery opportunity may carry (Mahimahi's fixed MTU-sized slot)."""

DEFAULT_QUEUE_S = 0.1
"""Queue limit when a spec gives none: 100 ms at the reference rate, a common home-router buffer."""

_RATE_UNITS = {"bit": 1.0, "bps": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
# 1024-based like tc, so `queue=64kb` means the same here and in a `tbf limit`.
_BYTE_UNITS = {"b": 1, "kb": 1024, "mb": 1024 * 1024}
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z%]*)\s*$")


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


@dataclass(frozen=True)
class LinkSpec:
    """One direction of an emulated link: bottleneck rate, drop-tail queue, propagation delay, loss."""

    rate: RateTrace | None = None
    """The bottleneck rate; None means unlimited (delay and loss only)."""
    delay_s: float = 0.0
    """One-way propagation delay added after the bottleneck."""
    queue_bytes: int | None = None
    """Drop-tail limit in bytes; None means ``queue_s`` at the rate's mean."""
    queue_s: float | None = None
    """Drop-tail limit in time, converted to bytes with the rate's mean rate."""
    loss: float = 0.0
    """Random loss probability per packet, applied on arrival (before the queue)."""
    burst_bytes: int = 0
    """Token-bucket depth: capacity an idle link may bank. 0 = a pure serialising link."""

    @property
    def rate_bps(self) -> float | None:
        """The rate at t = 0 (the constant rate for a constant link); None when unlimited."""
        return None if self.rate is None else self.rate.rate_at(0.0)

    @property
    def queue_limit_bytes(self) -> int | None:
        """The drop-tail limit in bytes; None when there is no bottleneck (unlimited rate)."""
        if self.queue_bytes is not None:
            return self.queue_bytes
        if self.rate is None:
            return None
        seconds = DEFAULT_QUEUE_S if self.queue_s is None else self.queue_s
        # Never below two full packets: a smaller queue would drop every back-to-back pair.
        return max(int(seconds * self.rate.mean_bps / 8.0), 2 * MAHIMAHI_PACKET_BYTES)

    def describe(self) -> str:
        """A one-line human summary, for logs and the CLI."""
        if self.rate is None:
            rate = "unlimited"
        elif isinstance(self.rate, ConstantRate):
            rate = f"{self.rate.bps / 1e6:g} Mbit/s"
        else:
            rate = f"{type(self.rate).__name__} (mean {self.rate.mean_bps / 1e6:.3g} Mbit/s)"
        queue = "" if self.queue_limit_bytes is None else f", queue {self.queue_limit_bytes} B"
        return f"{rate}, delay {self.delay_s * 1000:g} ms{queue}, loss {self.loss:g}"


@dataclass(frozen=True)
class DuplexSpec:
    """Both directions of an emulated link and the seed of their loss draws."""

    up: LinkSpec = field(default_factory=LinkSpec)
    """Client -> upstream server (a worker's push)."""
    down: LinkSpec = field(default_factory=LinkSpec)
    """Upstream server -> client (the parameter pull)."""
    seed: int = 0
    """Seed of the random-loss generator, so a lossy run repeats exactly."""

    def describe(self) -> str:
        """A one-line human summary of both directions."""
        return f"up: {self.up.describe()}; down: {self.down.describe()}"


_DIRECTION_FIELDS = ("rate", "delay", "queue", "loss", "burst", "trace")
_GLOBAL_FIELDS = ("seed",)
_STEP = re.compile(r"^\s*[0-9.]+(?:us|ms|s)\s*:")


def _bad(name: str, value: str, expected: str) -> ConfigError:
    return ConfigError(f"link spec field {name!r}: bad value {value!r} (expected {expected})")


def _number(name: str, value: str, units: dict[str, float], expected: str, *, default_unit: str | None = None) -> float:
    match = _NUMBER.match(value)
    if not match:
        raise _bad(name, value, expected)
    unit = match.group(2).lower() or default_unit
    if unit not in units:
        raise _bad(name, value, expected)
    return float(match.group(1)) * units[unit]


def parse_rate(value: str, name: str = "rate") -> float:
    """Bits/s from ``50mbit``; ``kbps``/``mbps`` are refused because tc reads them as *bytes*/s."""
    if re.search(r"[kmg]bps\s*$", value.strip().lower()):
        raise _bad(name, value, "bit/kbit/mbit/gbit; 'mbps' is ambiguous (tc reads it as megabytes/s)")
    return _number(name, value, _RATE_UNITS, "a rate like 50mbit (units bit/kbit/mbit/gbit/bps)")


def parse_duration(value: str, name: str = "delay") -> float:
    """Seconds from ``20ms`` / ``500us`` / ``1.5s``."""
    return _number(name, value, _TIME_UNITS, "a time like 20ms (units us/ms/s)")


def parse_steps(value: str, name: str = "rate") -> StepRate:
    """A step trace ``0s:100mbit,20s:10mbit``; a rate of plain ``0`` is a blackout; a last item
    ``30s:loop`` repeats the steps every 30 s."""
    steps = []
    period = None
    items = value.split(",")
    for n, item in enumerate(items):
        when, sep, rate = item.partition(":")
        if not sep:
            raise _bad(name, item, "a step like 20s:10mbit")
        if rate.strip().lower() == "loop":
            if n != len(items) - 1 or n == 0:
                raise _bad(name, item, "'loop' only as the last item, after at least one step (0s:100mbit,9s:loop)")
            period = parse_duration(when, name)
            continue
        bps = 0.0 if rate.strip() == "0" else parse_rate(rate, name)
        steps.append((parse_duration(when, name), bps))
    return StepRate(tuple(steps), period)


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


def _split_fields(text: str) -> list[tuple[str, str]]:
    """``key=value`` pairs; a bare ``20s:10mbit`` continues the previous step-list rate."""
    pairs: list[tuple[str, str]] = []
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        key, sep, value = token.partition("=")
        if sep:
            pairs.append((key.strip().lower(), value.strip()))
        elif pairs and pairs[-1][0].endswith("rate") and _STEP.match(token):
            pairs[-1] = (pairs[-1][0], f"{pairs[-1][1]},{token}")
        else:
            raise ConfigError(f"link spec: {token!r} is not a key=value field (in {text!r})")
    return pairs


def _apply(spec: LinkSpec, name: str, key: str, value: str) -> LinkSpec:
    if key == "rate":
        if _STEP.match(value):
            return replace(spec, rate=parse_steps(value, name))
        bps = parse_rate(value, name)
        if bps <= 0:
            raise _bad(name, value, "a rate > 0 (use a step trace for a blackout)")
        return replace(spec, rate=ConstantRate(bps))
    if key == "trace":
        return replace(spec, rate=load_trace(value))
    if key == "delay":
        return replace(spec, delay_s=parse_duration(value, name))
    if key == "queue":
        if re.search(r"[0-9.](us|ms|s)\s*$", value.lower()):
            return replace(spec, queue_s=parse_duration(value, name), queue_bytes=None)
        size = int(_number(name, value, _BYTE_UNITS, "bytes (b/kb/mb) or a time (us/ms/s)"))
        if size < 1:
            raise _bad(name, value, "a queue of at least 1 byte")
        return replace(spec, queue_bytes=size, queue_s=None)
    if key == "loss":
        loss = _number(name, value, {"": 1.0, "%": 0.01}, "a fraction 0..1 like 0.01, or 1%", default_unit="")
        if not 0.0 <= loss < 1.0:
            raise _bad(name, value, "a loss fraction in [0, 1)")
        return replace(spec, loss=loss)
    if key == "burst":
        return replace(spec, burst_bytes=int(_number(name, value, _BYTE_UNITS, "bytes (b/kb/mb)")))
    raise AssertionError(key)


def parse_link(text: str, *, trace: str | Path | None = None) -> DuplexSpec:
    """Parse a link spec string; ``trace`` (a file) sets the rate of both directions first.

    Raises ConfigError naming the field and the value that is wrong.
    """
    up, down = LinkSpec(), LinkSpec()
    if trace is not None:
        up = down = _apply(up, "trace", "trace", str(trace))
    seed = 0
    # Unprefixed fields first, so `up.rate=` overrides `rate=` wherever it is written.
    for name, value in sorted(_split_fields(text), key=lambda kv: "." in kv[0]):
        direction, dot, key = name.rpartition(".")
        if not dot and key in _GLOBAL_FIELDS:
            try:
                seed = int(value)
            except ValueError:
                raise _bad(name, value, "an integer") from None
            continue
        if direction not in ("", "up", "down") or key not in _DIRECTION_FIELDS:
            raise ConfigError(
                f"link spec: unknown field {name!r} (fields: {', '.join(_DIRECTION_FIELDS + _GLOBAL_FIELDS)}, "
                "optionally prefixed up. or down.)"
            )
        if direction in ("", "up"):
            up = _apply(up, name, key, value)
        if direction in ("", "down"):
            down = _apply(down, name, key, value)
    return DuplexSpec(up=up, down=down, seed=seed)


def as_duplex(spec: DuplexSpec | LinkSpec | str) -> DuplexSpec:
    """Accept a spec string, one LinkSpec for both directions, or a DuplexSpec."""
    if isinstance(spec, str):
        return parse_link(spec)
    if isinstance(spec, LinkSpec):
        return DuplexSpec(up=spec, down=spec)
    return spec
