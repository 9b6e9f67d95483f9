"""Workers whose move lighter was joined back retry together (`LevelHold.shared_step`, `on_slot`):
two laws that both want a lighter level relax on one shared slot, where each relaxing alone was
joined back by the other and the pair held the heavier level; a lone law's departures grow ever
rarer (docs/POLICIES.md, "Relaxing together")."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from netsense.compression.policy import ChooseRequest
from tests.compression.test_policy import S, TC, aware, link
from tests.compression.test_policy_join import _decide, _hold

Costs = Callable[[int], list[float]]

HEAVY = [1.3, 1.10, 1.00]
"""c (2) is the law's pick: the pair starts there."""
LIGHT = [1.3, 1.00, 1.05]
"""b (1) is 5 % cheaper than c: each law wants to relax to it (c still holds, within eps)."""


def _pair(costs: tuple[Costs, Costs], steps: int, *, ks: tuple[int, int] = (5, 5), shared: bool = True) -> list[tuple[int, int]]:
    """Two workers' levels step by step from c, k_now set to `ks`; each one's anchor is the heavier
    of the last step's two levels where it is not its own; `shared`: the step number is known."""
    holds = (_hold(), _hold())
    for hold, k in zip(holds, ks):
        _decide(hold, HEAVY)
        hold.k_now = k
    sent: list[tuple[int, int]] = []
    for t in range(steps):
        for i, hold in enumerate(holds):
            if sent:
                smallest = max(sent[-1])
                hold.anchor = None if sent[-1][i] == smallest else smallest
            hold.shared_step = t + 1 if shared else None
            _decide(hold, costs[i](t))
        sent.append((holds[0].level, holds[1].level))  # type: ignore[arg-type]
    return sent


def _rise(at: int) -> Costs:
    return lambda t: LIGHT if t >= at else HEAVY


def _first_together(sent: list[tuple[int, int]], level: int = 1) -> int | None:
    return next((t for t, pair in enumerate(sent) if pair == (level, level)), None)


@pytest.mark.parametrize(("later", "ks"), [(0, (5, 10)), (0, (5, 40)), (1, (5, 5)), (7, (5, 5)), (13, (5, 20))])
def test_two_laws_that_want_lighter_relax_together(later: int, ks: tuple[int, int]) -> None:
    """Both laws want b from step 20 (the second `later` steps on), their k's backed off unlike:
    without a shared step the first to relax is joined back, then the other, and the pair holds c
    for good (the failure); on shared slots they meet at b within a few periods and stay."""
    costs = (_rise(20), _rise(20 + later))
    stuck = _pair(costs, 300, ks=ks, shared=False)
    assert _first_together(stuck) is None and sum(a == b == 2 for a, b in stuck) >= 0.9 * len(stuck)
    sent = _pair(costs, 300, ks=ks)
    first = _first_together(sent)
    assert first is not None and first <= 20 + later + 4 * max(ks), first
    assert all(pair == (1, 1) for pair in sent[first:])


def test_a_lone_law_departs_ever_more_rarely() -> None:
    """Worker 0 wants b, worker 1 c (each within eps of the other's pick): worker 0's relaxes are
    joined back, each one's slots twice as far apart (up to max_k), and its k is not doubled (the
    count was not wrong); the pair agrees on nearly every step."""
    costs = (lambda t: [1.2, 1.00, 1.04], lambda t: [1.2, 1.04, 1.00])
    holds_k = _hold().settings.max_k
    sent = _pair(costs, 600)
    apart = [t for t, (a, b) in enumerate(sent) if a != b]
    assert sum(a == b for a, b in sent) >= 0.97 * len(sent)
    gaps = [j - i for i, j in zip(apart, apart[1:])]
    assert gaps == sorted(gaps) and gaps[-1] == holds_k, gaps


def test_a_first_relax_goes_at_k_and_a_retry_after_a_join_back_waits_for_a_slot() -> None:
    """The first relax is not held back (k steps of headroom, whatever the shared step); joined
    back, its count resumes, k stays, the period doubles, and the retry comes on a multiple of 2k;
    a relax that holds halves the period again."""
    hold = _hold()
    _decide(hold, HEAVY)
    k = hold.k_now
    hold.shared_step = 1003  # k steps on: 1008, not a multiple of k
    for _ in range(k):
        hold.shared_step += 1
        reason = _decide(hold, LIGHT)
    assert hold.level == 1 and reason.startswith("relax") and hold.shared_step % k != 0
    hold.anchor, hold.shared_step = 2, hold.shared_step + 1
    assert _decide(hold, LIGHT).startswith("join: c") and hold.level == 2
    assert hold.k_now == k and hold.relax_period == 2 * k and hold.headroom > k  # the count resumed
    hold.anchor = None
    waited = []
    while hold.level == 2:
        hold.shared_step += 1
        waited.append(_decide(hold, LIGHT))
    assert hold.shared_step % (2 * k) == 0 and all(r.endswith("until a shared slot") for r in waited[:-1])
    for _ in range(k):
        hold.shared_step += 1
        _decide(hold, LIGHT)
    assert hold.level == 1 and hold.relax_period == k


def test_a_heavier_move_never_waits_for_a_slot() -> None:
    """Slots gate moves lighter only: a law that needs heavier goes at once."""
    hold = _hold()
    _decide(hold, LIGHT)
    hold.relax_period, hold.shared_step = 8 * hold.settings.k, 7  # backed off, not on a slot
    _decide(hold, [1.3, 1.3, 1.0])
    assert hold.level == 2


def test_two_laws_that_settle_lighter_settle_together() -> None:
    """The same for settles: b 3 % cheaper than c, within the step's jitter (5 %), where c is the
    more progressive (q 0.9 against 0.8), so the band's pick stays c and b is the strict pick, a
    settle after settle_steps decisions; the second worker counts from 7 steps later."""
    q = [1.0, 0.8, 0.9]
    near = [1.3, 1.00, 1.03]

    def pair(shared: bool) -> tuple[list[tuple[int, int]], list[str]]:
        holds = (_hold(), _hold())
        reasons: list[str] = []
        sent: list[tuple[int, int]] = []
        for t in range(400):
            for i, hold in enumerate(holds):
                hold.jitter = 0.05
                if sent:
                    smallest = max(sent[-1])
                    hold.anchor = None if sent[-1][i] == smallest else smallest
                hold.shared_step = t + 1 if shared else None
                costs = near if t >= 20 + 7 * i else HEAVY
                reasons.append(hold.step([c * qi for c, qi in zip(costs, q)], q, bw=1e6))
            sent.append((holds[0].level, holds[1].level))  # type: ignore[arg-type]
        return sent, reasons

    stuck, _ = pair(shared=False)
    assert _first_together(stuck) is None
    sent, reasons = pair(shared=True)
    first = _first_together(sent)
    assert first is not None and all(pair == (1, 1) for pair in sent[first:])
    assert any(r.startswith("settle") for r in reasons) and not any(r.startswith("relax") for r in reasons)


def test_the_policy_hands_its_shared_step_to_the_hold() -> None:
    policy = aware()
    policy.shared_step = 41
    policy.choose(ChooseRequest(link=link(20, t=0.0), payload_bytes=S, compute_s=TC, step=0))
    assert policy.hold.shared_step == 41
    policy.shared_step = None
    policy.choose(ChooseRequest(link=link(20, t=0.1), payload_bytes=S, compute_s=TC, step=1))
    assert policy.hold.shared_step is None
