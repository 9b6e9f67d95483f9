"""`UplinkController` without a connection: startup samples, progress measurement hand-off."""

from __future__ import annotations

import pytest
import torch

from netsense.compression.policy import NetsensePolicy, make_policy
from netsense.compression.policy.ladder import Ladder
from netsense.compression.policy.link import LinkState
from netsense.worker.uplink import PROGRESS_START_STEP, STARTUP_STEPS, UplinkController

S = 1_000_000


def controller() -> tuple[UplinkController, NetsensePolicy]:
    policy = make_policy("netsense", Ladder.parse("fp32,fp16,qsgd:4,topk:0.01+fp16"))
    assert isinstance(policy, NetsensePolicy)
    return UplinkController(policy, payload_bytes=S), policy


def test_first_push_is_not_a_bandwidth_sample() -> None:
    """The first push runs in slow start after the handshake: a low rate that must not seed the estimate."""
    up, policy = controller()
    link = LinkState(0.0, None, 0.002, 0.002)
    for step in range(STARTUP_STEPS + 1):
        up.choose(link, started=float(step))
        up.observe(bytes_sent=S, comm_s=1.0 if step < STARTUP_STEPS else 0.102)  # 1 MB/s, then 10 MB/s
    assert policy.bandwidth.update(link) == 1_000_000 / 0.1


def test_candidates_are_measured_and_reported() -> None:
    up, policy = controller()
    assert PROGRESS_START_STEP == 0  # the first round prices every level before the first push
    assert up.progress_candidates() == [1, 2, 3]  # every lossy level, every progress_every steps
    up._step = PROGRESS_START_STEP + 1
    assert up.progress_candidates() == []
    up._step = PROGRESS_START_STEP + policy.settings.progress_every
    assert up.progress_candidates() == [1, 2, 3]
    gen = torch.Generator().manual_seed(0)
    measured = up.measure_progress([2, 3], [torch.randn(300, 200, generator=gen), torch.randn(5000, generator=gen)])
    assert set(measured) == {2, 3} and measured[2] > 0.9 and 0.01 < measured[3] < 0.5
    assert policy.progress.values[2] == measured[2] and policy.progress.measured[3]
    up.observe_progress(3, 0.5)
    assert policy.progress.values[3] == 0.3 * 0.5 + 0.7 * measured[3]
    up.observe_progress(None, 0.5)  # an off-ladder level: nothing to update


def test_step_encode_time_and_candidate_rounds_become_measured_costs() -> None:
    """The step's `codec_s` (the keys' encode time, not the step's wall-clock `encode_s`) is the sent
    level's encode cost, from its second send on (the first builds and warms its codecs); candidate
    rounds time every lossy level."""
    policy = make_policy("netsense", Ladder.parse("fp32,qsgd:4,topk:0.01+fp16"))
    assert isinstance(policy, NetsensePolicy)
    up = UplinkController(policy, payload_bytes=S)
    link = LinkState(0.0, None, 0.002, 0.002)
    for step in range(3):  # fp32 throughout: the bandwidth is never more than a lower bound
        started = float(step)
        up.choose(link, started=started)
        up.observe(bytes_sent=S, comm_s=0.003, encode_s=0.5, codec_s=0.050 if step < 2 else 0.005)
    assert policy.costs.measured(0) == (True, False)
    assert policy.costs.encode_s_per_mb(0) == 0.005  # step 0 is startup, step 1 a first use: only step 2
    gen = torch.Generator().manual_seed(0)
    up.measure_progress([2], [torch.randn(300, 200, generator=gen)])  # warmed up, then timed
    assert policy.costs.measured(2) == (True, True) and policy.costs.measured(1) == (False, False)


def test_the_updates_return_is_counted_once_against_a_gradient_domain_ps(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """With two passes the law prices every level's return itself, so the wait for the update
    gives back the law's figure for the return at the level just sent: (passes - 1) x its bytes at
    the decision's bandwidth; with one pass (or no bandwidth yet) the wait stays whole."""
    up, policy = controller()
    link = LinkState(0.0, None, 0.002, 0.002)
    for step in range(STARTUP_STEPS + 1):  # the policy learns 10 MB/s
        up.choose(link, started=float(step))
        up.observe(bytes_sent=S, comm_s=1.0 if step < STARTUP_STEPS else 0.102)
    for passes, bytes_sent in ((1, 500_000), (2, 500_000), (2, 5_000_000)):
        policy.passes = passes
        decision = up.choose(link, started=10.0)
        assert decision.bandwidth_Bps is not None and decision.bandwidth_Bps > 0
        up.observe(bytes_sent=bytes_sent, comm_s=0.2, wire_s=0.5)  # the update came 0.3 s after the push
        back = (passes - 1) * bytes_sent * max(1 / decision.bandwidth_Bps, decision.per_byte_s or 0.0)
        assert up._waited_s == pytest.approx(max(0.0, 0.3 - back))
        assert (up._waited_s < 0.3) == (passes == 2)
    assert up._waited_s == 0.0  # a return longer than the wait leaves none, never less
    policy.returns.value = 2.0  # every worker's copy through one bottleneck: the law prices the return twice
    from netsense.compression.policy.decisionlog import DecisionLog

    up.loop.log = DecisionLog(tmp_path / "up.jsonl", direction="up")
    decision = up.choose(link, started=11.0)
    assert decision.return_share == 2.0
    line = up.observe(bytes_sent=100_000, comm_s=0.2, wire_s=0.5, returned=(100_000, 0.05))
    back = 2.0 * 100_000 * max(1 / decision.bandwidth_Bps, decision.per_byte_s or 0.0)  # type: ignore[operator]
    assert up._waited_s == pytest.approx(max(0.0, 0.3 - back))
    assert line is not None and (line["returned_bytes"], line["returned_s"], line["return_share"]) == (100_000, 0.05, 2.0)


def test_compute_time_holds_the_wait_for_the_update(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Tc is the step less what this direction's level costs: the compute since the last step ended
    plus that step's wait for its update (wire_s - comm_s: the barrier, the PS and the downlink),
    except the first step's, whose update arrives in slow start (`STARTUP_STEPS`)."""
    import netsense.worker.uplink as uplink

    now = [0.0]
    monkeypatch.setattr(uplink.time, "perf_counter", lambda: now[0])
    up, _ = controller()
    link = LinkState(0.0, None, 0.002, 0.002)
    assert STARTUP_STEPS == 1
    up.choose(link)
    up.observe(bytes_sent=S, comm_s=0.2, wire_s=1.2)  # step 0: the first update, 1 s in slow start
    assert up._waited_s == 0.0  # start-up, not the cycle
    now[0] = 0.5
    up.mark_end()
    now[0] = 0.6
    up.choose(link)  # 0.1 s of compute since step 0 ended, no wait
    assert up.loop.compute_s == pytest.approx(0.1)
    up.observe(bytes_sent=S, comm_s=0.2, wire_s=0.5)  # pushed in 0.2 s, the update came 0.3 s later
    now[0] = 1.0
    up.mark_end()
    now[0] = 1.5
    up.choose(link)  # 0.5 s of compute since the step ended
    assert up.loop.compute_s == pytest.approx(0.3 * (0.5 + 0.3) + 0.7 * 0.1)
    up.observe(bytes_sent=S, comm_s=0.2)  # no wire time reported: no wait counted
    assert up._waited_s == 0.0


def test_step_0_is_weighed_on_its_compute_since_the_parameters_arrived_and_not_held(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Step 0 has no compute time: weighed on its push alone the fewest bytes win however long the
    compute. Its compute since the first parameters arrived (`ready`) stands in for that decision
    only (not folded into the EWMA: it may hold the caller's set-up), and the policy's hold is
    released, so the next decision, on a measured compute time, is the law's afresh."""
    import netsense.worker.uplink as uplink

    now = [0.0]
    monkeypatch.setattr(uplink.time, "perf_counter", lambda: now[0])
    up, policy = controller()
    link = LinkState(0.0, 1e8, 0.002, 0.002)
    seen: list[float] = []
    choose = policy.choose
    policy.choose = lambda request: (seen.append(request.compute_s), choose(request))[1]  # type: ignore[method-assign]
    up.ready()
    now[0] = 0.25
    up.choose(link)
    assert seen == [0.25] and up.loop.compute_s is None  # this decision only
    assert policy.hold.level is None  # provisional: nothing committed
    up.observe(bytes_sent=S, comm_s=0.02)
    up.mark_end()
    now[0] = 0.35
    up.choose(link)  # a measured compute time now: an ordinary decision, held as usual
    assert seen[-1] == pytest.approx(0.1) and up.loop.compute_s == pytest.approx(0.1)
    assert policy.hold.level is not None
