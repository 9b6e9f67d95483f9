"""``netsense``, ours: compress only as much as buys time (docs/POLICIES.md, "netsense (ours)").

This module is the policy's interface and its evidence: what `choose` and `redecide` predict with
(measured codec and transport costs, progress efficiencies q, the bandwidth estimate) and what
`observe` learns. The law and its hysteresis are in `law`, the probes in `probes`, the bandwidth
estimate in `bandwidth`, the settings in `netsense_settings`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import replace

from ..base import make_codec
from ..progress import DEFAULT_SAMPLE_NUMEL
from ..window import WINDOW_SAMPLE_NUMEL, WindowResult, sees_whole_keys
from .bandwidth import BandwidthEstimate
from .base import Policy
from .costs import CodecCosts, ReturnShare, StepJitter, TransportCost
from .decision import ChooseRequest, Decision, SendReport, byte_s, predict_steps
from .ladder import NOMINAL_NUMEL, Ladder, Level
from .law import LevelHold, intents_anchor
from .link import LinkState
from .netsense_settings import NetsensePolicySettings
from .overhead import StepOverhead
from .probes import Probes
from .progress import ProgressEstimate, error_odds
from .registry import register_policy
from .settings import settings_factory

log = logging.getLogger(__name__)


DRIFT_BUDGET_FACTOR = 4.0
"""A window due because a contender's windowed q went stale (`window_drift`), or is still the run's
first window's (`ProgressEstimate.start`: a fresh model's steps), may take this many times
`progress_budget`: stale figures are worse than the CPU (charlm at 5 % windows every 50 steps cost
~7 s of a 50 s run; at 1 % one stale window held for 200 steps)."""

REGRET_POINTS = 9
"""Rates at which a level's regret under a lower bound is read (`NetsensePolicy._under_bound`): 1 / B
evenly from 0 (unlimited) to 1 / bound; each cost is linear in 1 / B, the best of them is not."""

PADDED = -1
"""The transport's point for padded probes (`TransportCost` keeps one per level sent: a padded
send is larger than its level's, and a size of its own for the per-byte fit)."""


class NetsensePolicy(Policy):
    """Ours (docs/POLICIES.md): T_l = r_l S / B + min_rtt + e_l with the queue-free bandwidth B;
    P_l = Tc + T_l (or max(Tc, T_l) with overlap); the least lossy level with P_l <= (1+eps) P*
    wins; heavier at once, lighter after k steps of headroom; upward probes while app-limited."""

    def __init__(self, ladder: Ladder, settings: NetsensePolicySettings) -> None:
        super().__init__(ladder, name="netsense")
        settings.check(len(ladder))
        s = self.settings = settings
        self.costs = CodecCosts(ladder, window=s.cost_window)
        """Measured encode/decode cost per level (the ladder's figures until timed)."""
        self.transport = TransportCost()
        """Measured marginal seconds per wire byte, fitted across levels."""
        self.returns = ReturnShare()
        """What a byte of the update costs coming back, in pushed bytes (`ChooseRequest.return_share`)."""
        self._push_byte_s: float | None = None  # a pushed byte's time as the last prediction priced it
        self._payload_bytes = 0  # S of the last decision
        self._queue_s = 0.0  # the link's standing queue at the last decision
        self._now_s = 0.0  # link time of the last decision
        self.progress = ProgressEstimate(ladder, alpha=s.progress_alpha, floor=s.progress_floor)
        """Progress efficiency q per level: codec priors, refined by `observe_progress`."""
        self.bandwidth = BandwidthEstimate(
            app_window=s.app_window, min_sample_bytes=s.min_sample_bytes, min_sample_rtts=s.min_sample_rtts
        )
        """Bandwidth estimator fed by `choose` (link) and `observe` (application samples)."""
        self.hold = LevelHold(s, ladder.specs)
        """The committed level and its hysteresis."""
        self.probes = Probes(s, ladder, self.hold, self.bandwidth, self.transport)
        """When to send a step lighter (probe) or heavier (exploration) than the committed level."""
        self.jitter = StepJitter(s.jitter_window)
        """The measured step's relative jitter: the floor of a move's band (`LevelHold.target`)."""
        self._compute_s: float | None = None  # Tc of the last decision, for its step's measured time
        self._decisions = 0
        self._predicted_wire_s: tuple[float, float] | None = None
        """The last decision's wire time at 1 / B, and at max(1 / B, c) as the law predicts it (None
        while the bandwidth is unknown): the first judges a slow send, the second a probe's cost."""
        self._last_send_slow = False  # the last send took much longer than predicted
        self._min_rtt_s = 0.0
        self._round: tuple[int, float] | None = None  # step and link time of the latest candidate round
        self._window_at: float | None = None  # link time the latest progress window started
        self._window_step_s: float | None = None  # CPU seconds per level-step of the latest window
        self._window_level_s: dict[int, float] = {}  # CPU seconds of one window step per level, as last measured
        self._ratios: dict[int, float] = {}  # wire ratios measured on the run's shapes (`observe_ratio`)
        self._contenders: list[int] | None = None  # levels the law could accept at q = 1 (last decision)
        self._worst_q = [worst_case_q(lv) for lv in ladder]  # each codec's own, not the ladder's figure
        self._bandwidth_seen = False  # the bandwidth (or a lower bound) was known at a decision
        self._blind = False  # the committed level was chosen before any window's figure (`choose`)
        self._evidence = 0  # window results that priced levels, up to the first full window's
        self._decided_on = 0  # `_evidence` in hand at the last decision
        self._full_window_seen = False
        self.overhead = StepOverhead(s.overhead_window)
        """The step's unmodelled time, added to every level's predicted step."""
        self._pin_table(s.progress_table or {})

    def _pin_table(self, table: Mapping[str, float]) -> None:
        """Price the ladder's levels named in `table` at their calibrated q for the whole run."""
        unknown = []
        for spec, q in table.items():
            index = self.ladder.find(spec)
            if index is None:
                unknown.append(spec)
            elif not self.ladder[index].lossless:
                self.progress.pin(index, float(q))
        if unknown:
            log.warning("progress table: %s not on the ladder %s; ignored", ", ".join(unknown), self.ladder.spec)

    @property
    def level(self) -> int | None:
        """Committed level (probes excepted), None before the first decision."""
        return self.hold.level

    @level.setter
    def level(self, index: int | None) -> None:
        self.hold.level = index

    @property
    def k_now(self) -> int:
        """Current headroom requirement (k with back-off)."""
        return self.hold.k_now

    def provisional(self) -> None:
        """The next decision is the law's afresh (the committed level is released, not changed)."""
        self.hold.level = None

    def safe_level(self) -> int:
        """The level sent while the bandwidth is unknown: `settings.safe_level` if set, else the
        fewest bytes (the ratio measured on the run's shapes, else nominal; the first on a tie)
        among the levels that lose nothing measurable, q within `progress_tol` of 1: a level's
        measured q once a candidate round or a window measured it, else its codec's own worst case
        (not the ladder's figure, which a caller may set). Before any measurement that is fp16 on
        the default ladder (fp32 without a 16-bit level); once the first round (step 0, before the
        first push) measured the 8-bit level lossless, that level: half of fp16's bytes."""
        s = self.settings
        if s.safe_level is not None:
            return s.safe_level
        q = self._lossless_q()
        ok = [i for i, qi in enumerate(q) if qi >= 1 - s.progress_tol] or [0]
        return min(ok, key=lambda i: (self._ratios.get(i, self.ladder[i].ratio), i))

    def _lossless_q(self) -> list[float]:
        """q per level as the rule for an unknown bandwidth (`safe_level`) judges "loses nothing":
        measured by a round or window, else the codec's worst case. A calibrated figure does not
        count (`progress_table`): a table pricing qsgd:4 at 1.00 made it the unknown-bandwidth
        level, and its 180 kB sends on wide-mlp were app-limited, so the bandwidth stayed unknown
        and one worker sent it for 21 steps (docs/history/BENCHMARKS-2026.md, "Calibrated q")."""
        p = self.progress
        return [p.values[i] if p.measured[i] and not p.pinned[i] else self._worst_q[i] for i in range(len(self.ladder))]

    def _under_bound(
        self, levels: list[Level], request: ChooseRequest, preds: list[float], q: list[float], *, bound: float, per_byte: float
    ) -> list[float]:
        """`preds` (at the lower `bound`) with the levels the law may not pick set to inf.

        Only a lower bound is known (every send so far was app-limited: small, latency-bound): the
        rate may be anything from it up. Each level's *regret* is the most its cost P_l / q_l
        exceeds the best level's over that range (1 / B from 0 to 1 / `bound`, `REGRET_POINTS`
        points; bytes cost at least the host's part of c), and the law may pick only the levels
        whose regret is within `move_eps` of the least. A level that loses progress thus needs to
        be near the best at unlimited bandwidth as well as at the bound, and a lossless one near
        the best at the bound. Lossless levels alone (before 2026-12-05) kept digits-cnn's uplinks
        (153 kB pushes, never a bandwidth sample) at qsgd:4 for whole runs, whose encode and
        decode cost 3-4 ms a step more than powersgd:4's at twice the bytes (docs/history/BENCHMARKS-2026.md,
        "Lower bound: the least regret")."""
        host = max(0.0, per_byte - 1.0 / bound)
        worst = [1.0] * len(preds)
        for k in range(REGRET_POINTS):
            rate = math.inf if k == 0 else bound * (REGRET_POINTS - 1) / k
            at = preds if k == REGRET_POINTS - 1 else predict_steps(levels, request, bandwidth_Bps=rate, per_byte_s=host)
            cost = [p / qi for p, qi in zip(at, q)]
            best = min(cost)
            worst = [max(w, c / best) for w, c in zip(worst, cost)]
        least = min(worst)
        return [p if w <= least * (1 + self.settings.move_eps) else math.inf for p, w in zip(preds, worst)]

    def effective_bandwidth(self, link: LinkState) -> float | None:
        """The estimate after `link`, shrunk by losses and a queue (`BandwidthEstimate.effective`)."""
        return self.bandwidth.effective(link, queue_tolerance_s=self.settings.queue_tolerance_s)

    def choose(self, request: ChooseRequest) -> Decision:
        # A gradient-domain downlink sends the level back, at the share its deliveries measured;
        # every level's step holds the time the model leaves out (`StepOverhead`).
        request = replace(request, wire_passes=self.passes, return_share=self.returns.value, overhead_s=self.overhead.value)
        decision = self._choose(request)
        predicted = decision.predicted_step_s
        self.overhead.decided(request.link.time_s, None if predicted is None else predicted - request.overhead_s)
        return decision

    def _choose(self, request: ChooseRequest) -> Decision:
        s, link = self.settings, request.link
        self._decisions += 1
        if link.min_rtt_s is not None:
            self._min_rtt_s = link.min_rtt_s
        self._payload_bytes, self._queue_s, self._now_s = request.payload_bytes, link.queue_delay_s, link.time_s
        self._compute_s = request.compute_s
        bw = self.effective_bandwidth(link)
        levels = self._levels_now()
        per_byte = self._per_byte_s()
        preds: list[float] | None = None  # set once the law has predicted every level

        def emit(index: int, reason: str, pad: int = 0) -> Decision:
            return self._emit(request, levels, index, reason, bw=bw, per_byte=per_byte, preds=preds, pad=pad)

        bound = self.bandwidth.lower_bound_Bps if bw is None and s.progress_aware else None
        if bw is None and bound is None:
            if not self._bandwidth_seen:  # follows the measurements until a bandwidth is known
                self.level = self.safe_level()
            return emit(self.level, "unknown-bandwidth")
        self._bandwidth_seen = True
        if bw is None:
            bw = bound  # `emit` reports it as the bandwidth used
        assert bw is not None
        rtt = link.min_rtt_s or 0.0
        q = self._qs()
        preds = predict_steps(levels, request, bandwidth_Bps=bw, per_byte_s=per_byte)
        if bound is not None:
            preds = self._under_bound(levels, request, preds, q, bound=bw, per_byte=per_byte)
        best = min(p / qi for p, qi in zip(preds, q))
        self._contenders = [i for i, p in enumerate(preds) if p <= (1 + s.eps) * best]
        blind = self._release_blind()
        self._set_anchor()
        reason = self.hold.step(preds, q, bw) + (" (lower bound B)" if bound is not None else "") + blind
        self._blind = not self.progress.windows_seen
        self._decided_on = self._evidence
        index = self.level
        assert index is not None
        if self._decisions <= s.warmup_steps and index > s.warmup_level:
            return emit(s.warmup_level, f"warm-up: law wanted {self.ladder[index].spec}")
        move = self.probes.next_move(
            request, reason, levels=levels, bw=bw, per_byte=per_byte, q=q, last_send_slow=self._last_send_slow
        )
        return self._sent(emit(*move) if move is not None else emit(index, reason), bw, rtt)

    def _release_blind(self) -> str:
        """Release the committed level if it was chosen before any progress window's figure, while
        windows run and the first is young (`progress_window` decisions): the law then decides
        afresh, no headroom holding the old choice; returns the note for the reason. Until the first
        window's interim figure (W/4 steps in) every lossy level is priced by one step of a fresh
        model's gradient, which is of low rank: charlm's first round priced powersgd:1 at 0.94 (its
        window 0.62 four steps later, and rank 2 never reaches charlm's target), and the hold kept
        rank 1 five steps more and relaxed to powersgd:4 where the law had moved on to qsgd:4
        (docs/POLICIES.md, "Warm-up"). The hysteresis guards a choice against the link's jitter, not
        against the first evidence of what error feedback delivers."""
        if self.hold.level is None or self._window_at is None:
            return ""
        if self._blind and self._decisions <= self.settings.progress_window:  # else no window came
            self.provisional()
            return " (before the first window: no hold)"
        if self._decided_on < self._evidence:
            # The first window's figures come in turn, interim ones projected from fewer steps, then
            # its own: each replaces the one the level was chosen on, and is the law's afresh. On
            # wide-mlp with 4 workers the hold kept powersgd:4 from the interim figure at W/4 until
            # the window ended, 12 % behind powersgd:2 on the figure at W/2 (docs/POLICIES.md,
            # "Interim figures").
            self.provisional()
            return " (a new window figure: no hold)"
        return ""

    def redecide(self, *, link: LinkState, sent: Decision, bytes_acked: int, elapsed_s: float) -> Decision | None:
        """The law again, mid-push, with the push so far as a bandwidth sample (its pipe is full:
        bytes wait unsent). Only a move to a heavier level is returned, and it is committed as if
        `choose` had made it: a rate drop that lands while a step computes is otherwise seen only
        by the push after the slow one (docs/BENCHMARKS.md, rate step). No step is counted."""
        s, index = self.settings, sent.level
        if index is None or self.level is None or elapsed_s <= 0:
            return None
        self.overhead.drop()  # this step's push was slow: its length says nothing of the model's gaps
        self.bandwidth.add_app_sample(
            bytes_sent=bytes_acked, comm_s=elapsed_s, min_rtt_s=self._min_rtt_s, app_limited=False, mid_push=True
        )
        bw = self.effective_bandwidth(link)
        if bw is None:
            return None
        self._now_s = link.time_s
        request = replace(sent.request(link), wire_passes=self.passes, return_share=self.returns.value)
        levels, per_byte, rtt = self._levels_now(), self._per_byte_s(), link.min_rtt_s or 0.0
        q = self._qs()
        preds = predict_steps(levels, request, bandwidth_Bps=bw, per_byte_s=per_byte)
        target, ok = self.hold.law(preds, q, s.eps, s.tie_eps)
        if index in ok or target <= index:
            return None
        if target > self.level:
            self.hold.go_heavier(target, bw)
        self._predicted_wire_s = None  # the withdrawn push is not observed
        cost = [p / qi for p, qi in zip(preds, q)]
        reason = (
            f"redecide: {sent.spec} push slow ({elapsed_s:.3g}s, {bytes_acked} B acked), "
            f"C_{index}={cost[index]:.4g}s, C*={min(cost):.4g}s"
        )
        return self._sent(self._emit(request, levels, target, reason, bw=bw, per_byte=per_byte, preds=preds), bw, rtt)

    def observe(self, report: SendReport) -> None:
        """Adds an application bandwidth sample (bytes over comm time less one min RTT)."""
        level, bytes_sent, comm_s = report.level, report.bytes_sent, report.comm_s
        predicted_wire, self._predicted_wire_s = self._predicted_wire_s, None
        predicted = None if predicted_wire is None else predicted_wire[0]
        if self._compute_s is not None:
            self.jitter.observe(self._compute_s + comm_s)
            self.hold.jitter = self.jitter.value
        self._last_send_slow = predicted is not None and comm_s > 1.5 * predicted + 0.005
        self.probes.sent(None if predicted_wire is None else comm_s - predicted_wire[1])
        self.bandwidth.add_app_sample(
            bytes_sent=bytes_sent, comm_s=comm_s, min_rtt_s=self._min_rtt_s, app_limited=bool(report.app_limited)
        )
        if report.returned is not None and self._push_byte_s is not None:
            nbytes, seconds = report.returned
            self.returns.observe(nbytes=nbytes, seconds=seconds, min_rtt_s=self._min_rtt_s, push_byte_s=self._push_byte_s)
        if level is not None and 0 <= level < len(self.ladder):
            # The receiver decodes before it acknowledges (the PS acks a push once decoded), so its
            # decode is part of comm_s but not of the transport's per-byte cost.
            peer_decode = self.costs.decode_s_per_mb(level) * self._payload_bytes / 1e6
            self.transport.observe(
                level=PADDED if report.pad_bytes else level,  # a padded send is not the level's size
                bytes_sent=bytes_sent,
                comm_s=comm_s,
                time_s=self._now_s if report.time_s is None else report.time_s,
                min_rtt_s=self._min_rtt_s,
                peer_decode_s=peer_decode,
                queue_s=self._queue_s,
                queue_tolerance_s=self.settings.queue_tolerance_s,
            )

    def probe_bytes(self, payload_bytes: int) -> int:
        """`min_sample_bytes` before the first decision (`start_probe`): the least send the estimate
        trusts as bandwidth, whatever `payload_bytes` (a payload under that size is no sample
        itself: without the probe such a run was priced on lower bounds throughout). 0 once a
        decision was taken."""
        s = self.settings
        if not s.start_probe or self._decisions:
            return 0
        return s.min_sample_bytes

    def observe_probe(self, *, bytes_sent: int, comm_s: float, min_rtt_s: float | None) -> None:
        """The start-up probe as an application sample. Not a level's send: the transport's
        per-byte fit and the step jitter learn nothing from it. A probe that ran latency-bound
        (a path whose BDP exceeds it) is only a lower bound, as for a push (`add_app_sample`)."""
        if min_rtt_s is not None and min_rtt_s > 0:
            self._min_rtt_s = min_rtt_s
        self.bandwidth.add_app_sample(bytes_sent=bytes_sent, comm_s=comm_s, min_rtt_s=self._min_rtt_s, app_limited=False)

    def observe_costs(
        self, *, level: int, dense_bytes: int, encode_s: float | None = None, decode_s: float | None = None
    ) -> None:
        """Folds a timing of `level` into its measured costs (median of the last `cost_window`)."""
        self.costs.observe(level, dense_bytes=dense_bytes, encode_s=encode_s, decode_s=decode_s)

    def observe_return(self, *, level: int, dense_bytes: int, decode_s: float) -> None:
        """Folds a timing of the update's decode at `level` into its measured figure (`CodecCosts`)."""
        self.costs.observe_return(level, dense_bytes=dense_bytes, decode_s=decode_s)

    def observe_progress(self, *, level: int, progress: float, interim: bool = False) -> None:
        """Folds a measured q of `level` into its EWMA (the first measurement replaces the prior);
        an `interim` one only replaces the prior, and the next replaces it in turn."""
        if 0 <= level < len(self.ladder) and math.isfinite(progress):
            self.progress.update(level, progress, interim=interim)

    def observe_window(self, result: WindowResult) -> None:
        """Folds a progress window's q_W into each level's q (it replaces one-step figures for good)
        and its noise scale into the estimate (`ProgressEstimate.noise`)."""
        for level, q in result.progress.items():
            if 0 <= level < len(self.ladder) and math.isfinite(q):
                self.progress.update_window(level, q, interim=result.interim, first=result.first)
        if not self._full_window_seen and result.progress:
            self._evidence += 1  # `_release_blind`: the next decision is the law's afresh
            self._full_window_seen = not result.interim
        if not result.interim and math.isfinite(result.noise.signal) and math.isfinite(result.noise.noise):
            self.progress.update_noise(result.noise)
        if result.level_steps > 0 and math.isfinite(result.cpu_s) and result.cpu_s > 0:
            self._window_step_s = result.cpu_s / result.level_steps
        self._window_level_s.update({i: c for i, c in result.level_cpu_s.items() if math.isfinite(c) and c > 0})

    @property
    def sent_window_steps(self) -> int:  # type: ignore[override]
        """W of the sent level's window: the progress windows' W (`sent_window_drift` set)."""
        s = self.settings
        return s.progress_window if s.sent_window_drift > 0 and s.progress_aware and s.progress_window >= 2 else 0

    def observe_sent_window(self, *, level: int, progress: float) -> None:
        """The sent level's q_W (docs/POLICIES.md, "The sent level's window") replaces its q when
        it puts the level's error odds `sent_window_drift` times above the estimate's: a figure the
        windows got from a fresh model or a short fill, on a stream the run has left behind.
        Smaller differences leave the estimate as it is: the other levels' figures share the
        windows' bias, so correcting the sent level alone would send the run to lighter ones."""
        if not (0 <= level < len(self.ladder)) or self.ladder[level].lossless or not 0 < progress <= 1:
            return
        now = max(self.progress[level], self.progress.floor)
        if error_odds(progress) >= self.settings.sent_window_drift * error_odds(now):
            self.progress.restate(level, progress)  # never a pinned level

    def observe_ratio(self, *, level: int, ratio: float) -> None:
        """A level's wire ratio on the run's shapes replaces the nominal one (PowerSGD's nominal
        ratio assumes one square matrix: 4x too small for wide-mlp's keys)."""
        if 0 <= level < len(self.ladder) and math.isfinite(ratio) and ratio > 0:
            self._ratios[level] = ratio

    def progress_window(self, step: int) -> tuple[list[int], int]:
        """The lossy levels that could win: those whose predicted step P_l is within (1 + eps) of
        the last decision's best cost C* (at q = 1 they would be accepted; the others cannot be,
        whatever they measure), every lossy level before the law has predicted. The first window
        at the first step asked (priors are worst cases: until it ends, PowerSGD is priced 0.05),
        later ones on the candidate rounds' schedule (`progress_every`), when the time since the
        last window is at least the window's cost (`window_cost`) over `progress_budget`
        (`DRIFT_BUDGET_FACTOR` times that for a stale figure or the first window's); W is `progress_window`."""
        s = self.settings
        if not s.progress_aware or s.progress_window < 2 or s.progress_every <= 0:
            return [], 0
        if step % s.progress_every and self._window_at is not None:  # the first window starts at once
            return [], 0
        contend = self._contenders
        levels = [
            i
            for i, lv in enumerate(self.ladder)
            if not lv.lossless and not self.progress.pinned[i] and (contend is None or i in contend)
        ]
        if not levels:
            return [], 0
        if self._window_at is not None and s.progress_budget > 0:
            drifted = s.window_drift > 0 and any(self.progress.drift(i) > s.window_drift for i in levels)
            stale = drifted or any(self.progress.start[i] for i in levels)  # a fresh model's figures
            budget = s.progress_budget * (DRIFT_BUDGET_FACTOR if stale else 1.0)
            if (self._now_s - self._window_at) * budget < self.window_cost(levels):
                return [], 0
        self._window_at = self._now_s
        return levels, s.progress_window

    def window_cost(self, levels: list[int]) -> float:
        """Predicted CPU seconds of a window over `levels`: 1.5 W error-feedback steps per level,
        each at what that level's steps cost in the latest window that ran it (`WindowResult.
        level_cpu_s`), a level no window ran yet at the latest window's mean per level-step;
        before any window, at its codec's measured cost on its sample (whole keys for low-rank
        levels, else the fixed subsample), which leaves out a step's per-key calls and checks
        (docs/POLICIES.md, "Schedule and cost": 1.1-20x short)."""
        steps = 1.5 * self.settings.progress_window
        if self._window_step_s is not None:
            return steps * sum(self._window_level_s.get(i, self._window_step_s) for i in levels)
        sample = {i: self._payload_bytes if sees_whole_keys(self.ladder[i].spec) else 4 * WINDOW_SAMPLE_NUMEL for i in levels}
        return steps * sum(self.costs.level(i).codec_s(sample[i]) for i in levels)

    def progress_candidates(self, step: int) -> list[int]:
        """Every lossy level, every `progress_every` steps (from step 0) within `progress_budget` of
        the time: priors are worst-case bounds, so a level is judged on its measured q before long,
        whether used or not. Asked again for the same step, it answers the same."""
        s = self.settings
        if not s.progress_aware or s.progress_every <= 0 or step % s.progress_every:
            return []
        levels = [i for i, lv in enumerate(self.ladder) if not lv.lossless]
        last = self._round
        if last is not None and last[0] != step and s.progress_budget > 0:
            sample = min(self._payload_bytes, 4 * DEFAULT_SAMPLE_NUMEL)
            cost = sum(self.costs.level(i).codec_s(sample) for i in levels)
            if (self._now_s - last[1]) * s.progress_budget < cost:
                return []
        if last is None or last[0] != step:
            self._round = (step, self._now_s)
        return levels

    def _emit(
        self,
        request: ChooseRequest,
        levels: list[Level],
        index: int,
        reason: str,
        *,
        bw: float | None,
        per_byte: float,
        preds: list[float] | None,
        pad: int = 0,
    ) -> Decision:
        """The decision for ladder level `index`, with the figures the law used (`preds`: None when
        it predicted nothing) and `pad` bytes of filler (a probe)."""
        return self._decision(
            request,
            level_index=index,
            level=levels[index],
            reason=reason,
            bandwidth_Bps=bw,
            progress=self._qs()[index],
            progress_levels=tuple(self.progress.values),
            per_byte_s=per_byte,
            predicted_levels=None if preds is None else tuple(preds),
            jitter=self.hold.jitter,
            pad_bytes=pad,
        )

    def _levels_now(self) -> list[Level]:
        """The ladder with measured codec costs where timed (the ladder's figures otherwise) and
        wire ratios measured on the run's shapes where known."""
        levels = self.costs.levels() if self.settings.measured_costs else list(self.ladder)
        return [replace(lv, ratio=self._ratios[i]) if i in self._ratios else lv for i, lv in enumerate(levels)]

    def _per_byte_s(self) -> float:
        """The transport's measured marginal seconds per wire byte (0 while unknown or off)."""
        return (self.transport.s_per_byte(self._now_s) or 0.0) if self.settings.transport_cost else 0.0

    def _sent(self, decision: Decision, bw: float, rtt: float) -> Decision:
        """Remember the wire time predicted for this decision (codec time excluded, as `comm_s`)."""
        wire = decision.predicted_bytes + decision.pad_bytes
        self._push_byte_s = byte_s(bw, decision.per_byte_s)
        self._predicted_wire_s = wire / bw + rtt, wire * self._push_byte_s + rtt
        return decision

    def _set_anchor(self) -> None:
        """The hold's anchor, priced at `join_compressions`: the step at the other worker's level is
        the forwarded one (on two sites, two workers at powersgd:1 and :2 priced it at q ** 2 for as
        long as they differed, 10 % dearer than :2, and never met)."""
        others = self._intent_levels()
        if others is not None:
            anchor, source = intents_anchor(others, self.hold.intent()), "the others' intent"
        else:
            anchor, source = None if self.step_spec is None else self.ladder.find(self.step_spec), "the step's smallest push"
        self.hold.anchor, self.hold.anchor_source = anchor, source
        aware = self.settings.progress_aware
        self.hold.anchor_q = None if anchor is None or not aware else self.progress.values[anchor] ** self.join_compressions

    def _intent_levels(self) -> list[int] | None:
        """The other workers' intents (`step_intents`) as ladder indices, None where they are not
        known (or one is off this ladder: the step's smallest push is the anchor instead). The
        anchor they make (`intents_anchor`) is the same for every worker, as the smallest push is,
        but a probe does not move it, and two workers whose laws both head for a lighter level meet
        there rather than each being joined back by the other's held level (docs/POLICIES.md,
        "Where the others are heading")."""
        specs = self.ladder.specs
        if not self.step_intents or any(i not in specs for i in self.step_intents):
            return None
        return [specs.index(i) for i in self.step_intents]

    def intent(self) -> str | None:
        """The committed level, or the lighter one a count of headroom of k steps heads for
        (`LevelHold.intent`; sent as `Push.intent`)."""
        level = self.hold.intent()
        return None if level is None else self.ladder.specs[level]

    def _qs(self) -> list[float]:
        """q per level as the law uses it (1 everywhere when not progress-aware)."""
        if not self.settings.progress_aware:
            return [1.0] * len(self.ladder)
        return [q**self.compressions for q in self.progress.values]


def worst_case_q(level: Level) -> float:
    """The q its codec guarantees whatever the tensor (`Codec.nominal_progress`; 1 if lossless)."""
    codec = make_codec(level.spec)
    return 1.0 if codec.lossless else float(codec.nominal_progress(NOMINAL_NUMEL))


register_policy("netsense", settings_factory("netsense", NetsensePolicy, NetsensePolicySettings))
