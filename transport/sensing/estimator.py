"""The bottleneck-bandwidth estimator the sensing congestion control feeds, one per connection.

BBR-style delivery-rate samples (draft-cheng-iccrg-delivery-rate-estimation), an app-limited flag
per sample, loss counters and a windowed maximum of the delivery rate. Pure: it sees packets only
through `SentPacket` (which aioquic's `QuicSentPacket` satisfies) and times as plain floats, so it
is tested with synthetic packets and does not change when aioquic does. The hooks are called by
`congestion.py`; aioquic's private state is read in `aioquic_private.py` alone.

Longer than most modules here: `SensingState` is one state machine (restart, bubble, flight
re-basing, ack batches), and its docstrings carry the measurements that justify each rule.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from netsense.errors import ConfigError

from .filters import LossWindow, WindowedMax, WindowedMin


class SentPacket(Protocol):
    """What the estimator reads of a sent packet; it stamps `netsense_tx` on it."""

    sent_time: float | None
    sent_bytes: int


@dataclass(frozen=True)
class SensingConfig:
    """How long the estimators remember; defaults follow BBR (10 round trips) with a floor in seconds."""

    bandwidth_window_s: float = 2.0
    """Shortest bandwidth-max window, seconds (the floor under `bandwidth_window_rtts` * srtt)."""
    bandwidth_window_rtts: float = 10.0
    """Bandwidth-max window in smoothed RTTs, as BBR's 10-round filter."""
    loss_window_s: float = 2.0
    """Window over which `loss_rate` counts acked and lost packets, seconds."""

    def __post_init__(self) -> None:
        for name in ("bandwidth_window_s", "bandwidth_window_rtts", "loss_window_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigError(f"SensingConfig.{name} must be > 0, got {value!r}")




@dataclass(frozen=True)
class RateSample:
    """One delivery-rate sample: bytes newly delivered over the interval they took (BBR)."""

    time: float
    """Ack time the sample was taken at, connection clock seconds."""
    delivery_rate_Bps: float
    """Delivered bytes / max(send interval, ack interval), bytes/s (UDP payload, headers included)."""
    delivered_bytes: int
    """Bytes delivered over the sample's interval."""
    interval_s: float
    """The interval, seconds: the longer of the send and ack intervals (guards against ack bursts)."""
    app_limited: bool
    """The packet was sent while the sender had too little to send: the rate is only a lower bound."""


MIN_TRAIN_PACKETS = 10
"""A re-based first-flight sample (an ack train, see `SensingState`) over fewer packets is only a
lower bound: with an ack per two packets and delayed acks, the ack clock's granularity is then a
large part of its interval. (A 150 kB push in 8952-byte datagrams is 17 packets.)"""


class _TxState(NamedTuple):
    """Delivery state stamped on a sent packet (attribute `netsense_tx` of the sent packet).

    A tuple, not a dataclass: it is built for every packet sent, on the sender's hot path.
    """

    delivered: int
    delivered_time: float
    first_sent_time: float
    sent_time: float
    app_limited: bool
    flight: float | None = None
    """Start time of the flight when sent before that flight's first ack (the sample is then taken
    from the first ack on, see `SensingState`), else None."""


class SensingState:
    """Per-connection estimator fed by the sensing congestion control's hooks.

    Delivery-rate samples follow draft-cheng-iccrg-delivery-rate-estimation: each sent packet is
    stamped with the connection's delivered count and times; when it is acked the rate is the bytes
    delivered since, over max(send interval, ack interval). One sample is produced per ack batch
    (aioquic acks packets one by one with the same `now`), from the most recently sent packet acked.

    Restart after idle (nothing in flight): a push after a compute gap is one burst, often all sent
    before its first ack (Reno's window grows while app-limited, so it holds the whole push). Stamped
    the usual way, every packet of that first flight would carry the flight's start as its reference
    and its interval would include one whole RTT: k packets / (RTT + k packets' serialisation), a
    rate biased low, which the draft (and Linux) therefore mark app-limited -- so a push that fits in
    one flight never gave a trusted sample (measured: 150 kB pushes at 50 Mbit/s, 20 ms RTT, every
    sample app-limited, estimate 25 Mbit/s). Here first-flight packets are re-based on the flight's
    first ack batch instead (delivered, ack time and the newest acked packet's send time then, as if
    they had been sent after it): the ack train from the first ack to the k-th measures the
    bottleneck, with max(send interval, ack interval) and the min-RTT floor guarding as usual. The
    first batch itself gives only the RTT-biased sample, flagged app-limited (a lower bound), and so
    does a train of fewer than `MIN_TRAIN_PACKETS` packets; a push whose train is shorter than one
    min RTT gives no sample past the floor (such a push measures latency more than bandwidth: the
    150 kB above take about one RTT at 50 Mbit/s). The idle time is in no interval, so the first
    flight is not app-limited by itself: the application had the whole push queued when it was sent
    (BBR's rule: a packet is app-limited when the sender had nothing more to send as it went out).

    App-limited criterion (what a congestion controller can see from aioquic): aioquic sends a burst
    of packets in one `datagrams_to_send` call, all with the same `sent_time`, and stops when the
    window is full, when the pacer holds it back, or when there is nothing (allowed) to send. At the
    next event we judge the finished burst: if a full-size packet still fitted in the window and the
    pacer did not stop it (`pacing_until`, wired to the connection by `attach`), the sender ran out
    of data (or of peer flow-control credit, which limits us just the same) -> app-limited. Without
    `attach` we also mark a burst app-limited when it starts after an idle gap longer than the
    smoothed RTT with window to spare and data still in flight. Like BBR, once app-limited, every
    packet sent until the data then in flight is delivered is marked, since its sample interval spans
    the idle bubble; a restart with nothing in flight closes the bubble (nothing is left to span it).

    Trust (`bandwidth_trusted`) is a property of the samples, not of the moment the estimate is read:
    the estimate is trusted while a non-app-limited sample lies within one bandwidth window of the
    newest sample. Reading between pushes, with nothing in flight, does not make it a lower bound.
    """

    def __init__(self, max_datagram_size: int, config: SensingConfig | None = None) -> None:
        self.config = config or SensingConfig()
        """Window lengths."""
        self.max_datagram_size = max_datagram_size
        """Full packet size, bytes: a window with less room than this counts as full."""
        self.pacing_until: Callable[[], float | None] | None = None
        """When the pacer lets the next packet go if it stopped the last send attempt, else None;
        set by `attach` (reads the connection's `_pacing_at`)."""

        self.delivered = 0
        """Bytes acknowledged so far (in-flight packets only)."""
        self.sent_packets = 0
        """In-flight packets handed to the congestion controller."""
        self.sent_bytes = 0
        """Bytes of those packets."""
        self.acked_packets = 0
        """Packets acknowledged."""
        self.lost_packets = 0
        """Packets declared lost (congestion events only; PTO retransmissions are not losses)."""
        self.lost_bytes = 0
        """Bytes of those packets."""
        self.app_limited_samples = 0
        """Rate samples flagged app-limited."""
        self.rate_samples = 0
        """Valid rate samples produced."""
        self.min_rtt_s: float | None = None
        """Minimum raw RTT sample seen by the controller (no 1 ms floor), seconds."""
        self.srtt_s: float | None = None
        """Smoothed RTT (7/8 EWMA of raw samples) used to size windows, seconds."""

        self.bandwidth = WindowedMax(self.config.bandwidth_window_s)
        """Windowed max of admitted delivery rates, bytes/s (app-limited ones only if they raise it)."""
        self.inflight_peak = WindowedMax(self.config.bandwidth_window_s)
        """Windowed max of bytes in flight after a send: caps the cwnd fallback when app-limited."""
        self.recent_rtt = WindowedMin(self.config.bandwidth_window_s)
        """Windowed min of raw RTT samples over the bandwidth window, seconds. Its excess over
        `min_rtt_s` is a queue that stood through the whole window: each push after a compute gap
        starts on an empty queue, so the queue it builds itself does not show here (srtt would)."""
        self.losses = LossWindow(self.config.loss_window_s)
        """Recent loss fraction."""

        self._delivered_time = 0.0
        self._deliveries: list[tuple[int, int, Callable[[float], None]]] = []  # heap: (count, seq, callback)
        self._delivery_seq = itertools.count()
        self._first_sent_time = 0.0
        self._app_limited_until = 0  # delivered count that ends the app-limited bubble; 0 = none
        self._last_event_time: float | None = None
        # the open burst: its send time, whether the pacer stopped it
        self._burst_time: float | None = None
        self._burst_paced_until: float | None = None
        # the current ack batch: its time, the most recently sent packet acked, packets acked
        self._pending: tuple[float, _TxState] | None = None
        self._batch_acked = 0
        self._latest: tuple[float, float, int, float, bool] | None = None  # RateSample fields
        self._trusted_time: float | None = None  # time of the newest non-app-limited sample
        # the current flight (since a restart with nothing in flight): its start, and its first ack
        # batch's (delivered, ack time, newest acked packet's send time), the re-basing reference
        self._flight: float | None = None
        self._flight_ref: tuple[int, float, float, int] | None = None  # ... and packets acked then
        self._push: tuple[float, float] | None = None  # (time, bytes/s) of the latest push rate

    @property
    def latest_sample(self) -> RateSample | None:
        """The newest valid rate sample (built on demand: samples are taken on every ack batch)."""
        return None if self._latest is None else RateSample(*self._latest)

    def configure(self, config: SensingConfig) -> None:
        """Change window lengths (keeps history)."""
        self.config = config
        self.losses.window_s = config.loss_window_s
        self._resize_windows()

    def _resize_windows(self) -> None:
        window = self.config.bandwidth_window_s
        if self.srtt_s is not None:
            window = max(window, self.config.bandwidth_window_rtts * self.srtt_s)
        self.bandwidth.window_s = self.inflight_peak.window_s = self.recent_rtt.window_s = window

    @property
    def app_limited(self) -> bool:
        """True while the app-limited bubble is open (packets sent now are marked)."""
        return self._app_limited_until != 0

    @property
    def standing_queue_s(self) -> float | None:
        """Least RTT in the bandwidth window less the least ever seen, seconds (None before one)."""
        recent = self.recent_rtt.value
        if recent is None or self.min_rtt_s is None:
            return None
        return max(0.0, recent - self.min_rtt_s)

    @property
    def bandwidth_trusted(self) -> bool:
        """A non-app-limited sample lies within one bandwidth window of the newest sample: the
        estimate is a measurement of the path, not only a lower bound (whenever it is read)."""
        latest = self._latest
        return (
            latest is not None
            and self._trusted_time is not None
            and latest[0] - self._trusted_time <= self.bandwidth.window_s
        )

    def _mark_app_limited(self, bytes_in_flight: int) -> None:
        # max(.., 1): with nothing in flight the bubble still covers the next packet sent
        self._app_limited_until = max(self.delivered + bytes_in_flight, 1)

    def _close_burst(self, congestion_window: int, bytes_in_flight: int) -> None:
        """Judge the burst sent last: window room left and the pacer did not stop it -> app-limited."""
        if self._burst_time is None:
            return
        room = congestion_window - bytes_in_flight
        if self.pacing_until is not None and room >= self.max_datagram_size and self._burst_paced_until is None:
            self._mark_app_limited(bytes_in_flight)
        # a burst ends at its peak in flight: one filter update per burst, not per packet
        self.inflight_peak.update(self._burst_time, bytes_in_flight)
        self._burst_time = None

    # hooks, called by the congestion controller -----------------------------------------------

    def on_sent(
        self, packet: SentPacket, congestion_window: int, bytes_in_flight: int
    ) -> None:
        """Stamp `packet` (before it is added to `bytes_in_flight`)."""
        if self._pending is not None:
            self.flush()
        now = packet.sent_time or 0.0
        if now != self._burst_time:  # the first packet of a `datagrams_to_send` call
            self._close_burst(congestion_window, bytes_in_flight)
            srtt = self.srtt_s
            # aioquic checks the pacer before it looks for data, so a burst "stopped by the pacer"
            # may just have run out of data: if the pacer allowed a packet well before this burst,
            # nothing was sent then for want of data. Without `attach`, an idle gap > srtt says so.
            paced_until = self._burst_paced_until
            if paced_until is not None and srtt is not None:
                idle = now > paced_until + max(0.002, srtt / 4)
            else:
                idle = self._last_event_time is not None and srtt is not None and now - self._last_event_time > srtt
            if bytes_in_flight == 0:
                self._restart(now)
            elif idle and congestion_window - bytes_in_flight >= self.max_datagram_size:
                self._mark_app_limited(bytes_in_flight)
            self._burst_time = now
            # the pacer's verdict for this call is final before aioquic registers its packets
            self._burst_paced_until = self.pacing_until() if self.pacing_until is not None else None
        packet.netsense_tx = _TxState(  # type: ignore[attr-defined]
            self.delivered,
            self._delivered_time,
            self._first_sent_time,
            now,
            self._app_limited_until != 0,
            self._flight if self._flight_ref is None else None,
        )
        self.sent_packets += 1
        self.sent_bytes += packet.sent_bytes
        self._last_event_time = now

    def _restart(self, now: float) -> None:
        """Nothing in flight: sample afresh (the idle time is in no interval), open a new flight and
        close any bubble (everything it covered has been delivered or lost)."""
        self._first_sent_time = self._delivered_time = now
        self._flight, self._flight_ref = now, None
        self._app_limited_until = 0

    def when_delivered(self, nbytes: int, callback: Callable[[float], None]) -> None:
        """Call `callback(now)` from the ack that takes `delivered` `nbytes` past its count now,
        `now` being that ack's time (the connection's clock); at once, with the latest ack's time,
        if `nbytes` <= 0. A delivery is timed at its ack, with no task per reply polling the count
        (the PS's downlink polled every 2 ms: docs/history/BENCHMARKS-2026.md, "The first updates").
        `callback` must not raise: it runs inside the connection's ack handling."""
        if nbytes <= 0:
            callback(self._delivered_time)
            return
        heapq.heappush(self._deliveries, (self.delivered + nbytes, next(self._delivery_seq), callback))

    def on_acked(
        self, packet: SentPacket, now: float, congestion_window: int, bytes_in_flight: int
    ) -> None:
        """Count the delivery and keep the most recently sent packet of this ack batch."""
        if self._burst_time is not None:
            self._close_burst(congestion_window, bytes_in_flight)
        pending = self._pending
        if pending is not None and pending[0] != now:
            self.flush()
            pending = None
        self.delivered += packet.sent_bytes
        self._delivered_time = now
        while self._deliveries and self._deliveries[0][0] <= self.delivered:
            heapq.heappop(self._deliveries)[2](now)
        self._batch_acked += 1
        if self._app_limited_until and self.delivered > self._app_limited_until:
            self._app_limited_until = 0
        tx: _TxState | None = getattr(packet, "netsense_tx", None)
        if tx is not None and (pending is None or tx.delivered >= pending[1].delivered):
            self._pending = (now, tx)
            # the next packets' send interval starts at this packet's send time (draft §3.3)
            self._first_sent_time = tx.sent_time
        self._last_event_time = now

    def on_lost(
        self, packets: Iterable[SentPacket], now: float, congestion_window: int, bytes_in_flight: int
    ) -> None:
        """Count lost packets (aioquic only reports congestion-event losses here)."""
        self._close_burst(congestion_window, bytes_in_flight)
        self.flush()
        count = 0
        for packet in packets:
            count += 1
            self.lost_bytes += packet.sent_bytes
        self.lost_packets += count
        if count:
            self.losses.on_lost(now, count)

    def on_other(self, congestion_window: int, bytes_in_flight: int) -> None:
        """Any other hook (expiry, persistent congestion): close the open burst and ack batch."""
        self._close_burst(congestion_window, bytes_in_flight)
        self.flush()

    def on_rtt(self, rtt: float, now: float | None = None) -> None:
        """Track raw RTT samples: they bound sample intervals, size the windows and, with `now`,
        feed the recent-minimum filter (`recent_rtt`)."""
        if self.min_rtt_s is None or rtt < self.min_rtt_s:
            self.min_rtt_s = rtt
        self.srtt_s = rtt if self.srtt_s is None else 0.875 * self.srtt_s + 0.125 * rtt
        if now is not None:
            self.recent_rtt.update(now, rtt)

    def _update_push_rate(self, now: float, floor: float) -> None:
        """The busy period's delivery rate so far: bytes acked since its first ack batch over the
        time since, once that spans `floor` and `MIN_TRAIN_PACKETS` packets."""
        ref = self._flight_ref
        if ref is None or now - ref[1] < floor or self.acked_packets - ref[3] < MIN_TRAIN_PACKETS:
            return
        self._push = (now, (self.delivered - ref[0]) / (now - ref[1]))

    @property
    def push_rate_Bps(self) -> float | None:
        """Delivery rate averaged over the latest busy period (a push: from a restart with nothing in
        flight until the pipe empties), from its first ack to its latest ack of a packet sent with
        data queued, bytes/s; None when no such measurement lies within one bandwidth window of the
        newest sample.

        The windowed max answers "how fast can this path go"; a push after a compute gap asks "how
        fast did the last push go". They differ when workers share a bottleneck and push at once:
        each gets its share while both send and the whole link for its tail, so the max of each
        worker's samples reads up to the full rate (20 Mbit/s per worker was seen on a 20 Mbit/s
        uplink shared by two), while its pushes move at about half. The average over the push also
        shows a rate drop that happened during it, where the max still holds the samples from before.
        """
        if self._push is None or self._latest is None:
            return None
        time, rate = self._push
        return rate if self._latest[0] - time <= self.bandwidth.window_s else None

    def flush(self) -> None:
        """Turn the pending ack batch into a rate sample and feed the bandwidth filter."""
        if self._pending is None:
            return
        now, tx = self._pending
        self._pending = None
        self.acked_packets += self._batch_acked
        self.losses.on_acked(now, self._batch_acked)
        self._batch_acked = 0
        delivered_ref, delivered_time, first_sent = tx.delivered, tx.delivered_time, tx.first_sent_time
        app_limited = tx.app_limited
        if tx.flight is not None and tx.flight == self._flight:
            if self._flight_ref is None:
                # the flight's first ack batch: the reference for the rest of the flight; its own
                # sample spans the RTT before the first ack, a lower bound only
                self._flight_ref = (self.delivered, now, tx.sent_time, self.acked_packets)
                app_limited = True
            else:
                delivered_ref, delivered_time, first_sent, acked_ref = self._flight_ref
                app_limited = app_limited or self.acked_packets - acked_ref < MIN_TRAIN_PACKETS
        interval = max(tx.sent_time - first_sent, now - delivered_time)
        delivered = self.delivered - delivered_ref
        # Intervals shorter than min RTT come from ack compression or stretch acks and overstate the
        # rate (draft §3.3); loopback RTTs are sub-millisecond, so also require a measurable interval.
        floor = self.min_rtt_s if self.min_rtt_s is not None and self.min_rtt_s > 1e-4 else 1e-4
        if not tx.app_limited:
            self._update_push_rate(now, floor)
        if delivered <= 0 or interval < floor:
            return
        rate = delivered / interval
        self._latest = (now, rate, delivered, interval, app_limited)
        self.rate_samples += 1
        if app_limited:
            self.app_limited_samples += 1
        else:
            self._trusted_time = now
        current = self.bandwidth.value
        # BBR's rule: an app-limited sample may raise the estimate, never lower it.
        if not app_limited or current is None or rate >= current:
            self._resize_windows()
            self.bandwidth.update(now, rate)


