"""What a policy knows of the link: the narrow input type the adaptive policies consume.

`netsense.transport` builds it from its richer `NetworkSignal`; defining it here keeps the
dependency arrow pointing from transport to compression (docs/ARCHITECTURE.md, "Layers").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinkState:
    """A snapshot of one connection's path, as seen by the sender."""

    time_s: float
    """Monotonic time of the snapshot, seconds."""
    bandwidth_Bps: float | None
    """Bottleneck bandwidth estimate in bytes/s (windowed max delivery rate); None if unknown."""
    min_rtt_s: float | None
    """Minimum round-trip time seen, seconds (propagation estimate); None before the first ack."""
    srtt_s: float | None
    """Smoothed round-trip time, seconds."""
    loss_rate: float = 0.0
    """Fraction of packets declared lost over the recent window."""
    app_limited: bool = False
    """True when recent samples were taken while the sender had too little to send."""
    cwnd_bytes: int | None = None
    """Congestion window in bytes."""
    bytes_in_flight: int | None = None
    """Unacknowledged bytes in flight."""
    standing_queue_s: float | None = None
    """Queue that stood through the recent bandwidth window (least recent RTT - least RTT), seconds:
    unlike srtt - min_rtt it leaves out the queue our own push built. None when not measured."""

    @property
    def queue_delay_s(self) -> float:
        """Standing queue estimate: srtt - min_rtt (0 when unknown)."""
        if self.srtt_s is None or self.min_rtt_s is None:
            return 0.0
        return max(0.0, self.srtt_s - self.min_rtt_s)
