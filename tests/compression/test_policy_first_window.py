"""The run's first window (`WindowResult.first`): its figures stand only until the next full
window's, and that window comes at the stale figures' budget (docs/POLICIES.md, "Windowed progress")."""

from __future__ import annotations

import pytest
import torch

import netsense.compression  # noqa: F401  (registers the codecs the ladder names)
from netsense.compression.policy import ChooseRequest, make_policy
from netsense.compression.policy.ladder import DEFAULT_LADDER, Ladder
from netsense.compression.policy.link import LinkState
from netsense.compression.policy.loop import PolicyLoop
from netsense.compression.policy.netsense import DRIFT_BUDGET_FACTOR, NetsensePolicy
from netsense.compression.window import NoiseScale, WindowResult

S = 1_349_160  # wide-mlp's dense fp32 gradient
LADDER = Ladder.parse(DEFAULT_LADDER, numel=S // 4)
P2 = LADDER.find("powersgd:2")
SHAPES = [(544, 64), (544,), (544, 544), (544,), (10, 544), (10,)]


def policy(**settings: object) -> NetsensePolicy:
    p = make_policy("netsense", LADDER, **settings)
    assert isinstance(p, NetsensePolicy)
    return p


def window(q: float, *, first: bool = False, interim: bool = False) -> WindowResult:
    return WindowResult({P2: q}, NoiseScale(signal=1.0, noise=30.0), steps=4 if interim else 16, interim=interim, first=first)


def test_the_first_windows_figure_is_replaced_by_the_next_full_one() -> None:
    """The transformer (not in the repo): its first window priced powersgd:2 at 0.92, its second
    at 0.72; folded, the estimate said 0.86. Replaced, it says 0.72, and later windows fold."""
    p = policy()
    p.observe_window(window(0.5, first=True, interim=True))
    p.observe_window(window(0.92, first=True))
    assert p.progress[P2] == pytest.approx(0.92) and p.progress.start[P2]
    p.observe_window(window(0.4, interim=True))  # the next window's early look: no full figure
    assert p.progress[P2] == pytest.approx(0.92)
    p.observe_window(window(0.72))
    assert p.progress[P2] == pytest.approx(0.72) and not p.progress.start[P2] and p.progress.measured[P2]
    p.observe_window(window(0.6))
    assert p.progress[P2] == pytest.approx(0.3 * 0.6 + 0.7 * 0.72)


def test_the_loop_marks_the_first_windows_results_only() -> None:
    p = policy(progress_every=1, progress_budget=0.0)
    loop = PolicyLoop(p, direction="up")
    gen = torch.Generator().manual_seed(2)
    marks = []
    step = 0
    for _ in range(2):
        result = None
        while result is None or result.interim:
            assert loop.window_due(step)
            result = loop.feed_window([torch.randn(s, generator=gen) for s in SHAPES])
            step += 1
            if result is not None:
                marks.append((result.interim, result.first))
    assert marks == [(True, True), (False, True), (True, False), (False, False)]
    assert not any(p.progress.start)


def test_a_window_is_due_sooner_while_the_first_windows_figures_stand() -> None:
    """Between the budget's pace and `DRIFT_BUDGET_FACTOR` times it, a window is due while a
    contender is priced by the first window, and not once a later one priced it."""

    def due(first: bool, elapsed: float) -> list[int]:
        p = policy(progress_budget=0.01)
        for i, lv in enumerate(LADDER):
            if not lv.lossless:
                p.observe_costs(level=i, dense_bytes=S, encode_s=0.003, decode_s=0.001)
        choose(p, 0.0)
        levels, _ = p.progress_window(0)
        assert P2 in levels
        p.observe_window(WindowResult({i: 0.99 if i == P2 else 0.3 for i in levels}, NoiseScale(1.0, 30.0), 16, first=first))
        choose(p, elapsed)
        assert P2 in (p._contenders or [])
        return p.progress_window(50)[0]

    probe = policy()
    for i, lv in enumerate(LADDER):
        if not lv.lossless:
            probe.observe_costs(level=i, dense_bytes=S, encode_s=0.003, decode_s=0.001)
    choose(probe, 0.0)
    cost = probe.window_cost([i for i in probe._contenders or [] if not LADDER[i].lossless])
    between = cost / (0.01 * (1 + DRIFT_BUDGET_FACTOR) / 2)
    assert due(first=False, elapsed=between) == []
    assert P2 in due(first=True, elapsed=between)


def choose(p: NetsensePolicy, t: float) -> None:
    lk = LinkState(time_s=t, bandwidth_Bps=2.5e6, min_rtt_s=0.02, srtt_s=0.02)
    p.choose(ChooseRequest(link=lk, payload_bytes=S, compute_s=0.001, step=0 if t == 0 else 50))
