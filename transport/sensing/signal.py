"""The network signal: an immutable snapshot of what one QUIC connection knows about its path.

`SignalReader` combines aioquic's recovery state (window, RTTs, PTO count, bytes per path, read in
`aioquic_private`) with the sensing congestion control's estimator (delivery-rate samples, windowed
bandwidth max, loss counters). `NetworkSignal.to_link_state()` narrows it to the `LinkState` the
adaptive policies consume; `LinkState` lives in compression, so the dependency points from transport
to compression (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from aioquic.quic.connection import QuicConnection

from netsense.compression.policy.link import LinkState

from . import aioquic_private
from .congestion import attach
from .estimator import SensingConfig, SensingState


@dataclass(frozen=True)
class NetworkSignal:
    """One connection's path as the sender sees it, at `timestamp`. Bandwidths are in bytes/s."""

    timestamp: float
    """Time of the snapshot, connection clock (event-loop time), seconds."""
    cwnd: int
    """Congestion window, bytes."""
    bytes_in_flight: int
    """Unacknowledged bytes counted against the window."""
    srtt: float | None
    """Smoothed RTT, seconds; None before the first RTT sample."""
    min_rtt: float | None
    """Minimum RTT (aioquic floors samples at 1 ms), seconds; None before the first RTT sample."""
    standing_queue: float | None
    """Queue that stood through the whole bandwidth window, seconds: the least raw RTT sample in the
    window less the least ever seen. Each push after a compute gap starts on an empty queue, so the
    queue a push builds itself (which srtt carries: 60 ms over a 21 ms path was seen for one 1 MB
    push at 50 Mbit/s) is not in it; someone else's standing queue is. None before an RTT sample."""
    latest_rtt: float | None
    """Latest RTT sample, seconds."""
    rttvar: float | None
    """RTT variance as aioquic computes it, seconds."""
    lost_packets: int
    """Packets declared lost since the connection started (monotone)."""
    lost_bytes: int
    """Bytes of those packets (monotone)."""
    sent_packets: int
    """In-flight (ack-eliciting or padded) packets sent since the connection started (monotone)."""
    pto_count: int
    """Consecutive probe timeouts without an ack."""
    delivery_rate: float | None
    """Latest delivery-rate sample, bytes/s; None before the first."""
    bandwidth: float | None
    """Bottleneck bandwidth estimate, bytes/s: windowed max of delivery-rate samples, app-limited
    samples admitted only when they raise it (BBR). None before the first sample."""
    push_rate: float | None
    """Delivery rate averaged over the latest push (busy period), bytes/s; None when not measured
    within the bandwidth window (`SensingState.push_rate_Bps`)."""
    fallback_bandwidth: float | None
    """min(cwnd, recent peak bytes in flight) / srtt, bytes/s: the rate the window allows, capped by
    what was really in flight because cwnd grows without bound while app-limited. None before srtt."""
    loss_rate: float
    """Lost / (acked + lost) packets over the recent loss window."""
    app_limited: bool
    """No delivery sample in the bandwidth window was taken with the pipe full (every one was sent
    while the sender had too little to send): `bandwidth` is only a lower bound. A property of the
    samples, not of the moment of reading (`SensingState.bandwidth_trusted`)."""
    bytes_sent: int
    """UDP payload bytes sent on the active path (monotone)."""
    delivered_bytes: int
    """Bytes of in-flight packets the peer acknowledged (monotone). aioquic counts received bytes only
    until the path is validated (anti-amplification), so this is the reliable "got through" counter."""
    rate_samples: int
    """Valid delivery-rate samples taken so far (monotone)."""

    @property
    def best_bandwidth(self) -> float | None:
        """The delivery-rate estimate when there is one, else the cwnd/srtt fallback, bytes/s."""
        return self.bandwidth if self.bandwidth is not None else self.fallback_bandwidth

    @property
    def push_bandwidth(self) -> float | None:
        """What the policies plan pushes with, bytes/s: `best_bandwidth`, capped by the rate the
        latest push really got (`push_rate`) when one was measured: a push-per-step sender shares
        the path with the other workers' simultaneous pushes, and the max filter does not see that."""
        best = self.best_bandwidth
        if best is None or self.push_rate is None:
            return best
        return min(best, self.push_rate)

    def to_link_state(self) -> LinkState:
        """The narrow view the adaptive policies consume (bandwidth in bytes/s)."""
        return LinkState(
            time_s=self.timestamp,
            bandwidth_Bps=self.push_bandwidth,
            min_rtt_s=self.min_rtt,
            srtt_s=self.srtt,
            standing_queue_s=self.standing_queue,
            loss_rate=self.loss_rate,
            app_limited=self.app_limited,
            cwnd_bytes=self.cwnd,
            bytes_in_flight=self.bytes_in_flight,
        )


def fallback_bandwidth(cwnd: int, srtt: float | None, inflight_peak: float | None) -> float | None:
    """min(cwnd, recent peak bytes in flight) / srtt, bytes/s; None before the first RTT sample.

    While app-limited, Reno/Cubic grow cwnd without bound (12 MB windows were seen on loopback), so
    cwnd / srtt alone would claim any rate; what was really in flight bounds what the path carried.
    """
    if not srtt:
        return None
    window = cwnd if inflight_peak is None else min(cwnd, inflight_peak)
    return window / srtt


class SignalReader:
    """Produces `NetworkSignal` snapshots of one connection.

    The estimator history lives in the connection's congestion controller, so any number of readers
    (or a reader created late) see the same per-connection state. Creating a reader wires the
    controller to the connection's pacer (`congestion.attach`) for the app-limited check.
    """

    def __init__(self, quic: QuicConnection, config: SensingConfig | None = None) -> None:
        aioquic_private.check_internals(quic)
        self._connection = quic
        self._state: SensingState = attach(quic, config)

    @property
    def state(self) -> SensingState:
        """The connection's estimator (for counters not in the snapshot)."""
        return self._state

    def read(self, now: float | None = None) -> NetworkSignal:
        """Snapshot now; `now` defaults to `time.monotonic()` (asyncio's loop clock)."""
        state = self._state
        state.flush()
        rec = aioquic_private.read_recovery(self._connection)
        sample = state.latest_sample
        fallback = fallback_bandwidth(rec.congestion_window, rec.srtt_s, state.inflight_peak.value)
        return NetworkSignal(
            timestamp=time.monotonic() if now is None else now,
            cwnd=rec.congestion_window,
            bytes_in_flight=rec.bytes_in_flight,
            srtt=rec.srtt_s,
            min_rtt=rec.min_rtt_s,
            standing_queue=state.standing_queue_s,
            latest_rtt=rec.latest_rtt_s,
            rttvar=rec.rttvar_s,
            lost_packets=state.lost_packets,
            lost_bytes=state.lost_bytes,
            sent_packets=state.sent_packets,
            pto_count=rec.pto_count,
            delivery_rate=sample.delivery_rate_Bps if sample else None,
            bandwidth=state.bandwidth.value,
            push_rate=state.push_rate_Bps,
            fallback_bandwidth=fallback,
            loss_rate=state.losses.rate,
            app_limited=not state.bandwidth_trusted if sample else state.app_limited,
            bytes_sent=rec.bytes_sent,
            delivered_bytes=state.delivered,
            rate_samples=state.rate_samples,
        )


def read_signal(quic: QuicConnection, now: float | None = None) -> NetworkSignal:
    """One-off snapshot of `quic` (a `SignalReader` is cheaper when reading repeatedly)."""
    return SignalReader(quic).read(now)
