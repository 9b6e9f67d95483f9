"""Workers over QUIC against gradient-domain PS shards: every replica runs the PS's optimizer on the
step's gradient (here forwarded: the other worker's push added to its own) and equals the PS's
parameters bit for bit, with a learning-rate schedule, BatchNorm buffers, keyed pulls (overlap)
and a worker that rejoins mid-run."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from netsense.ps.server import ServerSettings
from netsense.worker.optimizer import NetSenseOptimizer

from ..conftest import RunningPS, run_ranks, start_ps, stop_ps


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.BatchNorm1d(16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 12, generator=g), torch.randint(0, 3, (8,), generator=g)


@pytest.fixture
def shards(certs) -> list[RunningPS]:  # type: ignore[no-untyped-def]
    running = [start_ps(certs, ServerSettings(port=0, downlink_domain="gradient")) for _ in range(2)]
    yield running
    for ps in running:
        stop_ps(ps)


def _train(shards: list[RunningPS], models: list[torch.nn.Module], steps: range, overlap: bool, done: list[NetSenseOptimizer]) -> None:
    def work(rank: int) -> None:
        opt = NetSenseOptimizer(
            models[rank], connect=[ps.connect_settings() for ps in shards], rank=rank, world_size=2, worker_id=f"w{rank}",
            optimizer={"name": "sgd", "lr": 0.2, "momentum": 0.9}, codec="powersgd:2", overlap=overlap,
        )  # fmt: skip
        done.append(opt)
        for step in steps:
            for group in opt.param_groups:  # a step schedule, as StepLR(step_size=2, gamma=0.5) sets it
                group["lr"] = 0.2 * 0.5 ** (step // 2)
            x, y = _batch(step, rank)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(models[rank](x), y).backward()
            opt.step(samples=len(x))

    run_ranks(work, timeout_s=90)


def _assert_replicas_equal(shards: list[RunningPS], models: list[torch.nn.Module]) -> None:
    held: dict[str, torch.Tensor] = {}
    for ps in shards:
        held.update(ps.call(lambda ps=ps: {k: v.clone() for k, v in {**ps.server.store.params, **ps.server.store.state_keys}.items()}))
    for m in models:
        for name, value in {**dict(m.named_parameters()), **dict(m.named_buffers())}.items():
            assert torch.equal(value.detach().to(held[name].dtype), held[name]), name


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_replicas_run_the_ps_optimizer_bit_for_bit(shards: list[RunningPS], overlap: bool) -> None:
    models = [_model(), _model()]
    opts: list[NetSenseOptimizer] = []
    _train(shards, models, range(5), overlap, opts)
    for o in opts:
        o.close()
    # Two pushers a key: each worker is sent the other's push, and the level is compressed once.
    assert all(o._replica.forwarded for o in opts)
    assert all(o.uplink.policy.compressions == 1 and o.uplink.policy.passes == 2 for o in opts)
    assert [ps.server.store.version for ps in shards] == [5, 5]
    assert all(ps.server.downlink is None for ps in shards)  # no downlink policy: each key at its push's codec
    _assert_replicas_equal(shards, models)
    with torch.no_grad():
        loss: Callable[[torch.nn.Module], float] = lambda m: float(torch.nn.functional.cross_entropy(m(_batch(0, 0)[0]), _batch(0, 0)[1]))
        assert loss(models[0]) < loss(_model())  # it trained


def test_a_rejoining_worker_gets_the_optimizer_state(shards: list[RunningPS]) -> None:
    models = [_model(), _model()]
    opts: list[NetSenseOptimizer] = []
    _train(shards, models, range(3), False, opts)
    for o in opts:
        o.close()
    fresh = [_model(), _model()]  # new processes: nothing but what the PS sends
    _train(shards, fresh, range(3, 6), False, opts)
    for o in opts[2:]:
        o.close()
    assert [ps.server.store.version for ps in shards] == [6, 6]
    _assert_replicas_equal(shards, fresh)


def test_each_worker_learns_where_the_others_policy_is_heading(shards: list[RunningPS]) -> None:
    """`Push.intent` to `Params.intents` over QUIC: after a few steps each worker's netsense policy
    holds the other's intent of the last step, a spec of its ladder (netsense's anchor)."""
    models = [_model(), _model()]
    done: list[NetSenseOptimizer] = []
    said: dict[int, list[str | None]] = {0: [], 1: []}

    def work(rank: int) -> None:
        opt = NetSenseOptimizer(
            models[rank], connect=[ps.connect_settings() for ps in shards], rank=rank, world_size=2, worker_id=f"w{rank}",
            optimizer={"name": "sgd", "lr": 0.1}, policy="netsense",
        )  # fmt: skip
        done.append(opt)
        for step in range(6):
            x, y = _batch(step, rank)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(models[rank](x), y).backward()
            opt.step(samples=len(x))
            said[rank].append(opt.uplink.policy.intent())

    try:
        run_ranks(work, timeout_s=90)
        for rank, opt in enumerate(sorted(done, key=lambda o: o.rank)):
            heard = opt.uplink.policy.step_intents
            assert len(heard) == 1 and heard[0] in opt.uplink.policy.ladder.specs, heard
            assert heard[0] == said[1 - rank][-2], (heard, said)  # the other's, as it pushed the last step
    finally:
        for opt in done:
            opt.close()
