"""The policy's side of the progress windows: schedule, pricing that outlasts one step's figures,
the loop that feeds them, the run's first window, and wire ratios measured on the run's shapes."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import netsense.compression  # noqa: F401  (registers the codecs the ladder names)
from netsense.compression.policy import ChooseRequest, Decision, make_policy
from netsense.compression.policy.ladder import DEFAULT_LADDER, Ladder
from netsense.compression.policy.link import LinkState
from netsense.compression.policy.loop import PolicyLoop, measure_ratio
from netsense.compression.policy.netsense import NetsensePolicy
from netsense.compression.policy.netsense_settings import NetsensePolicySettings
from netsense.compression.window import NoiseScale, WindowResult

S = 1_349_160  # wide-mlp's dense fp32 gradient
LADDER = Ladder.parse(DEFAULT_LADDER, numel=S // 4)
Q4 = LADDER.find("qsgd:4")
SHAPES = [(544, 64), (544,), (544, 544), (544,), (10, 544), (10,)]


def policy(**settings: object) -> NetsensePolicy:
    p = make_policy("netsense", LADDER, **settings)
    assert isinstance(p, NetsensePolicy)
    return p


def priced(p: NetsensePolicy, encode_s: float, decode_s: float) -> NetsensePolicy:
    """`p` with every lossy level's codec times and its wire ratio on `SHAPES` observed."""
    for i, lv in enumerate(LADDER):
        if not lv.lossless:
            p.observe_costs(level=i, dense_bytes=S, encode_s=encode_s, decode_s=decode_s)
            p.observe_ratio(level=i, ratio=measure_ratio(lv.spec, [torch.zeros(s) for s in SHAPES]) or 1.0)
    return p


def choose(p: NetsensePolicy, bw_Bps: float, step: int, t: float) -> int:
    lk = LinkState(time_s=t, bandwidth_Bps=bw_Bps, min_rtt_s=0.02, srtt_s=0.02)
    d = p.choose(ChooseRequest(link=lk, payload_bytes=S, compute_s=0.001, step=step))
    assert d.level is not None
    return d.level


def result(progress: dict[int, float]) -> WindowResult:
    return WindowResult(progress, NoiseScale(signal=1.0, noise=30.0), steps=16)


def test_a_windowed_q_replaces_one_step_figures_for_good() -> None:
    p = policy()
    p.observe_progress(level=Q4, progress=0.3)  # one step of qsgd:4 on heavy-tailed gradients
    assert p.progress[Q4] == 0.3
    p.observe_window(result({Q4: 0.95}))
    assert p.progress[Q4] == 0.95  # the first window replaces the one-step figure outright
    p.observe_progress(level=Q4, progress=0.3)
    assert p.progress[Q4] == 0.95  # and later one-step figures no longer count
    p.observe_window(result({Q4: 0.85}))
    assert abs(p.progress[Q4] - (0.3 * 0.85 + 0.7 * 0.95)) < 1e-9
    fresh = policy()
    fresh.observe_window(WindowResult({Q4: 0.6}, NoiseScale(1.0, 1.0), steps=4, interim=True))
    assert fresh.progress[Q4] == 0.6 and fresh.progress.noise is None  # interim: stands in for the prior
    fresh.observe_progress(level=Q4, progress=0.3)
    assert fresh.progress[Q4] == 0.6
    fresh.observe_window(result({Q4: 0.9}))
    assert fresh.progress[Q4] == 0.9  # the full window replaces it outright
    fresh.observe_window(WindowResult({Q4: 0.5}, NoiseScale(1.0, 1.0), steps=4, interim=True))
    assert fresh.progress[Q4] == 0.9  # and later interims do not count
    assert p.progress.noise is not None and p.progress.noise.ratio == 30.0


def test_a_window_can_make_the_law_pick_powersgd_over_qsgd() -> None:
    # 50 Mbit/s, wide-mlp: qsgd:4 sends 171 kB (27 ms), powersgd:2 ~23 kB (4 ms). With one step's
    # figures (cold PowerSGD ~0.05) qsgd:4 wins; once windows price both, PowerSGD does.
    p = priced(policy(), 0.002, 0.0005)
    p.observe_progress(level=Q4, progress=0.9)
    before = [choose(p, 6.25e6, step, step * 0.05) for step in range(20)]
    assert before[-1] == Q4
    windowed = {i: 0.5 if lv.spec.startswith("topk") else 0.9 for i, lv in enumerate(LADDER) if not lv.lossless}
    p.observe_window(result({**windowed, Q4: 0.97}))
    after = [choose(p, 6.25e6, step, step * 0.05) for step in range(20, 40)]
    assert LADDER[after[-1]].spec.startswith("powersgd")


def test_windows_are_asked_for_the_levels_that_could_win_within_the_budget() -> None:
    p = policy(progress_budget=0.01)
    levels, w = p.progress_window(0)
    assert w == 16 and levels == [i for i, lv in enumerate(LADDER) if not lv.lossless]  # nothing predicted yet
    assert p.progress_window(1) == ([], 0)  # off the `progress_every` schedule
    assert policy().progress_window(3)[1] == 16  # but the first window starts at once
    for i, lv in enumerate(LADDER):
        if not lv.lossless:  # top-k ~15 ms/MB here, the others ~2
            encode = 0.02 if lv.spec.startswith("topk") else 0.003
            p.observe_costs(level=i, dense_bytes=S, encode_s=encode, decode_s=0.001)
    # Unshaped (10 Gbit/s): a heavy level's codec time alone exceeds fp16's whole step, so only
    # the light levels could win; a window costs 2 * 16 * sum of their codec time on its sample.
    choose(p, 1.25e9, 50, 1000.0)
    levels, _ = p.progress_window(50)
    assert levels and all(not LADDER[i].lossless for i in levels)
    assert LADDER.find("topk:0.001+fp16") not in levels
    choose(p, 1.25e9, 100, 1000.01)
    assert p.progress_window(100) == ([], 0)  # 10 ms after the last: over the budget
    assert policy(progress_window=0).progress_window(0) == ([], 0)  # off


def test_a_window_is_charged_what_the_last_one_cost() -> None:
    """The budget holds a window's measured CPU time, not its codec time alone: a window whose
    steps cost 10x the prediction puts the next one 10x further off."""
    p = policy(progress_budget=0.01, window_drift=0.0)
    lossy = [i for i, lv in enumerate(LADDER) if not lv.lossless]
    for i in lossy:
        p.observe_costs(level=i, dense_bytes=S, encode_s=0.003, decode_s=0.001)
    predicted = p.window_cost(lossy)
    assert predicted > 0
    per_step = 10 * predicted / (1.5 * 16 * len(lossy))
    p.observe_window(replace(result({Q4: 0.9}), cpu_s=per_step * 24 * len(lossy), level_steps=24 * len(lossy)))
    assert abs(p.window_cost(lossy) - 10 * predicted) < 1e-9 * predicted
    assert abs(p.window_cost(lossy[:1]) - 10 * predicted / len(lossy)) < 1e-9 * predicted
    choose(p, 1.25e7, 0, 0.0)
    assert p.progress_window(0)[0]  # the first window: at once
    choose(p, 1.25e7, 50, 0.5 * p.window_cost(lossy[:1]) / 0.01)
    assert p.progress_window(50) == ([], 0)  # under the gap of even a one-level window: not yet
    choose(p, 1.25e7, 100, 1.01 * p.window_cost(lossy) / 0.01)
    assert p.progress_window(100)[0]  # past the gap of the widest window: due


def test_a_window_result_carries_its_cpu_time() -> None:
    p = policy(progress_every=1)
    loop = PolicyLoop(p, direction="up")
    gen = torch.Generator().manual_seed(2)
    result, step = None, 0
    while result is None or result.interim:
        assert loop.window_due(step)
        result = loop.feed_window([torch.randn(s, generator=gen) for s in SHAPES])
        step += 1
    lossy = [i for i, lv in enumerate(LADDER) if not lv.lossless]
    assert result.level_steps == 16 * len(lossy) and result.cpu_s > 0
    # Each level's own step cost, the shared work spread over every level-step: they add up.
    assert set(result.level_cpu_s) == set(lossy) and all(c > 0 for c in result.level_cpu_s.values())
    assert abs(16 * sum(result.level_cpu_s.values()) - result.cpu_s) < 1e-9
    assert abs(p.window_cost([Q4]) - 1.5 * 16 * result.level_cpu_s[Q4]) < 1e-12


def test_a_window_of_dear_levels_is_charged_their_cost() -> None:
    """A window's cost is each level's own: top-k and PowerSGD steps cost 3-5x the packed fp16 and
    QSGD ones, so charged the mean of a window of all levels, a window of the dear ones alone was
    held to 0.6x of its cost. A level no window ran yet is charged that mean."""
    p = policy(progress_budget=0.01, window_drift=0.0)
    lossy = [i for i, lv in enumerate(LADDER) if not lv.lossless]
    p2, topk = LADDER.find("powersgd:2"), LADDER.find("topk:0.01+fp16")
    assert p2 is not None and topk is not None
    costs = {Q4: 0.001, p2: 0.01}
    p.observe_window(replace(result({Q4: 0.9}), cpu_s=0.011 * 24, level_steps=2 * 24, level_cpu_s=costs))
    assert abs(p.window_cost([p2]) - 24 * 0.01) < 1e-12
    assert abs(p.window_cost([Q4, p2]) - 24 * 0.011) < 1e-12
    assert abs(p.window_cost([topk]) - 24 * 0.011 / 2) < 1e-12  # not run yet: the mean
    assert set(lossy) >= {Q4, p2, topk}


def test_a_restart_keeps_the_windows_cost_and_its_steps_together() -> None:
    """A restart (here a non-finite gradient) resets the window, not what it has cost: the CPU time
    and the error-feedback steps behind it both run on, so their ratio stays a per-step cost."""
    from netsense.compression.window import WindowProbe

    probe = WindowProbe({Q4: "qsgd:4"}, window=4, warm=0)
    gen = torch.Generator().manual_seed(3)
    probe.feed([torch.randn(s, generator=gen) for s in SHAPES])
    bad = [torch.randn(s, generator=gen) for s in SHAPES]
    bad[0][0, 0] = float("nan")
    probe.feed(bad)
    assert probe.fed == 0 and probe.level_steps == 1  # the restart's feed ran no step
    result = None
    while result is None or result.interim:
        result = probe.feed([torch.randn(s, generator=gen) for s in SHAPES])
    assert probe.fed == 4 and result.level_steps == 5 and result.cpu_s == probe.cpu_s > 0


def test_the_loop_runs_a_window_on_the_stream_and_feeds_the_policy() -> None:
    p = policy(progress_every=1)
    loop = PolicyLoop(p, direction="up")
    gen = torch.Generator().manual_seed(0)
    base = [torch.randn(s, generator=gen) * 0.05 for s in SHAPES]
    step, result, seen = 0, None, []
    while result is None or result.interim:
        assert loop.window_due(step)
        result = loop.feed_window([b + torch.randn(b.shape, generator=gen) for b in base])
        step += 1
        if result is not None:
            seen.append((step, result.interim))
    # The first window starts with the run's own zero residuals: no warm-up, interims 4 and 8 steps in.
    assert seen == [(4, True), (8, True), (16, False)] and loop.window is None
    assert set(result.progress) == {i for i, lv in enumerate(LADDER) if not lv.lossless}
    assert all(p.progress.windowed[i] for i in result.progress)
    assert result.noise.ratio > 10  # noise 1 per element against a 0.05 signal
    assert result.progress[Q4] > 0.9 and result.progress[Q4] > result.progress[LADDER.find("topk:0.001+fp16")]


def test_later_windows_warm_their_residuals_first() -> None:
    p = policy(progress_every=1, progress_budget=0.0)
    loop = PolicyLoop(p, direction="up")
    gen = torch.Generator().manual_seed(1)
    step = 0
    for window in range(2):
        fed, result = 0, None
        while result is None or result.interim:
            assert loop.window_due(step)
            result = loop.feed_window([torch.randn(s, generator=gen) for s in SHAPES])
            step, fed = step + 1, fed + 1
        assert fed == (16 if window == 0 else 8 + 16)


def test_powersgd_ratio_is_measured_on_the_keys_shapes() -> None:
    tensors = [torch.zeros(s) for s in SHAPES]
    ratio = measure_ratio("powersgd:2", tensors)
    assert ratio is not None and 0.012 < ratio < 0.02  # factors of each matrix, biases dense
    default = Ladder.default()  # nominal ratios at 2^20 elements, as one square matrix
    assert default[default.find("powersgd:2")].ratio < ratio / 4  # 4x too small for these keys
    flat = measure_ratio("qsgd:4", [t.reshape(-1) for t in tensors])  # elementwise: shapes do not matter
    assert flat is not None and abs(measure_ratio("qsgd:4", tensors) - flat) < 1e-3 * flat  # type: ignore[operator]
    assert measure_ratio("fp16", []) is None


def test_a_window_is_due_sooner_when_a_contenders_one_step_error_moved() -> None:
    # charlm: the first window priced powersgd:2 at 0.99 while its one-step q was ~0.67; 50 steps on
    # its one-step q read 0.2-0.3 (a higher-rank phase), and under a 1 % budget the stale 0.99 held
    # for 200 steps. A move of the one-step error odds by more than `window_drift` lets the next
    # window come at `DRIFT_BUDGET_FACTOR` x the budget.
    from netsense.compression.policy.netsense import DRIFT_BUDGET_FACTOR

    p2 = LADDER.find("powersgd:2")

    def run(one_step_later: float, elapsed: float, first: bool = False, **settings: object) -> list[int]:
        p = policy(progress_budget=0.01, **settings)
        for i, lv in enumerate(LADDER):
            if not lv.lossless:
                p.observe_costs(level=i, dense_bytes=S, encode_s=0.003, decode_s=0.001)
        choose(p, 2.5e6, 0, 0.0)
        levels, _ = p.progress_window(0)
        assert p2 in levels
        for _ in range(3):
            p.observe_progress(level=p2, progress=0.67)
        priced = {i: 0.99 if i == p2 else 0.3 for i in levels}  # powersgd:2 the best
        p.observe_window(WindowResult(priced, NoiseScale(signal=1.0, noise=30.0), steps=16, first=first))
        for _ in range(10):
            p.observe_progress(level=p2, progress=one_step_later)
        choose(p, 2.5e6, 50, elapsed)
        assert p2 in (p._contenders or [])
        return p.progress_window(50)[0]

    probe = policy()
    for i, lv in enumerate(LADDER):
        if not lv.lossless:
            probe.observe_costs(level=i, dense_bytes=S, encode_s=0.003, decode_s=0.001)
    choose(probe, 2.5e6, 0, 0.0)
    cost = probe.window_cost([i for i in probe._contenders or [] if not LADDER[i].lossless])
    between = cost / (0.01 * (1 + DRIFT_BUDGET_FACTOR) / 2)  # over the budget, within the drift's
    assert run(0.67, between) == []  # the stream as the window saw it: the budget holds
    assert run(0.65, between) == []  # a small move is no drift
    assert p2 in run(0.25, between)  # odds 0.49 -> 3.0: stale, a window is due
    assert p2 in run(0.95, between)  # either way
    assert run(0.25, between, window_drift=0) == []  # off
    assert p2 in run(0.67, 2 * cost / 0.01)  # the budget's own pace, drift or not
    assert p2 in run(0.67, between, first=True)  # the run's first window's figures: as stale


def test_the_first_windows_figure_is_replaced_by_the_next_full_one() -> None:
    """The transformer (not in the repo): its first window priced powersgd:2 at 0.92, its second
    at 0.72; folded, the estimate said 0.86. Replaced, it says 0.72, and later windows fold."""
    p2 = LADDER.find("powersgd:2")

    def window(q: float, *, first: bool = False, interim: bool = False) -> WindowResult:
        return WindowResult({p2: q}, NoiseScale(1.0, 30.0), steps=4 if interim else 16, interim=interim, first=first)

    p = policy()
    p.observe_window(window(0.5, first=True, interim=True))
    p.observe_window(window(0.92, first=True))
    assert abs(p.progress[p2] - 0.92) < 1e-9 and p.progress.start[p2]
    p.observe_window(window(0.4, interim=True))  # the next window's early look: no full figure
    assert abs(p.progress[p2] - 0.92) < 1e-9
    p.observe_window(window(0.72))
    assert abs(p.progress[p2] - 0.72) < 1e-9 and not p.progress.start[p2] and p.progress.measured[p2]
    p.observe_window(window(0.6))
    assert abs(p.progress[p2] - (0.3 * 0.6 + 0.7 * 0.72)) < 1e-9


def test_each_of_the_first_windows_figures_is_the_laws_afresh_and_later_windows_are_held() -> None:
    # Interim figures at W/4 and W/2, then the window's own: the hold kept powersgd:4 chosen on the
    # first interim figure while the second priced powersgd:2 ahead, by less than the headroom
    # (wide-mlp, 4 workers). Each figure of the first window releases the hold once; a later
    # window's figures move the level only past the headroom, as before.
    p2, p4 = (LADDER.find(f"powersgd:{r}") for r in (2, 4))
    p = priced(policy(), 0.0005, 0.0002)
    for i, lv in enumerate(LADDER):
        if not lv.lossless:
            p.observe_progress(level=i, progress=0.3)
    p.progress_window(0)
    lk = LinkState(time_s=0.0, bandwidth_Bps=6.25e6, min_rtt_s=0.02, srtt_s=0.02)

    def figures(q2: float, q4: float, **kw: object) -> WindowResult:
        q = {i: 0.3 for i, lv in enumerate(LADDER) if not lv.lossless}
        q.update({p2: q2, p4: q4})
        return WindowResult(q, NoiseScale(1.0, 1.0), **kw)  # type: ignore[arg-type]

    def decide(step: int) -> Decision:
        return p.choose(ChooseRequest(link=replace(lk, time_s=0.05 * step), payload_bytes=S, compute_s=0.001, step=step))

    decide(0)
    p.observe_window(figures(0.5, 0.97, steps=4, interim=True, first=True))
    assert decide(1).level == p4
    d = decide(2)
    assert d.level == p4 and d.predicted_levels is not None
    # the q at which powersgd:2's cost per progress (two passes: P / q^2) ties powersgd:4's
    tie = 0.97 * (d.predicted_levels[p2] / d.predicted_levels[p4]) ** 0.5
    assert tie < 0.95
    p.observe_window(figures(tie * 1.03, 0.97, steps=8, interim=True, first=True))  # ahead by ~6 %
    d = decide(3)
    assert d.level == p2 and d.reason.endswith("(a new window figure: no hold)"), d
    p.observe_window(figures(tie * 1.03, 0.97, steps=16, first=True))
    assert decide(4).reason.endswith("(a new window figure: no hold)")
    assert "no hold" not in decide(5).reason
    # a later window's figures release nothing: the hold is the hysteresis's again
    p.observe_window(figures(tie / 1.03, 0.97, steps=16))
    d = decide(6)
    assert d.level == p2 and d.reason.startswith("hold:") and "no hold" not in d.reason, d


def test_the_loop_marks_the_first_windows_results_only() -> None:
    p = policy(progress_every=1, progress_budget=0.0)
    loop = PolicyLoop(p, direction="up")
    gen = torch.Generator().manual_seed(2)
    marks, step = [], 0
    for _ in range(2):
        got = None
        while got is None or got.interim:
            assert loop.window_due(step)
            got = loop.feed_window([torch.randn(s, generator=gen) for s in SHAPES])
            step += 1
            if got is not None:
                marks.append((got.interim, got.first))
    assert marks == [(True, True), (True, True), (False, True), (True, False), (True, False), (False, False)]
    assert not any(p.progress.start)


def test_a_level_chosen_before_the_first_window_is_not_held_by_the_hysteresis() -> None:
    # A fresh model's first gradients are of low rank: one step prices powersgd:1 nearly lossless,
    # and the law sends it. The first window's interim figure says otherwise; the hold would keep
    # rank 1 for k more steps on the evidence it replaced (charlm: five steps, then a relax to
    # the heaviest level seen on the way). Before the first window the law decides afresh, after
    # it the hysteresis holds as before, and without windows it holds from the start.
    p1, p2, p4 = (LADDER.find(f"powersgd:{r}") for r in (1, 2, 4))
    interim = {i: 0.5 if lv.spec.startswith("topk") else 0.97 for i, lv in enumerate(LADDER) if not lv.lossless}
    interim.update({p1: 0.3, p2: 0.6})

    def run(**settings: object) -> tuple[NetsensePolicy, list[tuple[int, str]]]:
        p = priced(policy(**settings), 0.0005, 0.0002)
        for i, lv in enumerate(LADDER):
            if not lv.lossless:
                p.observe_progress(level=i, progress=0.5 if lv.spec.startswith("topk") else 0.95)
        p.progress_window(0)  # the run's first window starts with it (none when windows are off)
        out = []
        for step in range(4):
            if step == 2:
                p.observe_window(WindowResult(interim, NoiseScale(1.0, 1.0), steps=4, interim=True, first=True))
            lk = LinkState(time_s=0.05 * step, bandwidth_Bps=6.25e6, min_rtt_s=0.02, srtt_s=0.02)
            d = p.choose(ChooseRequest(link=lk, payload_bytes=S, compute_s=0.001, step=step))
            assert d.level is not None
            out.append((d.level, d.reason))
        return p, out

    _, steps = run()
    assert [lv for lv, _ in steps[:2]] == [p1, p1], steps  # one step's figures: rank 1 wins
    assert steps[2][0] != p1 and "before the first window" in steps[2][1], steps  # moved at once
    p, _ = run()
    assert p.level == p4
    p.observe_window(WindowResult({p4: 0.9}, NoiseScale(1.0, 1.0), steps=16, first=True))  # the window's own
    lk = LinkState(time_s=0.5, bandwidth_Bps=6.25e6, min_rtt_s=0.02, srtt_s=0.02)
    fresh = p.choose(ChooseRequest(link=lk, payload_bytes=S, compute_s=0.001, step=4))
    assert fresh.reason.endswith("(a new window figure: no hold)") and fresh.level == p4, fresh
    lk = LinkState(time_s=0.55, bandwidth_Bps=1e9, min_rtt_s=0.02, srtt_s=0.02)  # now a lossless level wins
    held = p.choose(ChooseRequest(link=lk, payload_bytes=S, compute_s=0.001, step=5))
    assert held.reason.startswith("hold: headroom"), held.reason  # chosen on a window's figure: held
    _, off = run(progress_window=0)
    assert [lv for lv, _ in off[:3]] == [p1] * 3 and off[2][1].startswith("hold: headroom"), off


def test_a_sent_window_replaces_only_an_estimate_it_finds_grossly_optimistic() -> None:
    """`observe_sent_window`: error odds `sent_window_drift` (2) times the estimate's or more
    replace the level's q; a figure nearer, or higher, leaves it (the other levels' windows share
    the estimate's bias); a pinned level is never moved."""
    ladder = Ladder.parse("fp32,qsgd:4,powersgd:2,powersgd:1")
    policy = make_policy("netsense", ladder)
    assert isinstance(policy, NetsensePolicy)
    p2, p1 = ladder.find("powersgd:2"), ladder.find("powersgd:1")
    policy.progress.update_window(p2, 0.9)  # odds 1/9
    policy.observe_sent_window(level=p2, progress=0.85)  # odds 0.176: 1.6x, left
    assert policy.progress[p2] == pytest.approx(0.9)
    policy.observe_sent_window(level=p2, progress=0.99)  # higher: left
    assert policy.progress[p2] == pytest.approx(0.9)
    policy.observe_sent_window(level=p2, progress=0.8)  # odds 0.25: 2.25x, replaced outright
    assert policy.progress[p2] == pytest.approx(0.8) and policy.progress.windowed[p2]
    policy.progress.pin(p1, 0.9)
    policy.observe_sent_window(level=p1, progress=0.2)
    assert policy.progress[p1] == pytest.approx(0.9)
    off = NetsensePolicy(ladder, NetsensePolicySettings(sent_window_drift=0))
    assert off.sent_window_steps == 0 and policy.sent_window_steps == 16
