"""Workers meet at the step's level (`LevelHold.anchor`): two policies whose own costs make a
near-tie of two levels, each within eps of the other's pick, sent unlike levels for good before;
with the step's smallest push as the anchor they send one level, and an anchor that does not hold
by a worker's own costs is not joined (docs/POLICIES.md, "Joining the step's level")."""

from __future__ import annotations

import pytest

from netsense.compression.policy import ChooseRequest
from netsense.compression.policy.law import LevelHold
from netsense.compression.policy.netsense_settings import NetsensePolicySettings
from tests.compression.test_policy import LADDER_Q, S, TC, aware, link, run_aware

Q = [1.0, 0.9, 0.8]
SPECS = ("a", "b", "c")


def _hold() -> LevelHold:
    return LevelHold(NetsensePolicySettings(), SPECS)


def _decide(hold: LevelHold, costs: list[float]) -> str:
    """One decision at these costs (P_l / q_l), the predictions made from them."""
    return hold.step([c * qi for c, qi in zip(costs, Q)], Q, bw=1e6)


def _pair(costs: tuple[list[float], list[float]], steps: int, *, anchored: bool) -> list[tuple[int, int]]:
    """Two workers' levels step by step; each one's anchor is the heavier of the last step's two
    levels where it is not its own (what `Replica.step_spec` reports of a real step)."""
    holds = (_hold(), _hold())
    sent: list[tuple[int, int]] = []
    for _ in range(steps):
        for i, hold in enumerate(holds):
            if anchored and sent:
                smallest = max(sent[-1])
                hold.anchor = None if sent[-1][i] == smallest else smallest
            _decide(hold, costs[i])
        sent.append((holds[0].level, holds[1].level))  # type: ignore[arg-type]
    return sent


NEAR_TIE = ([1.2, 1.00, 1.04], [1.2, 1.04, 1.00])
"""Worker 0 finds b 4 % cheaper than c, worker 1 the reverse: both within eps (10 %)."""


def test_near_tie_without_an_anchor_sends_unlike_levels_for_good() -> None:
    """The failure the anchor mends: each worker holds its own pick, every step."""
    sent = _pair(NEAR_TIE, 200, anchored=False)
    assert all(levels == (1, 2) for levels in sent)


def test_near_tie_with_the_anchor_meets_at_the_heavier_level() -> None:
    """Worker 0 joins c, the step's smallest push, the step after they differ; its own law's
    relaxes back to b are undone the step after, each one waiting twice as long (k's back-off),
    so the two agree on nearly every step."""
    sent = _pair(NEAR_TIE, 400, anchored=True)
    assert sent[0] == (1, 2) and sent[1] == (2, 2)
    agreed = sum(a == b for a, b in sent)
    assert agreed >= 0.97 * len(sent), agreed
    apart = [i for i, (a, b) in enumerate(sent) if a != b]
    gaps = [j - i for i, j in zip(apart, apart[1:])]
    assert gaps == sorted(gaps), gaps  # the departures come ever more rarely


def test_an_anchor_that_does_not_hold_is_not_joined() -> None:
    """c costs worker 0 15 % more than b (beyond eps): it keeps b, whatever the other sends."""
    hold = _hold()
    _decide(hold, [1.2, 1.00, 1.15])
    hold.anchor = 2
    reasons = [_decide(hold, [1.2, 1.00, 1.15]) for _ in range(30)]
    assert hold.level == 1 and not any(r.startswith("join") for r in reasons)


def test_the_anchor_decides_the_first_level_too() -> None:
    """Before any commitment (the first decision, or one released by a new window figure) the
    anchor is taken where it holds, so a released worker does not part from the others."""
    hold = _hold()
    hold.anchor = 2
    reason = _decide(hold, [1.2, 1.00, 1.04])
    assert hold.level == 2 and reason.startswith("join: c")
    fresh = _hold()
    fresh.anchor = 0  # a costs 20 % more: not joined
    assert _decide(fresh, [1.2, 1.00, 1.04]).startswith("law") and fresh.level == 1


def test_a_join_heavier_undoes_a_relax_on_probation() -> None:
    """A join to a heavier level counts as undoing a relax within k (k doubles), so a worker whose
    own law keeps relaxing away from the others waits longer each time."""
    hold = _hold()
    _decide(hold, [1.0, 1.5, 1.5])
    hold.level = 2  # committed at c, which now costs 50 % more than a: relax after k steps
    k = hold.k_now
    reasons = [_decide(hold, [1.0, 1.3, 1.5]) for _ in range(k)]
    assert hold.level == 0 and reasons[-1].startswith("relax"), reasons
    hold.anchor = 1
    assert _decide(hold, [1.0, 1.05, 1.5]).startswith("join: b") and hold.level == 1
    assert hold.k_now == 2 * k


@pytest.mark.parametrize("mbit", [1, 20, 100, 1000])
def test_the_policy_takes_its_anchor_from_the_step_spec(mbit: float) -> None:
    """netsense reads `Policy.step_spec` onto the ladder: a level on it is the anchor, and the
    first decision joins it or is the law's own; a spec off the ladder is no anchor."""
    plain = run_aware(aware(), [mbit])[0]
    assert plain is not None
    for index in range(len(LADDER_Q)):
        policy = aware()
        policy.step_spec = LADDER_Q[index].spec
        decision = policy.choose(ChooseRequest(link=link(mbit, t=0.0), payload_bytes=S, compute_s=TC, step=0))
        assert policy.hold.anchor == index
        assert decision.level in (plain, index)
        assert decision.reason.startswith("join") == (decision.level != plain)
    policy = aware()
    policy.step_spec = "threshold:1e-45"
    assert run_aware(policy, [mbit])[0] == plain and policy.hold.anchor is None


def test_the_anchor_is_priced_as_the_step_it_would_make() -> None:
    """Two sites, seen: worker 1 at powersgd:2 (q 0.909), the other at powersgd:1 (q 0.762), the
    update compressed twice while they differ, so at q ** 2 rank 1 cost 10.5 % over rank 2 and was
    never joined, though at one compression (a forwarded step, which a join makes) it is 7 % cheaper."""
    q2 = [1.0, 0.909**2, 0.762**2]
    preds = [0.02, 0.01300 * 0.909**2 / 0.909, 0.0121 * 0.762]  # c1 costs 20, 13.0 and 12.1 ms
    hold = _hold()
    hold.step(preds, q2, bw=1e6)
    assert hold.level == 1
    hold.anchor = 2
    assert hold.step(preds, q2, bw=1e6).startswith("hold") and hold.level == 1  # priced twice compressed
    hold.anchor_q = 0.762
    assert hold.step(preds, q2, bw=1e6).startswith("join: c") and hold.level == 2


@pytest.mark.parametrize(("join_compressions", "power"), [(1, 1), (2, 2)])
def test_the_policy_prices_its_anchor_at_join_compressions(join_compressions: int, power: int) -> None:
    policy = aware()
    policy.compressions, policy.join_compressions = 2, join_compressions
    policy.step_spec = LADDER_Q[3].spec
    run_aware(policy, [20])
    assert policy.hold.anchor == 3
    assert policy.hold.anchor_q == pytest.approx(policy.progress.values[3] ** power)
