"""Link specs for the link emulator (docs/EMULATOR.md): pure, no I/O but reading a trace file.

A spec is a comma-separated list of ``key=value`` fields, e.g.
``rate=50mbit,delay=20ms,queue=100ms,loss=0.01``. A field applies to both directions unless it is
prefixed ``up.`` (client -> upstream server) or ``down.`` (server -> client). A step trace may be
written inline as the rate, its steps continuing after commas: ``rate=0s:100mbit,20s:10mbit``.
The rates themselves (constant, steps, Mahimahi) are `traces.RateTrace`s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from netsense.errors import ConfigError

from .traces import MAHIMAHI_PACKET_BYTES, ConstantRate, RateTrace, StepRate, load_trace

DEFAULT_QUEUE_S = 0.1
"""Queue limit when a spec gives none: 100 ms at the reference rate, a common home-router buffer."""

_RATE_UNITS = {"bit": 1.0, "bps": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
# 1024-based like tc, so `queue=64kb` means the same here and in a `tbf limit`.
_BYTE_UNITS = {"b": 1, "kb": 1024, "mb": 1024 * 1024}
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z%]*)\s*$")


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
