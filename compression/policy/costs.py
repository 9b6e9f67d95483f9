"""What a level really costs on this machine, learned at run time (docs/POLICIES.md: measured, not assumed).

Two figures the step-time model needs and the ladder can only guess:

- `CodecCosts`: encode and decode seconds per MB of dense fp32, per level. The ladder's defaults
  plan qsgd:8 at 0.012 s/MB for both; on digits-cnn's six keys with error feedback, on 2 shared
  cores, its encode alone measured ~50 s/MB (7.5 ms for 153 kB), more than fp16 saves in bytes on
  an unshaped or 100 Mbit/s path. Each level starts from the ladder's figures (defaults or
  `Ladder.calibrate`) and switches to what was measured as soon as one timing arrives.
- `StepJitter`: how much the measured step varies from one step to the next, the noise floor
  under which two levels' predicted costs cannot be told apart.
- `TransportCost`: seconds per wire byte as the application sees the transport. Loopback QUIC in
  Python is CPU-bound (~40-100 MB/s per connection: docs/ARCHITECTURE.md, "Measured aioquic
  facts"), so bytes cost time even where no link limits, and the bandwidth estimate (delivery
  rate, or only a lower bound while app-limited) can overstate how fast a payload really goes.

- The update's decode (`CodecCosts.observe_return`): against a gradient-domain PS the update
  comes back at the level pushed and the worker decodes it before its next step, outside Tc and
  the push. On two sites' digits-cnn it took 2.8 ms a step at top-k 1 % and 2.1 at qsgd:4 against
  0.7 at `powersgd:1` (the PS forwards both pushes: two decodes, at fp32 values), which a common
  overhead figure charged to every level alike (docs/POLICIES.md, "The update's decode").

All are pure: callers hand in durations they timed.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import replace

from .ladder import MB, Ladder, Level

DEFAULT_COST_WINDOW = 8
"""Timings per level and direction kept for the median."""
DEFAULT_TRANSPORT_WINDOW = 8
"""Sends per level kept for its point of the per-byte fit."""
DEFAULT_TRANSPORT_HORIZON_S = 10.0
"""Seconds a level's point counts after its latest send."""
DEFAULT_TRANSPORT_MIN_SAMPLES = 3
"""Sends a level needs before its point counts (the median of three drops one outlier)."""
MIN_SIZE_SPREAD = 1.5
"""The per-byte fit needs points whose largest send is at least this many times the smallest."""
RETURN_RATIO_BOUNDS = (0.5, 4.0)
"""An unsent level's update decode is its decode figure times the sent levels' median ratio of
the two, clamped to this range (a forwarded update is two decodes; Python's per-key work)."""


def _valid(seconds: float | None) -> bool:
    return seconds is not None and math.isfinite(seconds) and seconds >= 0


class CodecCosts:
    """Per-level encode and decode seconds per MB of dense fp32: the median of the last `window`
    timings, the ladder's figure until the first one.

    A median, not a mean: on shared cores one timing in ten or so is a scheduler stall several
    times the usual, and a mean would let one stall move a level's cost for many steps.
    """

    def __init__(self, ladder: Ladder, *, window: int = DEFAULT_COST_WINDOW) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.ladder = ladder
        self._encode: list[deque[float]] = [deque(maxlen=window) for _ in ladder]
        self._decode: list[deque[float]] = [deque(maxlen=window) for _ in ladder]
        self._return: list[deque[float]] = [deque(maxlen=window) for _ in ladder]
        # The policy asks for every level on every decision; timings arrive a few times per step at
        # most, so each level's medians are taken once per new timing (None: to be recomputed).
        self._levels: list[Level | None] = [None] * len(ladder)
        self._ratio: float | None = None  # `_return_ratio`, None: to be recomputed

    def observe(
        self, level: int, *, dense_bytes: int, encode_s: float | None = None, decode_s: float | None = None
    ) -> None:
        """One timing of `level` on `dense_bytes` of fp32 input (either half may be missing).
        Negative, non-finite or zero-sized timings are ignored."""
        if not 0 <= level < len(self.ladder) or dense_bytes <= 0:
            return
        mb = dense_bytes / MB
        if _valid(encode_s):
            self._encode[level].append(encode_s / mb)  # type: ignore[operator]
            self._levels[level] = None
        if _valid(decode_s):
            self._decode[level].append(decode_s / mb)  # type: ignore[operator]
            self._levels[level] = None
            if self._return[level]:  # the ratio the unsent levels borrow is over this figure too
                self._forget()

    def observe_return(self, level: int, *, dense_bytes: int, decode_s: float) -> None:
        """One timing of the worker's decode of an update that came back at `level`, for
        `dense_bytes` of fp32 (a real step's, not a candidate round's). Invalid ones are ignored."""
        if not 0 <= level < len(self.ladder) or dense_bytes <= 0 or not _valid(decode_s):
            return
        self._return[level].append(decode_s / (dense_bytes / MB))
        self._forget()  # the ratio unsent levels borrow moves with it

    def _forget(self) -> None:
        self._levels = [None] * len(self.ladder)
        self._ratio = None

    def _decode_s_per_mb(self, index: int) -> float:
        dec = self._decode[index]
        return statistics.median(dec) if dec else self.ladder[index].decode_s_per_mb

    def _return_ratio(self) -> float:
        """Median over the levels with update timings of their figure over their decode figure
        (1 until one is timed), within `RETURN_RATIO_BOUNDS`; taken once per new timing."""
        if self._ratio is None:
            ratios = [
                statistics.median(timings) / dec
                for i, timings in enumerate(self._return)
                if timings and (dec := self._decode_s_per_mb(i)) > 0
            ]
            lo, hi = RETURN_RATIO_BOUNDS
            self._ratio = min(hi, max(lo, statistics.median(ratios))) if ratios else 1.0
        return self._ratio

    def measured(self, level: int) -> tuple[bool, bool]:
        """Whether `level`'s encode and decode costs come from timings (not the ladder)."""
        return bool(self._encode[level]), bool(self._decode[level])

    def encode_s_per_mb(self, level: int) -> float:
        """Current encode cost of `level`, s/MB."""
        return self.level(level).encode_s_per_mb

    def decode_s_per_mb(self, level: int) -> float:
        """Current decode cost of `level`, s/MB."""
        return self.level(level).decode_s_per_mb

    def level(self, index: int) -> Level:
        """Ladder level `index` with its current costs (the ladder's when nothing was measured);
        its update decode is its own timings' median, else its decode figure times the ratio the
        timed levels show (`_return_ratio`), else None (no update timed: priced 0)."""
        cached = self._levels[index]
        if cached is None:
            base, enc, dec, ret = self.ladder[index], self._encode[index], self._decode[index], self._return[index]
            decode = self._decode_s_per_mb(index)
            timed = any(self._return)
            back = None
            if ret:
                back = statistics.median(ret)
            elif timed:
                back = decode * self._return_ratio()
            cached = self._levels[index] = (
                replace(
                    base,
                    encode_s_per_mb=statistics.median(enc) if enc else base.encode_s_per_mb,
                    decode_s_per_mb=decode,
                    return_decode_s_per_mb=back,
                )
                if enc or dec or timed
                else base
            )
        return cached

    def levels(self) -> list[Level]:
        """Every ladder level with its current costs, in ladder order."""
        return [self.level(i) for i in range(len(self.ladder))]


class TransportCost:
    """Marginal seconds per wire byte of a send, fitted across the levels' recent sends.

    A send's time beyond one min RTT and the peer's decode is modelled as a + c * bytes: `a` absorbs
    what does not grow with the payload (the last pusher waits for the PS's optimizer step; stream
    set-up), `c` is the per-byte cost. Dividing one send's time by its bytes would charge those
    fixed costs to the bytes: a 1.6 kB top-k push took 8 ms on loopback, which would price a byte at
    0.2 MB/s and push every level toward the smallest. So each level keeps one point (the medians
    of its last `window` sends' bytes and times) and `c` is the least-squares slope through the
    points; it needs two levels of different sizes with `min_samples` sends each (startup, probes and
    level changes give them; one send is no point: the first pushes after start-up took 5-10x the
    later ones, lazy set-up at both ends). Since the fixed part is >= 0, no point can cost more per
    byte than its own time / bytes: `c` is capped there, which bounds what noise on a small spread
    can do (two points 76 kB apart with +-10 ms of scheduler noise on loaded cores).
    A point lasts `horizon_s` after its level's latest send, so a slope found once stays known while
    one level is sent for a while, yet a rate seen before the link changed does not outlive it.
    Sends that start on a standing queue (srtt - min_rtt above a tolerance) are skipped: their time
    measures someone else's traffic, which the bandwidth estimate already shrinks for.
    """

    def __init__(
        self,
        *,
        window: int = DEFAULT_TRANSPORT_WINDOW,
        min_spread: float = MIN_SIZE_SPREAD,
        horizon_s: float = DEFAULT_TRANSPORT_HORIZON_S,
        min_samples: int = DEFAULT_TRANSPORT_MIN_SAMPLES,
    ) -> None:
        if not 1 <= min_samples <= window or not horizon_s > 0:
            raise ValueError(
                f"need 1 <= min_samples <= window and horizon_s > 0, got {min_samples}, {window} and {horizon_s}"
            )
        self.window = window
        self.min_samples = min_samples
        self.min_spread = min_spread
        self.horizon_s = horizon_s
        self._sends: dict[int, deque[tuple[float, float]]] = {}  # level -> (wire bytes, seconds)
        self._last: dict[int, float] = {}  # level -> time of its latest send
        # The fit changes only with a send or when a point leaves the horizon, yet the policy asks
        # for it on every decision: points are kept until their level's next send, and the fit
        # with the levels it was made from.
        self._points: dict[int, tuple[float, float]] = {}
        self._fit: tuple[tuple[int, ...], float | None] | None = None

    def observe(
        self,
        *,
        level: int,
        bytes_sent: int,
        comm_s: float,
        time_s: float,
        min_rtt_s: float = 0.0,
        peer_decode_s: float = 0.0,
        queue_s: float = 0.0,
        queue_tolerance_s: float = math.inf,
    ) -> None:
        """One send at `level` of `bytes_sent` at `time_s` that took `comm_s` (first byte to ack), of
        which `min_rtt_s` is the ack's round trip and `peer_decode_s` the receiver's predicted decode."""
        if bytes_sent <= 0 or not (math.isfinite(comm_s) and comm_s > 0) or queue_s > queue_tolerance_s:
            return
        sends = self._sends.setdefault(level, deque(maxlen=self.window))
        sends.append((float(bytes_sent), max(0.0, comm_s - min_rtt_s - peer_decode_s)))
        self._last[level] = time_s
        self._points.pop(level, None)
        self._fit = None

    def count(self, level: int) -> int:
        """Sends of `level` in its window."""
        return len(self._sends.get(level, ()))

    def points(self, now_s: float) -> list[tuple[float, float]]:
        """(bytes, seconds) per level sent within `horizon_s` of `now_s`: the medians of its sends."""
        return [self._point(level) for level in self._live(now_s)]

    def s_per_byte(self, now_s: float) -> float | None:
        """The fitted marginal cost c (>= 0) at `now_s`, None until two levels of different sizes
        were sent within the horizon."""
        live = self._live(now_s)
        if self._fit is None or self._fit[0] != live:
            self._fit = (live, self._slope([self._point(level) for level in live]))
        return self._fit[1]

    def _live(self, now_s: float) -> tuple[int, ...]:
        """Levels with a point at `now_s`: `min_samples` sends, the latest within the horizon."""
        return tuple(
            level
            for level, sends in self._sends.items()
            if len(sends) >= self.min_samples and now_s - self._last[level] <= self.horizon_s
        )

    def _point(self, level: int) -> tuple[float, float]:
        point = self._points.get(level)
        if point is None:
            sends = self._sends[level]
            point = (statistics.median(b for b, _ in sends), statistics.median(t for _, t in sends))
            self._points[level] = point
        return point

    def _slope(self, pts: list[tuple[float, float]]) -> float | None:
        """The capped least-squares slope through `pts`; None for fewer than two or too close sizes."""
        if len(pts) < 2:
            return None
        xs = [b for b, _ in pts]
        if max(xs) < self.min_spread * min(xs):
            return None
        mx = statistics.fmean(xs)
        my = statistics.fmean(t for _, t in pts)
        var = sum((x - mx) ** 2 for x in xs)
        cov = sum((x - mx) * (t - my) for x, t in pts)
        return min(max(0.0, cov / var), min(t / b for b, t in pts))

    def goodput_Bps(self, now_s: float) -> float | None:
        """1 / c: the rate at which one more byte moves, None when unknown or free."""
        c = self.s_per_byte(now_s)
        return 1.0 / c if c else None


JITTER_MIN_SAMPLES = 4
"""Step times `StepJitter` needs before it reports anything but 0."""


class StepJitter:
    """The median relative deviation of the last `window` measured step times: |t - m| / m, m their
    median. The codec and transport timings behind every P_l are medians of a few samples taken
    under this noise, so a difference in predicted cost below it is not evidence (`LevelHold.target`).
    0 until `JITTER_MIN_SAMPLES` steps were seen; `window` 0 keeps it 0."""

    def __init__(self, window: int) -> None:
        self._steps: deque[float] = deque(maxlen=max(window, 1))
        self._on = window > 0
        self.value = 0.0
        """The current relative jitter (0 while unknown)."""

    def observe(self, step_s: float) -> None:
        """One measured step (compute plus the send); non-finite or non-positive ones are ignored."""
        if not self._on or not (math.isfinite(step_s) and step_s > 0):
            return
        self._steps.append(step_s)
        if len(self._steps) >= JITTER_MIN_SAMPLES:
            m = statistics.median(self._steps)
            self.value = statistics.median(abs(t - m) for t in self._steps) / m


RETURN_WINDOW = 8
"""Update deliveries `ReturnShare` keeps for its median."""
RETURN_MIN_SAMPLES = 3
"""Deliveries it needs before it reports anything but 1."""
RETURN_MIN_S = 0.004
"""A delivery counts only if its bytes take this long at the push's rate: the fixed part of its time
(the PS's write to the first packet, the last ack's delay) is ~1 ms, and on a smaller update it
would read as a share of several."""
RETURN_SHARE_BOUNDS = (0.25, 8.0)
"""The share is clamped to this range: beyond it a figure says more about the hosts' scheduling than
about the path."""


class ReturnShare:
    """How many pushed bytes' worth of time a byte of the update takes on its way back: the median
    of the last `RETURN_WINDOW` deliveries' (seconds - min RTT) / (bytes x a pushed byte's time).

    The step-time model sends a gradient-domain update back at the level pushed and priced that
    return at the push's rate, yet the PS writes one copy per worker at once: where the workers
    share a bottleneck (the bench's emulated link; workers behind one site's WAN uplink) each
    worker's copy waits for the others', and a byte of the update costs ~n pushed bytes. Each
    worker saw the other copies as a fixed part of its step, so a lighter level's saving was
    understated by the number of workers (docs/POLICIES.md, "The update's return"). The PS times
    every copy of an update, first write to last delivery (ps/returns.py), and an ACK reports it
    (`Ack.delivered_s`)."""

    def __init__(self, *, window: int = RETURN_WINDOW, min_samples: int = RETURN_MIN_SAMPLES) -> None:
        if not 1 <= min_samples <= window:
            raise ValueError(f"need 1 <= min_samples <= window, got {min_samples} and {window}")
        self._shares: deque[float] = deque(maxlen=window)
        self._min_samples = min_samples
        self.value = 1.0
        """The current share (1 until `min_samples` deliveries counted)."""

    def observe(self, *, nbytes: int, seconds: float, min_rtt_s: float, push_byte_s: float) -> None:
        """One delivery of `nbytes` that took `seconds` from the PS's write to its ack, on a path of
        `min_rtt_s` where a pushed byte takes `push_byte_s`. Skipped when invalid or when its bytes
        would take less than `RETURN_MIN_S` at that rate."""
        if nbytes <= 0 or not (math.isfinite(seconds) and seconds >= 0) or not (math.isfinite(push_byte_s) and push_byte_s > 0):
            return
        expected = nbytes * push_byte_s
        if expected < RETURN_MIN_S:
            return
        lo, hi = RETURN_SHARE_BOUNDS
        self._shares.append(min(hi, max(lo, max(0.0, seconds - max(0.0, min_rtt_s)) / expected)))
        if len(self._shares) >= self._min_samples:
            self.value = statistics.median(self._shares)
