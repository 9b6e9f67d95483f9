"""The netsense policy's settings: one place for its defaults (docs/POLICIES.md explains each) and
the rules they must meet, checked when the policy is made, not mid-run."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .settings import require


@dataclass(frozen=True)
class NetsensePolicySettings:
    """Settings of our policy; one place for its defaults (docs/POLICIES.md explains each)."""

    eps: float = 0.1
    """Progress-aware: how far above the best cost (P_l / q_l) the committed level's may drift
    before it moves (`move_eps` says where to). Step-time law: the least lossy level whose
    predicted step is within (1 + eps) of the best wins."""
    relax_eps: float = 0.05
    """Stricter tolerance a lighter level must meet to count as headroom (a dead band against
    flapping); the step-time law's (`progress_aware=False`) only: the progress-aware one moves with
    `move_eps`."""
    move_eps: float = 0.02
    """Progress-aware law: a move (the first decision, heavier, or a relax after k steps of headroom)
    goes to the least lossy level whose cost is within (1 + move_eps) of the best; the committed
    level then holds while its cost is within (1 + eps). So [move_eps, eps] is the dead band, and
    a lossy level is not charged for its loss twice (once in q, once by the eps preference).
    The band widens to the step's measured jitter (`jitter_window`), never beyond eps."""
    jitter_window: int = 8
    """Measured step times (compute plus the send) whose median relative deviation is the step's
    jitter: a move's band is max(move_eps, jitter), capped at eps. Costs that differ by less than
    the noise the codec and transport timings were taken under are not told apart by them, so the
    least lossy of those levels wins (0: move_eps alone)."""
    k: int = 5
    """Consecutive steps of headroom before moving back toward lighter levels."""
    confirm_gap: float = 0.2
    """Progress-aware law: a heavier move whose committed level costs at most this much over the
    best (eps < gap <= confirm_gap) waits for a second decision in a row that says the same; a
    larger gap moves at once (a rate drop's: 100 -> 20 Mbit/s puts a light level 2-5x over). One
    step's predictions carry that step's noise (its bandwidth sample, the transport's fit), and a
    heavier move is undone only after k steps of headroom: 37 % of the small-gap heavier moves of
    a 2026-12-07 sample were gone at the next decision (docs/POLICIES.md, "Hysteresis on the
    committed level"; 0: every heavier move at once)."""
    relax_rise: float = 1.5
    """Once the bandwidth is this many times the lowest seen at the committed level, the link
    changed (not +-10% jitter): headroom is judged with `eps`, not the stricter `relax_eps` (0: never)."""
    max_k: int = 80
    """Cap of k's back-off: a relax undone within k steps doubles k; one that holds halves it again."""
    settle_steps: int = 20
    """Progress-aware law: decisions in a row on which the same other level is the pick with
    `move_eps` alone (its cost more than move_eps below the committed level's, the jitter's
    widening left out) before the committed level moves to it, though it is within the dead band:
    the jitter says that one step's costs that close are not told apart; a difference that holds
    for this many decisions is. Backs off as k does (doubled, up to max(max_k, settle_steps),
    when the move is undone within twice its count; 0: off)."""
    probe_interval: int = 20
    """While app-limited at a lossy level, send one probe (a bandwidth sample) this often (0: never)."""
    probe_interval_s: float = 2.0
    """...or after this many seconds without a change or probe, whichever comes first (0: only by
    steps). Seconds bound the recovery time however long a step takes."""
    probe_backoff_max: int = 4
    """A probe whose sample gave the law no headroom toward a lighter level doubles both intervals,
    up to this factor (1: never); a probe that found some, or a change of level, resets them. On
    wide-mlp at 50 Mbit/s a probe step cost ~0.1 s (qsgd:8 where powersgd:4 took 0.035 s), every
    20 steps: ~7 % of the run, for a bandwidth that did not change."""
    probe_share: float = 0.03
    """Largest share of the time upward probes may cost: a probe due by the cadence waits until the
    seconds since the last probe, times this share, cover its predicted extra time over a step at
    the committed level and what the last probe cost beyond its prediction (`Probes.owed_s`), or
    until `probe_interval_s` x `probe_backoff_max` seconds passed (the back-off's longest wait,
    which bounds when a rise is seen; 0: no share). The clock
    runs from the last probe, not the last change of level: on the tanh MLP at 20 Mbit/s (a model
    not in the repo) the level moved between two near-equal PowerSGD ranks every few seconds, each
    move restarted the short cadence, and probes costing 0.2 s (uplink) and 0.4 s (downlink) came
    every 2-5 s: ~10 % of the run for a rate that never changed (docs/history/BENCHMARKS-2026.md, "Probe share")."""
    probe_unseen_s: float = 30.0
    """A probe looks for a rise that makes a lighter level pay. Where the law would pick none at
    `PROBE_RISE` times the estimate nor at the highest estimate this path has shown (`Probes.peak_Bps`),
    only a rise to a rate never seen could, and the probe waits this long since the last one instead
    of the share's 8 s at most (0: no such wait). On the bandwidth-bound models a lighter level than
    PowerSGD paid only at 6-12x the rate, and the probes for it (qsgd:8 or fp16 steps, 8-20x
    powersgd:4's bytes, from each worker's uplink and the downlink in turn) took up to 10 % of a run on
    a link whose rate never came near (docs/history/BENCHMARKS-2026.md, "Probes within reach")."""
    probe_pad: bool = False
    """Where the sender can pad (`ChooseRequest.pad_ok`: a worker's uplink, the PS's downlink, a
    relay's upstream), probe by sending the committed level with filler that makes the send a
    bandwidth sample, instead of a lighter level. Off by default: padding halved what the probe
    steps cost, yet the transformer (a model not in the repo) reached its target 20-80 steps later
    in 3 of 4 seeds without the lighter levels' fp16 steps (docs/history/BENCHMARKS-2026.md, "Padded probes")."""
    queue_tolerance_s: float = 0.010
    """Standing queue (srtt - min_rtt) ignored before it starts to shrink the bandwidth."""
    safe_level: int | None = None
    """Level used while the bandwidth is unknown; None: the fewest bytes among the levels whose q
    is within `progress_tol` of 1, measured where a round or window measured it, else the codec's
    worst case (`NetsensePolicy.safe_level`: fp16 on the default ladder until the 8-bit level is
    measured lossless, then that; fp32 on a ladder without a 16-bit level; 0 keeps fp32)."""
    warmup_steps: int = 0
    """Steps, from the first decision, during which the level is capped at `warmup_level`."""
    warmup_level: int = 0
    """Heaviest level allowed during warm-up."""
    app_window: int = 4
    """Application bandwidth samples are max-filtered over this many most recent observations."""
    min_sample_bytes: int = 256 * 1024
    """A send smaller than this measures latency, not bandwidth: its sample is app-limited..."""
    start_probe: bool = True
    """Before the first decision, push `min_sample_bytes` of filler through the path (`probe_bytes`)
    and take its rate as the first bandwidth sample, so the first steps are chosen by the law, not
    sent at the unknown-bandwidth level (on wide-mlp at 20 Mbit/s two 340 kB qsgd:8 pushes cost
    ~0.35 s each where a PowerSGD step took 0.05 s). Whatever the payload's size (since
    2026-12-06; before, off under `min_sample_bytes`): a payload that small never makes a sample
    itself, and on digits-cnn rank 1 ran 98 of 100 decisions on a lower bound of 0.35-0.6 MB/s on
    a 2.5 MB/s link, pushed powersgd:2 where rank 0 pushed powersgd:4, and the gradient-domain PS
    sent each key back at the smaller (docs/history/BENCHMARKS-2026.md, "A start-up probe for small payloads")."""
    min_sample_rtts: float = 8.0
    """...unless it lasted at least this many min RTTs (and carried >= min_sample_bytes / 16): then
    the ramp-up is a small part of it, as for a 150 kB push taking 30 ms over a 2 ms loopback RTT
    (0: size alone decides)."""
    progress_aware: bool = True
    """Weigh each level's step time by its progress efficiency q (cost P_l / q_l); False: the
    step-time law of docs/POLICIES.md as first written (P_l alone), kept for comparison."""
    tie_eps: float = 0.01
    """Among levels of equal progress (q within `progress_tol`, e.g. fp32 and fp16), a cheaper one
    wins when its predicted step is shorter by more than this fraction."""
    progress_tol: float = 0.005
    """Levels whose q differ by at most this count as equally progressive."""
    progress_alpha: float = 0.3
    """EWMA weight of the newest q measurement of a level."""
    progress_floor: float = 0.01
    """Lowest q used in P_l / q_l."""
    progress_every: int = 50
    """Ask for a measurement of every lossy level's q on a gradient sample this often (steps; 0: never).
    One round costs ~4-5 ms per lossy level on digits-cnn (6 keys, 2 shared cores): every 10 steps
    that was ~12% of a 20 ms loopback step; q drifts over hundreds of steps."""
    progress_budget: float = 0.01
    """Largest share of the time candidate rounds may take: a round due by `progress_every` waits
    (to the next multiple) until the time since the last one is at least its predicted cost (every
    lossy level's measured codec time on the sample) over this share (0: no limit). Unshaped, a
    round took 15-30 ms on a 15-18 ms step: every 50 steps that was ~5 % of the run. A progress
    window is held to it too, at what the last window cost (`NetsensePolicy.window_cost`)."""
    progress_window: int = 16
    """W of the progress windows (`netsense.compression.window`): every `progress_every` steps,
    within `progress_budget`, every lossy level runs error feedback on a fixed 2^14-element
    subsample of the next 1.5 W steps' gradients and is priced by what stays out of the last W
    steps' update against that update's energy, SGD noise included; that q_W replaces one step's
    figure for good (0: one step's error only, as before 2026-12-01). Longer windows credit error
    feedback's re-sends more; 16 keeps a window's 24 steps short beside a run's hundreds (interim
    figures after W/4 and W/2 measured steps, projected to W, stand in for the priors until the
    window ends)."""
    sent_window_drift: float = 2.0
    """The level being sent is priced from the sender's own error feedback too, every
    `progress_window` steps it is held (`netsense.compression.sentwindow`, docs/POLICIES.md, "The
    sent level's window": no codec call, 2-4 sums of up to 2^16 elements a step), and that figure
    replaces the level's q when its error odds (1 - q) / q are at least this factor above the
    estimate's: the windows beside the sends are rare and their first sees a fresh model (a
    patch-attention model not in the repo sent powersgd:1 for 114 steps on a first-window 0.92).
    Only downward, and only past this factor: the other levels keep their windows' figures, which
    share their bias, so pricing the sent level a little lower sent the run to lighter levels
    (0: off)."""
    window_drift: float = 2.0
    """A window is due at the next `progress_every` step, at `DRIFT_BUDGET_FACTOR` x
    `progress_budget`, when a contending level's one-step error odds moved by more than this factor
    since its last window (`ProgressEstimate.drift`; 0: off). The first window prices the run's first
    steps; on charlm powersgd:2's stayed 0.99 for 200 steps under the budget while its one-step q fell
    0.67 -> 0.2 and the next window said 0.72 (docs/POLICIES.md, "Windowed progress")."""
    progress_table: Mapping[str, float] | None = None
    """Calibrated q per level spec (`netsense calibrate`: level trials of the job's own model and
    optimizer, docs/POLICIES.md, "Calibrated q"): each level named here is priced at its figure
    from the first decision and its run-time estimates (rounds, windows) no longer move it; levels
    not named are estimated as without a table, specs not on the ladder are ignored (logged)."""
    measured_costs: bool = True
    """Predict with each level's measured encode/decode seconds per MB (`observe_costs`: the
    sender's timings and the candidate rounds) instead of the ladder's figures once timed."""
    cost_window: int = 8
    """Timings per level whose median is its measured cost."""
    overhead_window: int = 16
    """Steps whose median length beyond the law's prediction for the level sent is added to every
    level's predicted step (`StepOverhead`: the update's apply, thread hops, a return slower than
    priced, and its decode where the sender times none: `Level.return_s`; 0: off). The
    progress-aware law divides the step by q, so time left out of it prices lossy levels too low."""
    transport_cost: bool = True
    """Charge wire bytes at least the transport's measured marginal cost per byte (`TransportCost`,
    fitted over the sends of different levels), not only 1 / B: on CPU-bound paths (loopback QUIC)
    bytes cost host time that a delivery-rate bandwidth does not show."""

    def check(self, levels: int) -> None:
        """Raise `ConfigError` for the first setting out of range, for a ladder of `levels` levels."""
        s, n, top = self, "netsense", levels - 1
        require(s.eps >= 0, n, "eps", s.eps, ">= 0")
        require(0 <= s.relax_eps <= s.eps, n, "relax_eps", s.relax_eps, "in [0, eps]")
        require(0 <= s.move_eps <= s.eps, n, "move_eps", s.move_eps, "in [0, eps]")
        require(s.jitter_window >= 0, n, "jitter_window", s.jitter_window, ">= 0")
        require(s.k >= 1, n, "k", s.k, ">= 1")
        require(s.max_k >= s.k, n, "max_k", s.max_k, ">= k")
        require(s.settle_steps >= 0, n, "settle_steps", s.settle_steps, ">= 0")
        require(s.relax_rise == 0 or s.relax_rise > 1, n, "relax_rise", s.relax_rise, "0 or > 1")
        require(s.probe_interval >= 0, n, "probe_interval", s.probe_interval, ">= 0")
        require(s.probe_interval_s >= 0, n, "probe_interval_s", s.probe_interval_s, ">= 0")
        require(s.probe_backoff_max >= 1, n, "probe_backoff_max", s.probe_backoff_max, ">= 1")
        require(0 <= s.probe_share < 1, n, "probe_share", s.probe_share, "in [0, 1)")
        require(s.probe_unseen_s >= 0, n, "probe_unseen_s", s.probe_unseen_s, ">= 0")
        require(s.min_sample_rtts >= 0, n, "min_sample_rtts", s.min_sample_rtts, ">= 0")
        require(s.queue_tolerance_s >= 0, n, "queue_tolerance_s", s.queue_tolerance_s, ">= 0")
        require(s.safe_level is None or 0 <= s.safe_level <= top, n, "safe_level", s.safe_level, f"a level index in [0, {top}]")
        require(0 <= s.warmup_level <= top, n, "warmup_level", s.warmup_level, f"a level index in [0, {top}]")
        require(s.warmup_steps >= 0, n, "warmup_steps", s.warmup_steps, ">= 0")
        require(s.app_window >= 1, n, "app_window", s.app_window, ">= 1")
        require(s.min_sample_bytes >= 0, n, "min_sample_bytes", s.min_sample_bytes, ">= 0")
        require(s.tie_eps >= 0, n, "tie_eps", s.tie_eps, ">= 0")
        require(0 <= s.progress_tol < 1, n, "progress_tol", s.progress_tol, "in [0, 1)")
        require(0 < s.progress_alpha <= 1, n, "progress_alpha", s.progress_alpha, "in (0, 1]")
        require(0 < s.progress_floor <= 1, n, "progress_floor", s.progress_floor, "in (0, 1]")
        require(s.progress_every >= 0, n, "progress_every", s.progress_every, ">= 0")
        require(0 <= s.progress_budget < 1, n, "progress_budget", s.progress_budget, "in [0, 1)")
        require(s.window_drift == 0 or s.window_drift > 1, n, "window_drift", s.window_drift, "0 or > 1")
        require(s.progress_window == 0 or s.progress_window >= 2, n, "progress_window", s.progress_window, "0 or >= 2")
        require(s.confirm_gap == 0 or s.confirm_gap >= s.eps, n, "confirm_gap", s.confirm_gap, f"0 or >= eps ({s.eps})")
        require(s.sent_window_drift == 0 or s.sent_window_drift > 1, n, "sent_window_drift", s.sent_window_drift, "0 or > 1")
        require(s.cost_window >= 1, n, "cost_window", s.cost_window, ">= 1")
        require(s.overhead_window >= 0, n, "overhead_window", s.overhead_window, ">= 0")
        table = s.progress_table
        require(table is None or isinstance(table, Mapping), n, "progress_table", table, "a mapping of level spec to q")
        for spec, q in (table or {}).items():
            ok = isinstance(spec, str) and isinstance(q, (int, float)) and not isinstance(q, bool)
            require(ok and math.isfinite(q) and q >= 0, n, "progress_table", {spec: q}, "level spec -> finite q >= 0")
