"""`DownlinkController` without connections: the downlink learns its own q and codec costs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from netsense.compression.policy import NetsensePolicy
from netsense.compression.policy.link import LinkState
from netsense.ps.downlink import PROGRESS_START_VERSION, DownlinkController

LADDER = "fp32,fp16,qsgd:8,qsgd:4,topk:0.01+fp16"


def tensors(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(200, 100, generator=gen), "b": torch.randn(100, generator=gen)}


def test_candidates_are_measured_on_the_update_that_was_sent() -> None:
    down = DownlinkController("netsense", ladder=LADDER)
    policy = down.policy
    assert isinstance(policy, NetsensePolicy)
    params = tensors(0)
    shadow = {k: v.clone() for k, v in params.items()}
    v = PROGRESS_START_VERSION + 50  # the second round (every progress_every = 50 updates)
    assert down.measure(v, params, shadow) == {}  # a round's version: the shadow is kept
    assert sorted(down.loop.codecs) == [1, 2, 3, 4]  # ...and the codecs are warmed up
    priors = list(policy.progress.values)
    update = tensors(1)
    params = {k: params[k] + 0.01 * update[k] for k in params}  # the optimizer step to version v + 1
    measured = down.measure(v + 1, params, shadow)
    assert sorted(measured) == [1, 2, 3, 4]  # every lossy level
    assert measured[2] > 0.99 and 0.5 < measured[3] < 0.99 and measured[4] < 0.2
    assert policy.progress.values[4] == measured[4] != priors[4] and policy.progress.measured[3]
    for level in (1, 2, 3, 4):
        assert policy.costs.measured(level) == (True, True)
    assert policy.costs.measured(0) == (False, False)  # fp32: never a candidate, keeps the ladder's


def test_a_snapshot_is_used_only_for_the_next_update() -> None:
    down = DownlinkController("netsense", ladder=LADDER)
    params = tensors(0)
    v = PROGRESS_START_VERSION
    down.measure(v, params, {k: t.clone() for k, t in params.items()})
    assert down.measure(v + 2, params, params) == {}  # two updates later (a resync): not what was encoded
    assert not any(any(down.policy.costs.measured(level)) for level in range(5))  # type: ignore[attr-defined]
    assert not any(down.policy.progress.measured[1:])  # type: ignore[attr-defined]


def test_fixed_policies_measure_nothing() -> None:
    down = DownlinkController("fp16", ladder=LADDER)
    params = tensors(0)
    down.measure(PROGRESS_START_VERSION, params, params)
    assert down._snapshot is None and down.measure(PROGRESS_START_VERSION + 1, params, params) == {}


def test_compute_time_is_the_update_interval_less_its_delivery(monkeypatch: pytest.MonkeyPatch) -> None:
    """The time between two choices, less the slowest delivery of the update in between, is the
    compute time the next decision weighs levels against: the delivery is the level's own cost."""
    import netsense.ps.downlink as downlink

    clock = iter([10.0, 10.5, 11.0])
    monkeypatch.setattr(downlink.time, "perf_counter", lambda: next(clock))
    down = DownlinkController("netsense", ladder=LADDER)
    down.choose(3, [], 4_000_000)  # at t = 10.0
    down._sent[4] = [0.1, 0.3]  # update 4 reached the two workers in 0.1 and 0.3 s
    down.choose(4, [], 4_000_000)  # at t = 10.5: 0.5 s since the last choice, 0.3 of it delivery
    assert down.loop.compute_s == pytest.approx(0.2)
    assert 4 not in down._sent  # the deliveries were consumed by the log line of update 4


async def test_an_update_is_fed_back_when_its_slowest_delivery_is_acked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next update is chosen at the first push, which the near worker sends while the far one
    is still receiving: the update is fed back once the far delivery's ack arrives (timed by that
    ack, not a poller), with both receivers and the far worker's time, and its Tc sample then;
    a delivery never acked is given up at the choice after (forced, with what it had)."""
    from types import SimpleNamespace

    from netsense.transport.sensing.estimator import SensingState

    import netsense.ps.downlink as downlink

    clock = iter([10.0, 10.2, 10.4])
    monkeypatch.setattr(downlink.time, "perf_counter", lambda: next(clock))
    down = DownlinkController("netsense", ladder=LADDER, decision_log=tmp_path / "down.jsonl")
    states = {"far": SensingState(1200), "near": SensingState(1200)}
    down._reader = lambda quic: SimpleNamespace(state=states[quic])  # type: ignore[method-assign]
    down.choose(0, [], 4_000_000)  # at t = 10.0
    t0 = asyncio.get_running_loop().time()
    for quic in states:
        down.sent(quic, 1, 2400)
    packet = SimpleNamespace(sent_time=t0, sent_bytes=2400)
    states["near"].on_acked(packet, t0 + 0.002, 100_000, 0)  # type: ignore[arg-type]
    down.choose(1, [], 4_000_000)  # t = 10.2: the near worker pushed; the far one still receives
    assert down.loop.compute_s is None and not (tmp_path / "down.jsonl").read_text()
    states["far"].on_acked(packet, t0 + 0.150, 100_000, 0)  # type: ignore[arg-type]
    await asyncio.sleep(0)
    first = json.loads((tmp_path / "down.jsonl").read_text().splitlines()[0])
    assert first["receivers"] == 2 and first["comm_s"] == pytest.approx(0.150, abs=0.01)
    assert down.loop.compute_s == pytest.approx(0.2 - 0.150, abs=0.01)
    down.sent("far", 2, 2400)  # never acked: the next choice gives up on it
    down.choose(2, [], 4_000_000)
    down.close()
    second = json.loads((tmp_path / "down.jsonl").read_text().splitlines()[1])
    assert second["version"] == 2 and second["receivers"] == 0 and second["comm_s"] is None


def test_the_first_update_interval_stands_only_until_the_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first interval holds the workers' first step (set-up): the second replaces it rather
    than joining an EWMA that took ~8 updates to forget it; from the third on, the EWMA."""
    import netsense.ps.downlink as downlink
    from netsense.compression.policy.loop import COMPUTE_EWMA_ALPHA

    clock = iter([0.0, 1.0, 1.2, 1.5])
    monkeypatch.setattr(downlink.time, "perf_counter", lambda: next(clock))
    down = DownlinkController("netsense", ladder=LADDER)
    taken = []
    for version in range(4):
        down.choose(version, [], 4_000_000)
        taken.append(down.loop.compute_s)
    a = COMPUTE_EWMA_ALPHA
    assert taken == [None, 1.0, pytest.approx(0.2), pytest.approx(a * 0.3 + (1 - a) * 0.2)]


def test_the_update_encode_time_is_the_chosen_levels_cost() -> None:
    """The store's timing of the update it encoded feeds the level the downlink chose for it,
    from its second use on (the first pays set-up); a timing of another version or codec does not."""
    down = DownlinkController("netsense", ladder=LADDER)
    policy = down.policy
    assert isinstance(policy, NetsensePolicy)
    links: list[LinkState] = []
    down.choose(3, links, 4_000_000)  # bandwidth unknown: the safe level, fp16
    pending = down._pending
    assert pending is not None and pending[0].spec == "fp16" and pending[0].step == 3
    down._observe_encode((4, "fp16", 0.5), 4_000_000)  # first encode at fp16: set-up, skipped
    assert policy.costs.measured(1) == (False, False)
    down._observe_encode((5, "fp16", 0.5), 4_000_000)  # not the version this decision made
    down._observe_encode((4, "fp32", 0.5), 4_000_000)  # not the level it chose
    assert policy.costs.measured(1) == (False, False) and policy.costs.measured(0) == (False, False)
    down._observe_encode((4, "fp16", 0.002), 4_000_000)
    assert policy.costs.measured(1) == (True, False)
    assert abs(policy.costs.encode_s_per_mb(1) - 0.002 / 4) < 1e-9


def test_on_a_running_loop_rounds_run_on_the_window_thread_and_reach_the_policy_on_the_loop() -> None:
    """A round on the PS's loop held every worker's push (two slow pushes in a row read as a slowed
    path); on the window thread it reports to a record that the loop replays into the policy: the
    same figures, and the policy is only ever touched by the loop's thread. The start rounds'
    measurements alone run on the loop, after the thread's warm-up: the choices of updates 1 and 2
    have them; the first's figures are interim, replaced by the second's, which later rounds fold into."""
    import asyncio
    import threading

    v = PROGRESS_START_VERSION
    states = [tensors(0)]
    for seed in (1, 2, 3):
        states.append({k: states[-1][k] + 0.01 * t for k, t in tensors(seed).items()})
    shadows = [{k: t.clone() for k, t in p.items()} for p in states]  # what each update was encoded against

    torch.manual_seed(0)  # qsgd rounds stochastically: both runs draw the same numbers in the same order
    here = DownlinkController("netsense", ladder=LADDER)
    here.measure(v, states[0], shadows[0])
    first = here.measure(v + 1, states[1], shadows[1])
    second = here.measure(v + 2, states[2], shadows[2])
    here.measure(v + 50, states[2], shadows[2])
    measured = here.measure(v + 51, states[3], shadows[3])
    assert sorted(first) == sorted(second) == sorted(measured) == [1, 2, 3, 4]

    away = DownlinkController("netsense", ladder=LADDER)
    rounds: list[str] = []
    told: set[str] = set()
    measure, report = away.loop.measure, away.policy.observe_progress

    def traced_measure(*args, **kwargs):  # type: ignore[no-untyped-def]
        rounds.append(threading.current_thread().name)
        return measure(*args, **kwargs)

    def traced_report(**kwargs):  # type: ignore[no-untyped-def]
        told.add(threading.current_thread().name)
        return report(**kwargs)

    away.loop.measure = traced_measure  # type: ignore[method-assign]
    away.policy.observe_progress = traced_report  # type: ignore[method-assign]
    progress = away.policy.progress

    async def settled() -> None:
        for _ in range(2500):
            if away._window_queued == 0:
                return
            await asyncio.sleep(0.002)

    async def main() -> None:
        torch.manual_seed(0)
        away.measure(v, states[0], shadows[0])  # the warm-up, on the thread
        got = away.measure(v + 1, states[1], shadows[1])  # the first measurement, here and now
        assert got == pytest.approx(first, rel=1e-5)
        for level, q in first.items():  # in the policy before update 1 is chosen, as interim figures
            assert progress.values[level] == pytest.approx(q, rel=1e-5) and not progress.measured[level]
        got = away.measure(v + 2, states[2], shadows[2])  # the second, here too: replaces the first
        assert got == pytest.approx(second, rel=1e-5)
        for level, q in second.items():
            assert progress.values[level] == pytest.approx(q, rel=1e-5) and progress.measured[level]
        await settled()
        away.measure(v + 50, states[2], shadows[2])
        assert away.measure(v + 51, states[3], shadows[3]) == {}  # measured on the thread, reported later
        await settled()

    asyncio.run(main())
    away.close()
    assert rounds[:2] == [threading.main_thread().name] * 2, rounds
    assert len(rounds) == 3 and rounds[2].startswith("netsense-window"), rounds
    assert told == {threading.main_thread().name}, told
    for level, q in measured.items():
        assert progress.values[level] == pytest.approx(0.3 * q + 0.7 * second[level], rel=1e-5)
    assert away.policy.costs.measured(1) == (True, True)


def test_only_a_fresh_runs_first_update_is_priced_as_interim() -> None:
    """The round on update 0 prices the next choice, then gives way to update 1's; a PS resumed
    at a later version has no start rounds: its first round is an ordinary one."""
    params = tensors(0)
    later = {k: params[k] + 0.01 * t for k, t in tensors(1).items()}
    fresh = DownlinkController("netsense", ladder=LADDER)
    fresh.measure(PROGRESS_START_VERSION, params, {k: t.clone() for k, t in params.items()})
    q = fresh.measure(PROGRESS_START_VERSION + 1, later, params)
    assert fresh.policy.progress.values[3] == q[3] and not fresh.policy.progress.measured[3]  # type: ignore[attr-defined]
    resumed = DownlinkController("netsense", ladder=LADDER)
    resumed.measure(1000, params, {k: t.clone() for k, t in params.items()})
    assert resumed.measure(1001, later, params)
    assert resumed.policy.progress.measured[3]  # type: ignore[attr-defined]
    assert resumed._snapshot is None  # no start round at 1001: the next round is at 1050


def test_the_first_update_is_chosen_for_the_bandwidth_the_init_pulls_measured() -> None:
    """Before any update interval is timed the compute time counts as 0, so a known bandwidth
    decides update 0 (a slow path: the 8-bit level, half fp16's bytes); an unknown one still
    sends the unknown-bandwidth level."""
    down = DownlinkController("netsense", ladder=LADDER)
    slow = LinkState(time_s=0.0, bandwidth_Bps=1.2e6, min_rtt_s=0.02, srtt_s=0.02)
    assert down.loop.compute_s is None
    assert down.choose(0, [slow], 4_000_000) == "qsgd:8"
    unknown = DownlinkController("netsense", ladder=LADDER)
    none = LinkState(time_s=0.0, bandwidth_Bps=None, min_rtt_s=None, srtt_s=None)
    assert unknown.choose(0, [none], 4_000_000) == "fp16"


LOW_RANK = "fp32,fp16,qsgd:8,qsgd:4,powersgd:2"
DENSE = 4 * (200 * 100 + 100)
"""fp32 bytes of `tensors`: a choice on them is priced at their own size. At 4 MB a 60 ms stall of
one candidate's timing (another test process on the cores) cost 50x that and flipped the level."""
SLOW = LinkState(time_s=0.0, bandwidth_Bps=DENSE / 3.3, min_rtt_s=0.02, srtt_s=0.02)
"""3.3 s per fp32 update."""


def _rank_one_update(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    u, v = torch.randn(200, 1, generator=gen), torch.randn(1, 100, generator=gen)
    return {"w": params["w"] + 0.01 * (u @ v), "b": params["b"] + 0.01 * torch.randn(100, generator=gen)}


def test_update_0_is_chosen_on_itself() -> None:
    """The first update's level waits for the update (`defers`): its start round runs on it, so
    the choice has measured q figures (interim) where at the first push it had only the priors
    (PowerSGD's worst case) and sent the 8-bit level. The next start round is update 1's."""
    slow = SLOW
    params = tensors(0)
    new = _rank_one_update(params)
    blind = DownlinkController("netsense", ladder=LOW_RANK)
    blind.measure(PROGRESS_START_VERSION, params, {k: t.clone() for k, t in params.items()})
    assert blind.choose(PROGRESS_START_VERSION, [slow], DENSE) == "qsgd:8"  # on the priors
    down = DownlinkController("netsense", ladder=LOW_RANK)
    down.measure(PROGRESS_START_VERSION, params, {k: t.clone() for k, t in params.items()})
    assert down.defers(PROGRESS_START_VERSION) and down.due(PROGRESS_START_VERSION)
    down.defer(PROGRESS_START_VERSION)
    assert not down.due(PROGRESS_START_VERSION)  # the step's other pushes do not choose again
    assert down.choose_on_update(PROGRESS_START_VERSION, new, [slow], DENSE) == "powersgd:2"
    assert down.policy.level is None  # type: ignore[attr-defined]  # provisional: update 1 is the law's afresh
    progress = down.policy.progress  # type: ignore[attr-defined]
    assert progress.values[4] > 0.5 and not progress.measured[4]  # measured on update 0, interim
    assert down.measure(PROGRESS_START_VERSION + 1, new, new) == {}  # used up: nothing measured twice
    later = {k: v + 0.01 * t for (k, v), t in zip(new.items(), tensors(3).values())}
    assert sorted(down.measure(PROGRESS_START_VERSION + 2, later, new)) == [1, 2, 3, 4]  # update 1's round
    assert progress.measured[4]
    fast = LinkState(time_s=0.0, bandwidth_Bps=1e9, min_rtt_s=0.001, srtt_s=0.001)
    assert down.choose(PROGRESS_START_VERSION + 1, [fast], DENSE) is not None
    assert down._pending is not None and down._pending[0].reason.startswith("law")  # not "hold: ..."


def test_only_a_fresh_netsense_downlink_defers() -> None:
    params = tensors(0)
    fixed = DownlinkController("fp16", ladder=LOW_RANK)
    fixed.measure(PROGRESS_START_VERSION, params, params)
    resumed = DownlinkController("netsense", ladder=LOW_RANK)
    resumed.measure(1000, params, {k: t.clone() for k, t in params.items()})
    assert not fixed.defers(PROGRESS_START_VERSION) and not resumed.defers(1000)


def test_the_warm_up_at_init_is_in_the_policy_when_update_0_is_chosen() -> None:
    """`prepare` at INIT warms the codecs up on the window thread; the choice of update 0 drains
    it and has what it learnt (PowerSGD's wire ratio on the model's shapes) in the same turn of
    the loop, not at the loop's next one."""
    slow = SLOW
    params = tensors(0)
    down = DownlinkController("netsense", ladder=LOW_RANK)

    async def main() -> str | None:
        down.prepare(params)
        down.measure(PROGRESS_START_VERSION, params, {k: t.clone() for k, t in params.items()})
        down.defer(PROGRESS_START_VERSION)
        spec = down.choose_on_update(PROGRESS_START_VERSION, _rank_one_update(params), [slow], DENSE)
        assert 4 in down.policy._ratios  # type: ignore[attr-defined]
        assert down._window_queued == 0 and not down._unfinished
        return spec

    assert asyncio.run(main()) == "powersgd:2"
    down.close()


def test_update_1_is_priced_on_itself_not_on_the_residual_update_0_left() -> None:
    """The start rounds price the update alone: update 0 may go at a lossy level (it is chosen on
    itself), and on update + residual the round charged that level's residual to every candidate.
    Here update 1 is sparse (top-k keeps all of it) and the shadow lags by a dense residual."""
    params0 = tensors(0)
    down = DownlinkController("netsense", ladder=LADDER)
    down.measure(PROGRESS_START_VERSION, params0, {k: t.clone() for k, t in params0.items()})
    params1 = {k: v + 0.01 * t for (k, v), t in zip(params0.items(), tensors(1).values())}
    shadow1 = {k: v + 0.01 * t for (k, v), t in zip(params1.items(), tensors(2).values())}  # lags by a dense residual
    down.measure(PROGRESS_START_VERSION + 1, params1, shadow1)  # update 0's round; update 1's snapshot
    params2 = {k: v.clone() for k, v in params1.items()}
    for v in params2.values():
        v.view(-1)[3] += 1.0  # update 1: one coordinate per key
    measured = down.measure(PROGRESS_START_VERSION + 2, params2, shadow1)
    assert measured[4] > 0.99  # topk:0.01 keeps the whole update; on update + residual it kept ~0.1


class _Deliveries:
    """A connection's reader whose deliveries the test acks by hand (`SensingState.when_delivered`)."""

    def __init__(self) -> None:
        self.waiting: list[object] = []
        self.state = self

    def when_delivered(self, nbytes: int, callback: object) -> None:
        self.waiting.append(callback)


@pytest.mark.parametrize("acked", [False, True], ids=["ack-not-in", "acked"])
def test_the_first_step_is_timed_from_the_first_pull_even_before_its_ack(acked: bool) -> None:
    """Update 0's compute time is the workers' first step: from the ack of their first pull to
    their first push, or from the pull's write where a (delayed) ACK frame comes after the push,
    which timed the step at 0 (a flaky e2e check, tests/ps/test_downlink_first.py)."""
    down = DownlinkController("netsense", ladder=LOW_RANK)
    reader = _Deliveries()
    down._reader = lambda quic: reader  # type: ignore[method-assign,assignment,return-value]

    async def main() -> tuple[float, float, float]:
        """The first step as timed, and the bounds its start (the write, or the ack) puts on it."""
        loop = asyncio.get_running_loop()
        written = loop.time()
        down.sent(object(), PROGRESS_START_VERSION, 1000)
        await asyncio.sleep(0.02)
        start = written
        if acked:
            start = loop.time()
            reader.waiting[0](start)  # type: ignore[operator]
        await asyncio.sleep(0.02)
        before = loop.time()
        down.defer(PROGRESS_START_VERSION)
        after = loop.time()
        assert down._first_compute_s is not None
        return down._first_compute_s, before - start, after - start

    first, low, high = asyncio.run(main())
    assert first > 0 and low - 0.005 <= first <= high + 0.005
    down.close()
