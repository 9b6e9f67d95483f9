"""The netsense policy's bandwidth estimate: the transport's delivery rate combined with what the
application's own sends showed, BBR's way, then shrunk for losses and a standing queue.

Kept apart from the law because it is the one part that reads evidence, not ladder figures: which
sample is trusted, which only bounds, and when a slow send says the path lost capacity.
"""

from __future__ import annotations

from collections import deque

from .link import LinkState

SLOWED_MIN_RTTS = 2.0
"""A send counts as slowed only if it lasted at least this many min RTTs beyond the first..."""
SLOWED_MIN_S = 0.02
"""...and at least this long: a small send pays a fixed per-message cost (the hosts' scheduling,
the PS's handling, delayed acks) of a few ms that a sub-ms loopback RTT does not cover; a 20 kB
loopback push took 5-12 ms whatever the level, which read as 16-32 Mbit/s and spiralled the
uplink into top-k 10 % on 217 of 300 steps..."""
SLOWED_FRACTION = 0.5
"""...and ran at under this fraction of the current estimate (`BandwidthEstimate.add_app_sample`)."""


class BandwidthEstimate:
    """Combines the transport's bandwidth with application samples, BBR's way.

    The most recent *trusted* evidence sets the estimate: the link's value when the link is not
    app-limited (it is already a windowed max), else the max over the last `app_window`
    application samples when a new non-app-limited one has arrived. App-limited evidence (the
    link's value while app-limited, short sends) can raise the estimate, never lower it, and
    never creates one: with nothing trusted the bandwidth stays unknown.
    """

    def __init__(self, *, app_window: int, min_sample_bytes: int, min_sample_rtts: float = 0.0) -> None:
        self.value_Bps: float | None = None
        """The current estimate (before queue and loss shrinkage), None while unknown."""
        self.min_sample_bytes = min_sample_bytes
        self.min_sample_rtts = min_sample_rtts
        self._app: deque[tuple[float, bool]] = deque(maxlen=app_window)  # (bytes/s, app-limited)
        self._fresh_app = False
        self._fresh_bounds: list[float] = []  # app-limited rates since the last update: lower bounds
        self._fresh_slowed = False  # a slowed send (see `add_app_sample`) since the last update
        self._slow_before = (False, False)  # the previous send was slow: in rate, and long (two in a row)
        self._discounted: float | None = None  # an app-limited link value a slowed send showed stale
        self.lower_bound_Bps: float | None = None
        """Max of the recent app-limited evidence (the last `app_window` application samples and the
        link's app-limited value at the last update): the path carries at least this much."""

    @property
    def link_stale(self) -> bool:
        """True while the link's app-limited value is one a slowed send showed stale (until the
        link has a trusted value again): its app-limited flag then says nothing about now."""
        return self._discounted is not None

    @property
    def last_sample_app_limited(self) -> bool:
        """True when the latest application sample did not fill the pipe."""
        return bool(self._app) and self._app[-1][1]

    def add_app_sample(
        self, *, bytes_sent: int, comm_s: float, min_rtt_s: float, app_limited: bool, mid_push: bool = False
    ) -> None:
        """Record one send; a latency-bound or small, short send is marked app-limited, unless it
        was *slowed*: it and the send before it each ran at under half the estimate for at least
        `SLOWED_MIN_S` beyond the first RTT, not latency-bound, and one of them for at least 2 min
        RTTs. An application limit can make a send short, never slow, so a slowed send is evidence
        that the path lost capacity, however small: 76 kB pushes after a 100 -> 10 Mbit/s
        step took 4-5x their predicted time, and as "small" sends they could not lower the estimate
        (the dynamic-trace benchmark held 44-54 Mbit/s through the 10 Mbit/s phase). A slowed
        sample replaces the higher application samples before it, and discounts the link's
        app-limited value (`update`).

        `mid_push`: the sample is a push still running, with bytes waiting unsent, at its redecide
        time (worker/redecide.py: at least twice its predicted time and 0.2 s past it). One such
        slow sample is slowed on its own: the two-in-a-row rule guards against host stalls of a few
        ms, not of 0.2 s, and without it the push the drop hit could not lower the estimate (a
        probe's stale 84 Mbit/s app-limited link value held the redecide at 60 Mbit/s while the push
        ran at 6.6: docs/BENCHMARKS.md, "Adaptive policy under a rate step")."""
        if bytes_sent <= 0 or comm_s <= 0:
            return
        net_s = comm_s - min_rtt_s  # the ack's return trip carries no payload
        latency_bound = net_s <= 0.5 * comm_s
        rate = bytes_sent / (comm_s if latency_bound else net_s)
        long_enough = (
            self.min_sample_rtts > 0
            and min_rtt_s > 0
            and net_s >= self.min_sample_rtts * min_rtt_s
            and bytes_sent >= self.min_sample_bytes / 16
        )
        slow_rate = (  # under half the estimate for >= SLOWED_MIN_S, and not latency-bound
            not app_limited
            and not latency_bound
            and self.value_Bps is not None
            and min_rtt_s > 0
            and net_s >= SLOWED_MIN_S
            and bytes_sent >= self.min_sample_bytes / 16
            and rate < SLOWED_FRACTION * self.value_Bps
        )
        slow = slow_rate and net_s >= SLOWED_MIN_RTTS * min_rtt_s
        # Two in a row, at least one of them spanning SLOWED_MIN_RTTS: a path that lost capacity
        # slows every send; a stalled host (CPU contention on shared cores slows a 40 kB loopback
        # push to 8 ms now and then) mostly one. Both spanning 2 min RTTs (until 2026-12-03) missed
        # a 10 Mbit/s phase over a 22 ms path: wide-mlp's 40 kB pushes alternated 57-59 ms (36 ms
        # beyond the first RTT, short of 44) and 62-72 ms, and the estimate held 45.7 Mbit/s.
        before_rate, before = self._slow_before
        slowed = (slow and (before_rate or mid_push)) or (slow_rate and before)
        self._slow_before = (slow_rate, slow)
        small = bytes_sent < self.min_sample_bytes and not long_enough and not slowed
        limited = app_limited or latency_bound or small
        if slowed:
            self._app = deque(((r, lim) for r, lim in self._app if lim or r <= rate), maxlen=self._app.maxlen)
            self._fresh_slowed = True
        self._app.append((rate, limited))
        if limited:
            self._fresh_bounds.append(rate)
        else:
            self._fresh_app = True

    def update(self, link: LinkState) -> float | None:
        """Fold in the link snapshot and any new application samples; return the estimate."""
        link_bw = link.bandwidth_Bps if link.bandwidth_Bps and link.bandwidth_Bps > 0 else None
        if link_bw is not None and not link.app_limited:
            self.value_Bps = link_bw
            self._discounted = None
        elif self._fresh_app:
            self.value_Bps = max(r for r, limited in self._app if not limited)
        if self._fresh_slowed and link_bw is not None and link.app_limited:
            # The link's app-limited value is a max kept until a trusted sample replaces it: after a
            # slowed send it is stale, and would restore the old estimate at every update.
            self._discounted = max(self._discounted or 0.0, link_bw)
        if link_bw is not None and link.app_limited and self._discounted is not None and link_bw <= self._discounted:
            link_bw = None  # no news: only an app-limited value above the stale one is a new bound
        if self.value_Bps is not None:
            bounds = self._fresh_bounds + ([link_bw] if link_bw is not None else [])
            self.value_Bps = max([self.value_Bps, *bounds])
        self._fresh_app = self._fresh_slowed = False
        self._fresh_bounds = []
        limited = [r for r, lim in self._app if lim] + ([link_bw] if link_bw is not None and link.app_limited else [])
        self.lower_bound_Bps = max(limited, default=None)
        return self.value_Bps


    def effective(self, link: LinkState, *, queue_tolerance_s: float) -> float | None:
        """`update`, then the estimate shrunk by losses and, on a saturated path, by a queue beyond
        `queue_tolerance_s`.

        B_eff = B * (1 - min(loss, 0.5)) * min(1, (min_rtt + tolerance) / (min_rtt + queue)), the
        queue being the link's standing queue (`LinkState.standing_queue_s`: the least RTT over the
        recent window less the least ever), else srtt - min_rtt. srtt carries the queue our own
        push built and that drains before the next one: 1 MB pushes at 50 Mbit/s through a 50 ms
        drop-tail queue left srtt at 40-60 ms over a 21 ms path, which halved B with nobody else on
        the link (docs/BENCHMARKS.md, rate step). The queue term applies only while the latest
        samples (link and application) were not app-limited: a full pipe plus a standing queue means
        the bottleneck is shared or overrun. RTT inflation while we send too little to fill anything
        is as often the hosts' CPUs (30-50 ms srtt over a 2 ms min RTT was seen with a PS and two
        workers in one process on 2 cores) as someone else's queue.
        """
        bw = self.update(link)
        if bw is None:
            return None
        bw *= 1.0 - min(max(link.loss_rate, 0.0), 0.5)
        saturated = not (link.app_limited or self.last_sample_app_limited)
        queue = link.standing_queue_s if link.standing_queue_s is not None else link.queue_delay_s
        if saturated and link.min_rtt_s is not None and link.min_rtt_s + queue > 0:
            rtt = link.min_rtt_s
            bw *= min(1.0, (rtt + queue_tolerance_s) / (rtt + queue))
        return bw
