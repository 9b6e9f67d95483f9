"""The netsense law and its hysteresis: which level the predictions favour, and when to move to it.

Cost C_l = P_l / q_l is time per unit of progress; the law for a tolerance x accepts the levels
within (1 + x) of the best cost and picks the least lossy among the most progressive of them.
`LevelHold` commits to a level: a move goes to the law's pick with `move_eps` (2 %), or the step's
measured jitter where that is larger (`jitter`, at most eps), and the committed level holds while
its cost is within `eps` (10 %) of the best: heavier when it does not (at once past `confirm_gap`,
else on the second decision in a row: one step's noise), lighter only after k steps of headroom,
with k backing off when a relax is soon undone; within that dead band it moves to a level that
has been the pick with `move_eps` alone for `settle_steps` decisions in a row (a difference the
jitter hid in each step, that held), backing off the same way.
With other workers in the step (`anchor`: the level its smallest push went at), the committed
level joins the anchor wherever the anchor holds by this worker's own costs: the workers' policies
measure on their own gradients, and near-ties left two workers on unlike levels for most steps,
where the PS compresses their mean a second time instead of forwarding the pushes
(docs/POLICIES.md, "Joining the step's level").
Without progress awareness (q = 1, the step-time law) moves use `eps` and headroom the stricter
`relax_eps`.
"""

from __future__ import annotations

import logging

from .netsense_settings import NetsensePolicySettings

logger = logging.getLogger(__name__)


def intents_anchor(others: list[int], mine: int | None) -> int | None:
    """The anchor from the other workers' intents (ladder indices, heavier higher): the heaviest of
    theirs where it is at least as heavy as this worker's own intent, None where this worker's is
    the heaviest (the others join it). Every worker of the step computes the same level, as with the
    smallest push, but from where each law is heading rather than what it sent."""
    top = max(others)
    return top if mine is None or top >= mine else None


class LevelHold:
    """The committed level and the counters its hysteresis and the probes' cadence run on."""

    def __init__(self, settings: NetsensePolicySettings, specs: tuple[str, ...]) -> None:
        self.settings = settings
        self.specs = specs
        """Ladder specs, for the reasons' wording."""
        self.level: int | None = None
        """Committed level (probes excepted), None before the first decision."""
        self.k_now = settings.k
        """Current headroom requirement (k with back-off)."""
        self.headroom = 0
        """Consecutive steps a lighter level would have done."""
        self.relax_to = 0
        """The level a relax goes to: the heaviest lighter level seen through the headroom steps."""
        self.since_change = 0
        """Steps since the committed level last changed."""
        self.since_probe = 0
        """Steps since the last probe or exploration."""
        self.since_relax: int | None = None
        """Steps since the last relax, while it is on probation (None: not on probation)."""
        self.low_bw: float | None = None
        """The lowest bandwidth seen at the committed level."""
        self.jitter = 0.0
        """The step's measured relative jitter (the policy sets it): a move's band is at least it."""
        self.settle_now = settings.settle_steps
        """Current settle requirement (`settle_steps` with back-off)."""
        self.settle = 0
        """Consecutive decisions `settle_to` was the strict pick (`move_eps` alone), not the committed level."""
        self.settle_to: int | None = None
        """The level `settle` counts for (None: no count running)."""
        self.since_settle: int | None = None
        """Decisions since the last settle move, while it is on probation (None: not on probation)."""
        self.anchor: int | None = None
        """The level of the step's smallest push when another worker's was that one (the policy
        sets it before each decision; None: alone, or not known)."""
        self.anchor_source = "the step's smallest push"
        """Where the anchor came from, for the reason's wording."""
        self.anchor_q: float | None = None
        """The anchor's q as a step at it would be priced (one compression where the PS forwards
        alike pushes); None: as the law's q."""
        self.waited = False
        """The last decision held over a small gap to a heavier target (`settings.confirm_gap`): a
        second such decision in a row moves."""

    def law(self, preds: list[float], q: list[float], eps: float, tie_eps: float) -> tuple[int, list[int]]:
        """The levels the law accepts (ascending) and its pick, the first of them, for step-time
        predictions `preds` and progress efficiencies `q` (all 1 when not progress-aware).

        Cost C_l = P_l / q_l (time per unit of progress); A = levels with C_l <= (1 + eps) C*;
        among A keep the most progressive (q within `progress_tol` of A's best q) and of those the
        ones whose P_l is within (1 + tie_eps) of their fastest. Without progress awareness every q
        is 1, so the tie rule would pick the fastest level outright: it then keeps the step-time
        law's original rule (least lossy within eps of the best P)."""
        s = self.settings
        cost = [p / qi for p, qi in zip(preds, q)]
        best = min(cost)
        ok = [i for i, c in enumerate(cost) if c <= (1 + eps) * best]
        if not s.progress_aware:
            return ok[0], ok
        q_best = max(q[i] for i in ok)
        equal = [i for i in ok if q[i] >= q_best - s.progress_tol]
        fastest = min(preds[i] for i in equal)
        pick = [i for i in equal if preds[i] <= (1 + tie_eps) * fastest]
        return pick[0], pick

    def target(self, preds: list[float], q: list[float]) -> int:
        """Where a move goes: the law's pick with `eps`, or, progress-aware, with the much stricter
        `move_eps`. q prices each level's loss already, so there eps is only how far the committed
        level may drift from the best cost (`holds`). Picking the least lossy level of the eps band
        at every move charged the loss twice: on wide-mlp each direction held powersgd:4 at 6 % over
        powersgd:2's cost, and the two directions' choices compounded to a 1.3x slower step.
        The band is never narrower than the step's measured `jitter` (capped at eps): the codec and
        transport timings behind P_l are taken under that noise, so smaller differences in cost are
        not evidence. On loopback, where every P_l is compute plus a few ms, predictions 4-6 % apart
        picked powersgd:4 (q 0.98) over fp16, yet it measured 5 ms slower and behind in loss."""
        s = self.settings
        if not s.progress_aware:
            return self.law(preds, q, s.eps, s.tie_eps)[0]
        return self.pick(preds, q, min(s.eps, max(s.move_eps, self.jitter)))

    def pick(self, preds: list[float], q: list[float], band: float) -> int:
        """The law's pick with tolerance `band` and `tie_eps` scaled by band / eps (a move's rule)."""
        s = self.settings
        return self.law(preds, q, band, s.tie_eps * band / s.eps if s.eps > 0 else 0.0)[0]

    def holds(self, current: int, preds: list[float], q: list[float]) -> bool:
        """Whether the committed level may stay. Progress-aware: its cost within (1 + eps) of the
        best, and no level of equal progress (q within `progress_tol`) faster by more than
        `tie_eps` (fp16 is never given away for fp32); the law's own set is narrower: it keeps
        only the most progressive levels of the eps band. Step-time law: it is in the law's set."""
        s = self.settings
        if not s.progress_aware:
            return current in self.law(preds, q, s.eps, s.tie_eps)[1]
        cost = [p / qi for p, qi in zip(preds, q)]
        if cost[current] > (1 + s.eps) * min(cost):
            return False
        equal = [preds[j] for j, qj in enumerate(q) if abs(qj - q[current]) <= s.progress_tol]
        return preds[current] <= (1 + s.tie_eps) * min(equal)

    def step(self, preds: list[float], q: list[float], bw: float) -> str:
        """Apply the law with hysteresis to the committed level (`bw`: the bandwidth the predictions
        used); return the reason."""
        s = self.settings
        best = min(p / q[i] for i, p in enumerate(preds))
        target = self.target(preds, q)
        if self.level is None:
            joined = self._join(None, preds, q, bw) if self.anchor != target else None
            if joined is not None:
                return joined
            self.set_level(target)
            return f"law: C*={best:.4g}s"
        current = self.level
        self.since_change += 1
        self.since_probe += 1
        self.low_bw = bw if self.low_bw is None else min(self.low_bw, bw)
        if self.since_relax is not None:
            self.since_relax += 1
            if self.since_relax >= self.k_now:  # the relax held: trust relaxing a bit sooner again
                self.k_now = max(s.k, self.k_now // 2)
                self.since_relax = None
        if self.since_settle is not None:
            self.since_settle += 1
            # On probation for twice its count: a settle back (the earliest way back when no relax
            # or heavier move comes) takes settle_now decisions itself.
            if self.since_settle >= 2 * self.settle_now:  # the settle held
                self.settle_now = max(s.settle_steps, self.settle_now // 2)
                self.since_settle = None
        joined = self._join(current, preds, q, bw)
        if joined is not None:
            return joined
        fits = self.holds(current, preds, q)
        if not fits and target > current:
            gap = preds[current] / q[current] / best - 1
            lossier = q[target] < q[current] - s.progress_tol
            if s.progress_aware and lossier and 0 < gap <= s.confirm_gap and not self.waited:
                self.waited = True
                # One step's predictions carry its noise; a heavier move is undone only after k
                # steps of headroom. A rate drop's gap is larger and moves at once, and a move that
                # loses nothing (fp32 -> fp16) needs no second look.
                self.headroom = 0
                self.settle, self.settle_to = 0, None
                return f"hold: C_{current}={preds[current] / q[current]:.4g}s over C*={best:.4g}s once, heavier if again"
            self.go_heavier(target, bw)
            return f"heavier: C_{current}={preds[current] / q[current]:.4g}s, C*={best:.4g}s"
        self.waited = False
        # Headroom is judged by the same law with the stricter tolerances (a dead band), unless the
        # bandwidth rose well above the lowest seen at this level: then the link changed, and the
        # dead band would only hold a level the law no longer picks (the rate-step test's 100 ->
        # 20 -> 100 Mbit/s: relaxing qsgd:4 -> qsgd:8 needed 51 Mbit/s per worker with relax_eps,
        # 30 with eps, and each worker's share was 50).
        strict = s.relax_eps / s.eps if s.eps > 0 else 0.0
        if s.progress_aware:
            lighter = target  # already the strict pick
        else:
            lighter = self.law(preds, q, s.relax_eps, s.tie_eps * strict)[0] if fits else target
        rose = s.relax_rise > 0 and self.low_bw is not None and bw >= s.relax_rise * self.low_bw
        if rose and target < lighter:
            lighter = target
        if s.progress_aware and fits and lighter < current and preds[lighter] / q[lighter] >= preds[current] / q[current]:
            # Lighter only by the jitter band's "least lossy" preference, not cheaper: a rule for
            # where a move goes, no reason to move (it undid every settle on the tanh MLP:
            # powersgd:2 settled at 2.5 % below powersgd:4's cost, relaxed back 5 steps later).
            lighter = current
        if lighter >= current:
            # After a rise one dip of the estimate (a push slowed by the hosts' CPUs: 23-29 Mbit/s
            # among 45-55 was seen) pauses the count of headroom steps instead of restarting it.
            if not rose:
                self.headroom = 0
            settled = self._settle(current, preds, q)
            if settled is not None:
                return settled
            return f"hold: C*={best:.4g}s"
        self.settle, self.settle_to = 0, None
        self.relax_to = max(self.relax_to, lighter) if self.headroom else lighter
        self.headroom += 1
        if self.headroom < self.k_now:
            return f"hold: headroom {self.headroom}/{self.k_now} toward {self.specs[lighter]}"
        self.set_level(self.relax_to)
        self.since_relax = 0
        return f"relax: {self.k_now} steps of headroom, C*={best:.4g}s"

    def _join(self, current: int | None, preds: list[float], q: list[float], bw: float) -> str | None:
        """Move to the `anchor` when it is not the committed level and holds by this worker's costs
        (`holds`: within eps of the best, the anchor priced at `anchor_q`); the reason, else None.
        The anchor is the same for every worker of the step (the smallest push), so they meet there
        rather than swap; heavier, it counts as undoing a relax, so a worker whose own law keeps
        relaxing away waits longer each time (k's back-off). Before it two workers' levels agreed on 6-97 % of the steps of 44 runs,
        under half in 15 (docs/history/BENCHMARKS-2026.md, "Joining the step's level")."""
        anchor = self.anchor
        if anchor is None or anchor == current or not 0 <= anchor < len(preds):
            return None
        q = list(q)
        if self.anchor_q is not None:
            q[anchor] = self.anchor_q
        if not self.holds(anchor, preds, q):
            return None
        if current is not None and anchor > current:
            self.go_heavier(anchor, bw)
        else:
            self.set_level(anchor)
        cost = [p / qi for p, qi in zip(preds, q)]
        return f"join: {self.specs[anchor]}, {self.anchor_source}, C={cost[anchor]:.4g}s, C*={min(cost):.4g}s"

    def _settle(self, current: int, preds: list[float], q: list[float]) -> str | None:
        """While holding within the dead band: count the decisions in a row on which one other
        level is the law's pick with `move_eps` alone, and move to it after `settle_now` (the
        reason), else None. The jitter widens a move's band because one step's costs that close
        are not evidence; that the same level stays ahead, decision after decision, is. Held for
        good, a level within eps of the best cost up to 10 % more per unit of progress (seen:
        digits-cnn's downlink on qsgd:4 for 190 of 200 updates at 4-5 % over powersgd:4)."""
        s = self.settings
        if not s.progress_aware or self.settle_now <= 0:
            return None
        strict = self.pick(preds, q, s.move_eps)
        if strict == current:
            self.settle, self.settle_to = 0, None
            return None
        self.settle = self.settle + 1 if strict == self.settle_to else 1
        self.settle_to = strict
        if self.settle < self.settle_now:
            return None
        cost = [p / qi for p, qi in zip(preds, q)]
        reason = f"settle: {self.settle} decisions at C_{strict}={cost[strict]:.4g}s, C_{current}={cost[current]:.4g}s"
        self.set_level(strict)
        self.since_settle = 0
        return reason

    def intent(self) -> int | None:
        """Where this hold is heading: the level a count of headroom relaxes to once it has run `k`
        steps (the relax it would be without back-off), else the committed level (a probe is
        neither); None before the first decision. A count's first steps are not yet evidence: taken
        at once, one worker's single step of headroom toward `topk:0.01+fp16` had the other join
        it (two sites)."""
        if self.level is not None and self.headroom >= self.settings.k:
            return self.relax_to
        return self.level

    def go_heavier(self, target: int, bw: float) -> None:
        """Commit to the heavier `target` (the law's pick at bandwidth `bw`)."""
        if self.since_relax is not None:  # undone within k steps: it was noise, wait longer next time
            self.k_now = min(self.settings.max_k, self.k_now * 2)
            self.since_relax = None
        self.set_level(target)
        self.low_bw = bw

    def set_level(self, index: int) -> None:
        """Commit to `index`; a change restarts the counts that belong to a level."""
        if index != self.level:
            logger.debug("netsense level %s -> %s", self.level, index, extra={"level": index})
            self.since_change = 0
            self.low_bw = None
            if self.since_settle is not None:  # a settle undone within its count: wait longer next time
                cap = max(self.settings.max_k, self.settings.settle_steps)
                self.settle_now = min(cap, self.settle_now * 2)
                self.since_settle = None
        self.level = index
        self.headroom = 0
        self.waited = False
        self.settle, self.settle_to = 0, None
