"""Workers meet where their laws are heading (`Push.intent`, `Params.intents`): the join's worst case
was two workers whose laws both want a lighter level, each relax joined back by the other's held
level; with the others' intents as the anchor they move there together, and a probe, which is no
intent, is never joined (docs/POLICIES.md, "Joining the step's level")."""

from __future__ import annotations

from netsense.compression.policy import ChooseRequest
from netsense.compression.policy.law import LevelHold, intents_anchor
from netsense.compression.policy.netsense_settings import NetsensePolicySettings
from tests.compression.test_policy import LADDER_Q, S, TC, aware, link, run_aware

Q = [1.0, 0.9, 0.8]
SPECS = ("a", "b", "c")
BOTH_LIGHTER = ([1.2, 1.00, 1.08], [1.2, 1.00, 1.08])
"""Both workers find b 8 % cheaper than c, where they sit: within eps (c holds), so each relaxes to
b only after its own k steps of headroom."""


def _hold(level: int | None = None, k: int | None = None) -> LevelHold:
    hold = LevelHold(NetsensePolicySettings(), SPECS)
    hold.level = level
    if k is not None:
        hold.k_now = k
    return hold


def _decide(hold: LevelHold, costs: list[float]) -> str:
    return hold.step([c * qi for c, qi in zip(costs, Q)], Q, bw=1e6)


def _pair(costs: tuple[list[float], list[float]], steps: int, *, intents: bool, k: tuple[int, int] = (5, 10)) -> list[tuple[int, int]]:
    """Two workers committed at c, their levels step by step. Each one's anchor comes from the last
    step as a real step gives it: the heavier of the two levels sent where it was the other's
    (`Replica.step_spec`), or with `intents` the other's intent as it pushed (`intents_anchor`)."""
    holds = (_hold(2, k[0]), _hold(2, k[1]))
    sent: list[tuple[int, int]] = []
    said: tuple[int, int] | None = None
    for _ in range(steps):
        for i, hold in enumerate(holds):
            if intents and said is not None:
                hold.anchor = intents_anchor([said[1 - i]], hold.intent())
            elif sent:
                smallest = max(sent[-1])
                hold.anchor = None if sent[-1][i] == smallest else smallest
            _decide(hold, costs[i])
        sent.append((holds[0].level, holds[1].level))  # type: ignore[arg-type]
        said = (holds[0].intent(), holds[1].intent())  # type: ignore[assignment]
    return sent


def test_without_intents_a_relax_is_joined_back_and_the_pair_holds_the_heavier_level() -> None:
    """The failure: the first to relax sees the other still at c and joins it back (k doubles)."""
    sent = _pair(BOTH_LIGHTER, 200, intents=False)
    assert sum(levels == (2, 2) for levels in sent) >= 0.9 * len(sent)


def test_with_intents_the_pair_moves_together_once_both_counts_ran_k_steps() -> None:
    """Worker 0 (k 5) relaxes to b at step 5; worker 1 (k 10, backed off) says b from its k-th
    count on, so worker 0 is not joined back, and worker 1 joins b the step after: both at b from
    step 6, for good."""
    sent = _pair(BOTH_LIGHTER, 200, intents=True)
    assert all(levels == (2, 2) for levels in sent[:4]) and sent[4] == (1, 2), sent[:8]
    assert all(levels == (1, 1) for levels in sent[5:]), sent[:12]


def test_with_intents_counts_out_of_phase_meet_after_one_back_off() -> None:
    """Both with k 5, worker 1's count a step behind (it had one step without headroom): worker 0
    relaxes first and is joined back (its k doubles, as without intents), then both counts pass k
    while both say b, and they meet there."""
    holds = (_hold(2, 5), _hold(2, 5))
    _decide(holds[1], [1.2, 1.00, 1.20])  # its own law's best is c this once: its count starts later
    holds[1].level = 2
    sent, said = [], None
    for _ in range(60):
        for i, hold in enumerate(holds):
            if said is not None:
                hold.anchor = intents_anchor([said[1 - i]], hold.intent())
            _decide(hold, BOTH_LIGHTER[i])
        sent.append((holds[0].level, holds[1].level))
        said = (holds[0].intent(), holds[1].intent())
    first = next(i for i, levels in enumerate(sent) if levels == (1, 1))
    assert first <= 15 and all(levels == (1, 1) for levels in sent[first:]), sent[:20]


def test_a_near_tie_from_opposite_sides_still_meets_at_the_heavier_level() -> None:
    """Worker 0 finds b 4 % cheaper, worker 1 c: as with the smallest push, they meet at c, worker
    0's own law's relaxes back to b coming ever more rarely (its intent says b while it counts)."""
    sent = _pair(([1.2, 1.00, 1.04], [1.2, 1.04, 1.00]), 400, intents=True, k=(5, 5))
    agreed = sum(a == b for a, b in sent)
    assert agreed >= 0.95 * len(sent) and sent[-1] == (2, 2), agreed


def test_the_heaviest_intent_is_the_anchor_unless_it_is_this_workers_own() -> None:
    assert intents_anchor([3, 5], 4) == 5
    assert intents_anchor([3], 3) == 3  # both head there: join it now
    assert intents_anchor([3], 4) is None  # this worker's is the heaviest: the others join it
    assert intents_anchor([2], None) == 2  # before the first decision


def test_the_intent_is_the_committed_level_or_the_relax_a_count_of_k_steps_heads_for() -> None:
    hold = _hold()
    assert hold.intent() is None
    _decide(hold, [1.2, 1.00, 1.20])
    assert hold.level == 1 and hold.intent() == 1
    hold.level, hold.k_now = 2, 10  # committed at c (k backed off to 10), b now 8 % cheaper
    for count in range(1, 10):
        assert _decide(hold, BOTH_LIGHTER[0]).startswith(f"hold: headroom {count}/10")
        assert hold.level == 2 and hold.intent() == (1 if count >= 5 else 2), count


def test_the_policy_says_its_intent_and_takes_its_anchor_from_the_others() -> None:
    """netsense's intent is its committed level's spec; the others' intents on its ladder make the
    anchor (reason `join: ..., the others' intent`), and one off the ladder falls back to the
    step's smallest push."""
    policy = aware()
    assert policy.intent() is None
    plain = run_aware(policy, [20])[0]
    assert plain is not None and policy.intent() == LADDER_Q[policy.hold.level].spec  # type: ignore[index]
    for index in range(len(LADDER_Q)):
        policy = aware()
        policy.step_intents = (LADDER_Q[index].spec,)
        policy.step_spec = LADDER_Q[0].spec  # ignored while intents are known
        decision = policy.choose(ChooseRequest(link=link(20, t=0.0), payload_bytes=S, compute_s=TC, step=0))
        assert policy.hold.anchor == index and policy.hold.anchor_source == "the others' intent"
        assert decision.level in (plain, index)
        if decision.level != plain:
            assert decision.reason.startswith(f"join: {LADDER_Q[index].spec}, the others' intent")
    policy = aware()
    policy.step_intents, policy.step_spec = ("threshold:1e-45",), LADDER_Q[2].spec
    run_aware(policy, [20])
    assert policy.hold.anchor == 2 and policy.hold.anchor_source == "the step's smallest push"
