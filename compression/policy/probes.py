"""When netsense sends a step at another level than the committed one, to learn what it cannot see.

Two moves, both on one cadence (`probe_interval` steps or `probe_interval_s` seconds since the
level last moved or probed): a *probe* sends a bandwidth sample while the path looks app-limited,
since an app-limited sample only bounds what the path carries: the committed level padded with
filler where the sender can pad (`probe_pad`), a lighter level elsewhere; an *exploration* sends a heavier
level that loses no measurable progress while the transport's per-byte cost is unknown, since that
fit needs sends of two sizes. A probe also waits until `probe_share` of the time since the last
one covers its predicted extra time and what the last one cost beyond its prediction, so a dear
probe on a steady link costs a bounded share.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from .bandwidth import BandwidthEstimate
from .costs import TransportCost
from .decision import ChooseRequest, byte_s, predict_steps
from .ladder import Ladder, Level
from .law import LevelHold
from .link import LinkState
from .netsense_settings import NetsensePolicySettings

HELD_SENDS = 5
"""Sends at the committed level whose median overrun (measured less predicted wire time) is what a
probe's own overrun is judged against (`Probes.owed_s`)."""

PROBE_RISE = 2.0
"""A probe is sized to stay a trusted bandwidth sample up to this many times the current estimate
(`Probes._probe_level`)."""


class Probes:
    """The probe and exploration rules over the policy's committed level and its evidence."""

    def __init__(
        self,
        settings: NetsensePolicySettings,
        ladder: Ladder,
        hold: LevelHold,
        bandwidth: BandwidthEstimate,
        transport: TransportCost,
    ) -> None:
        self.settings = settings
        self.ladder = ladder
        self.hold = hold
        self.bandwidth = bandwidth
        self.transport = transport
        self.moved_at: float | None = None
        """Link time of the last level change, probe or exploration."""
        self.exploring: int | None = None
        """The level the last decision explored, None when it did not."""
        self.backoff = 1
        """Factor on both probe intervals: doubled by each probe that found no headroom, up to
        `probe_backoff_max`; 1 again after a probe that found some or a change of level."""
        self._probed = False  # the last decision was a probe: the next one judges what it found
        self.probed_at: float | None = None
        """Link time of the last probe (the first decision's before any): `probe_share`'s clock."""
        self.peak_Bps: float | None = None
        """The highest bandwidth estimate a decision used: what this path has shown it carries."""
        self._probe_overrun: float | None = None  # the last probe's measured less predicted wire time
        self._probe_unsent = False  # a probe was chosen and its send is not yet reported (`sent`)
        self._held_overruns: deque[float] = deque(maxlen=HELD_SENDS)  # the same, sends at the committed level

    def next_move(
        self,
        request: ChooseRequest,
        reason: str,
        *,
        levels: list[Level],
        bw: float,
        per_byte: float,
        q: list[float],
        last_send_slow: bool,
    ) -> tuple[int, str, int] | None:
        """The level, reason and filler bytes of this step's probe or exploration, None to send the
        committed level (`reason`: why the law holds it). Called once per decision, after the law."""
        link, index = request.link, self.hold.level
        assert index is not None
        if self.moved_at is None or self.hold.since_change == 0:
            self.moved_at = link.time_s
        if self.probed_at is None:
            self.probed_at = link.time_s
        self.peak_Bps = max(self.peak_Bps or 0.0, bw)
        self._back_off(reason)
        if self._probe_due(link, reason, last_send_slow) and self._capacity_matters(levels, request, bw, per_byte, q):
            probe = self._probe(request, levels, bw=bw, per_byte=per_byte)
            if probe is not None:
                self.hold.since_probe = 0
                self.moved_at = self.probed_at = link.time_s
                self._probed = True
                self._probe_overrun = None  # paid: this probe's own comes with its send
                self._probe_unsent = True
                return probe
        explore = self._explore_level(link, reason, q)
        self.exploring = explore
        if explore is None:
            return None
        self.hold.since_probe = 0
        self.moved_at = link.time_s
        return explore, f"explore: per-byte cost unknown, {self.ladder[explore].spec}", 0

    def _probe(
        self, request: ChooseRequest, levels: list[Level], *, bw: float, per_byte: float
    ) -> tuple[int, str, int] | None:
        """The probe for this step (level, reason, filler bytes), None while `probe_share` of the
        time since the last probe does not yet cover its predicted extra time."""
        index = self.hold.level
        assert index is not None
        enough = self._sample_bytes(bw=bw, rtt_s=request.link.min_rtt_s or 0.0)
        pad = round(enough - levels[index].wire_bytes(request.payload_bytes))
        if request.pad_ok and self.settings.probe_pad and pad > 0:
            move = index, f"probe: {self.ladder[index].spec} padded by {pad} B", pad
            extra = pad * byte_s(bw, per_byte)
        else:
            level = self._probe_level(index, levels, request.payload_bytes, enough)
            move = level, f"probe: {index - level} lighter than {self.ladder[index].spec}", 0
            probe_s, held_s = predict_steps([levels[level], levels[index]], request, bandwidth_Bps=bw, per_byte_s=per_byte)
            extra = probe_s - held_s
        return move if self._paid(request.link, extra) else None

    def sent(self, overrun_s: float | None) -> None:
        """The last decision's send took `overrun_s` longer on the wire than predicted (None: no
        prediction). A probe's is kept for `owed_s`, a send at the committed level's for the
        baseline; an exploration's is neither. Only the first send after a probe is the probe's."""
        probe, self._probe_unsent = self._probe_unsent, False
        if overrun_s is None or not math.isfinite(overrun_s):
            return
        if probe:
            self._probe_overrun = overrun_s
        elif self.exploring is None:
            self._held_overruns.append(overrun_s)

    def owed_s(self) -> float:
        """What the last probe cost beyond its predicted extra time: its overrun less the median
        overrun of the latest `HELD_SENDS` sends at the committed level (most of them after it,
        when a probe is next due: a drop that slowed the probe slowed them too, and is not the
        probe's). A probe priced at the estimate runs into the link's slow phase, or a queue its
        own bytes build, unseen by the prediction: on an Adam MLP (not in the repo) at the steps
        link a qsgd:8 probe predicted at ~0.07 s more took 0.51 s where the held sends took
        0.04 s (docs/history/BENCHMARKS-2026.md, "The downlink's metric")."""
        if self._probe_overrun is None:
            return 0.0
        held = statistics.median(self._held_overruns) if self._held_overruns else 0.0
        return max(0.0, self._probe_overrun - held)

    def _paid(self, link: LinkState, extra_s: float) -> bool:
        """Whether a probe predicted to cost `extra_s` more than a step at the committed level, plus
        what the last probe cost beyond its own prediction (`owed_s`), fits `probe_share` of the
        time since the last probe, or the back-off's longest wait (`probe_interval_s` x
        `probe_backoff_max`) passed: a rise is seen within that bound, as on a steady link before.
        Cheap probes keep the cadence; dear ones (a 490 kB qsgd:8 probe where powersgd:2 sends
        32 kB) come as rarely as their cost asks, also in the seconds after a change of level,
        where the cadence alone probes after `probe_interval_s`. Without `owed_s` the share was
        planned, not kept: the transformer's probes (not in the repo) took 2-9 % of its time to
        target at a 3 % share (docs/history/BENCHMARKS-2026.md, "The downlink's metric")."""
        s = self.settings
        cost = max(0.0, extra_s) + self.owed_s()
        if s.probe_share <= 0 or cost <= 0:
            return True
        assert self.probed_at is not None  # `next_move` sets it at the first decision
        since = link.time_s - self.probed_at
        longest = s.probe_interval_s * s.probe_backoff_max
        return since * s.probe_share >= cost or (longest > 0 and since >= longest)

    def _back_off(self, reason: str) -> None:
        """Judge the probe sent last decision by this decision's law (`reason`, its probe's sample
        folded in): no headroom toward a lighter level doubles the intervals; headroom, a relax or
        a new level resets them. A path whose rate stands still then pays for a probe every 80
        steps (8 s) instead of every 20 (2 s); a rise is seen that much later there, at worst,
        while a link that changed level starts again from the short cadence."""
        if self.hold.since_change == 0:
            self.backoff = 1
        elif self._probed:
            found = not reason.startswith("hold: C*")
            self.backoff = 1 if found else min(self.settings.probe_backoff_max, 2 * self.backoff)
        self._probed = False

    def _cadence_due(self, link: LinkState) -> bool:
        """Whether `probe_interval` steps or `probe_interval_s` seconds, times `backoff`, passed
        since the level last moved or probed (by seconds, with at least one step at the committed
        level in between)."""
        s = self.settings
        steps = min(self.hold.since_change, self.hold.since_probe)
        by_steps = s.probe_interval > 0 and steps >= s.probe_interval * self.backoff
        by_time = (
            s.probe_interval_s > 0
            and steps >= 2  # at least one step at the committed level between probes
            and self.moved_at is not None
            and link.time_s - self.moved_at >= s.probe_interval_s * self.backoff
        )
        return by_steps or by_time

    def _probe_due(self, link: LinkState, reason: str, last_send_slow: bool) -> bool:
        app_limited = (link.app_limited and not self.bandwidth.link_stale) or self.bandwidth.last_sample_app_limited
        level = self.hold.level
        return (
            self._cadence_due(link)
            and app_limited
            and level is not None
            and level > 0
            and reason.startswith("hold: C*")  # neither just moved nor already on the way lighter
            and not last_send_slow  # a send slower than predicted says less capacity, not more
        )

    def _capacity_matters(
        self, levels: list[Level], request: ChooseRequest, bw: float, per_byte: float, q: list[float]
    ) -> bool:
        """Whether more bandwidth than `bw` could make the law pick a level lighter than the committed
        one, which is what a probe looks for, within reach (`_within_reach`), or a probe beyond it
        is due (`probe_unseen_s` since the last probe).

        Not at all when the measured per-byte cost c alone rules the lighter levels out: at
        unlimited bandwidth a byte still costs the part of c that 1 / `bw` does not explain (the
        hosts' CPUs: on unshaped loopback c was up to 2x 1 / B, and fp16 beat fp32 by 0.5-1.5 ms a
        step). There the probes (an fp32 step every 20 on each worker and the PS, ~15 % of steps
        with one) can reveal nothing that moves the choice. On a link-bound path c is ~1 / B,
        nothing is left over, and the reach decides."""
        host = max(0.0, per_byte - 1.0 / bw)
        assert self.hold.level is not None
        if host > 0:
            unlimited = predict_steps(levels, request, bandwidth_Bps=math.inf, per_byte_s=host)
            if self.hold.target(unlimited, q) >= self.hold.level:
                return False
        if self._within_reach(levels, request, bw, host, q):
            return True
        s = self.settings
        assert self.probed_at is not None  # `next_move` sets it at the first decision
        return s.probe_unseen_s <= 0 or request.link.time_s - self.probed_at >= s.probe_unseen_s

    def _within_reach(
        self, levels: list[Level], request: ChooseRequest, bw: float, host: float, q: list[float]
    ) -> bool:
        """Whether the law picks a lighter level than the committed one at `PROBE_RISE` x `bw` (a
        rise the probe's sample is sized to show) or at `peak_Bps` (a rate this path has carried),
        bytes costing max(1 / rate, `host`) there. A lighter level that pays only beyond both needs
        a rate never seen: on wide-mlp at 20 Mbit/s qsgd:4 beats powersgd:4 only at ~7x the rate."""
        reach = max(PROBE_RISE * bw, self.peak_Bps or 0.0)
        near = predict_steps(levels, request, bandwidth_Bps=reach, per_byte_s=host)
        assert self.hold.level is not None
        return self.hold.target(near, q) < self.hold.level

    def _sample_bytes(self, *, bw: float, rtt_s: float) -> float:
        """The least send that is a bandwidth sample (a probe too small to measure anything reveals
        nothing): `min_sample_bytes`, or what would still last `min_sample_rtts` min RTTs at
        `PROBE_RISE` times the bandwidth `bw` (and carries `min_sample_bytes` / 16, the estimate's
        own rule) if less: a bigger rise shows as a lower bound above the estimate, which raises
        it, and the sends after it measure the rest. On wide-mlp's 1 ms, 20 Mbit/s path the first
        rule alone probed fp16 (337 kB, ~135 ms a probe) where qsgd:4 (86 kB) measures up to 40
        Mbit/s (docs/history/BENCHMARKS-2026.md, "The first updates"); at a 20 ms RTT the two rules agree."""
        s = self.settings
        long_enough = max(s.min_sample_bytes / 16, PROBE_RISE * s.min_sample_rtts * rtt_s * bw)
        return s.min_sample_bytes if s.min_sample_rtts <= 0 or rtt_s <= 0 else min(s.min_sample_bytes, long_enough)

    def _probe_level(self, index: int, levels: list[Level], payload_bytes: int, enough: float) -> int:
        """The heaviest lighter level whose send carries `enough` bytes to be a bandwidth sample;
        one level lighter when none does."""
        big = [i for i in range(index) if levels[i].wire_bytes(payload_bytes) >= enough]
        return max(big) if big else index - 1

    def _explore_level(self, link: LinkState, reason: str, q: list[float]) -> int | None:
        """A heavier level to send once, on the probes' cadence, while the transport's per-byte cost
        is unknown: the fit needs sends of two sizes, and a path where fp32 ties fp16 on bandwidth
        alone may never send fp16 otherwise. Only from a lossless level (from a lossy one the probes
        send lighter levels) and only to a level that loses no measurable progress and is
        `MIN_SIZE_SPREAD` smaller (fp16 from fp32): the worst it costs is a few casts."""
        s, index = self.settings, self.hold.level
        if not (s.transport_cost and s.progress_aware) or index is None or not reason.startswith("hold: C*"):
            return None
        if not self.ladder[index].lossless:
            return None  # a lossy level gets its second point from the probes (lighter levels)
        if self.transport.s_per_byte(link.time_s) is not None:
            return None
        going = self.exploring
        if going is not None and self.transport.count(going) < self.transport.min_samples:
            return going  # a point needs `min_samples` sends: explore for that many steps in a row
        if not self._cadence_due(link):
            return None
        size = self.ladder[index].ratio
        return next(
            (
                j
                for j in range(index + 1, len(self.ladder))
                if q[j] >= 1 - s.progress_tol and self.ladder[j].ratio * self.transport.min_spread <= size
            ),
            None,
        )
