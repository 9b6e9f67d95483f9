"""Stock torch LR schedulers, param groups, GradScaler and PS-side clipping through NetSense follow
single-process training on the concatenated batches, as exactly as tests/e2e/test_sync_exact.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from netsense.worker.optimizer import NetSenseOptimizer

from ..conftest import RunningPS, run_ranks, start_ps, stop_ps

Sched = Callable[[torch.optim.Optimizer], Any]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    n = 4 + rank  # unequal batch sizes: the PS weights by samples
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def _groups(model: torch.nn.Module) -> list[dict[str, Any]]:
    """Two groups: the first layer at the default lr, the last at its own lr and weight decay."""
    return [{"params": list(model[0].parameters())}, {"params": list(model[2].parameters()), "lr": 0.02, "weight_decay": 1e-2}]


def _train(
    connect: Any, world: int, steps: int, optimizer: dict[str, Any], sched: Sched | None, *,
    groups: bool = False, amp: bool = False, poison: tuple[int, int] | None = None, **kw: Any,
) -> tuple[list[torch.nn.Module], list[NetSenseOptimizer]]:  # fmt: skip
    """`world` workers on threads; `poison` = (rank, step) whose gradient gets an Inf (AMP only)."""
    models = [_model() for _ in range(world)]
    opts: list[NetSenseOptimizer | None] = [None] * world

    def work(rank: int) -> None:
        m = models[rank]
        opt = opts[rank] = NetSenseOptimizer(
            m, connect=connect, rank=rank, world_size=world, worker_id=f"w{rank}", optimizer=optimizer,
            params=_groups(m) if groups else None, **kw,
        )  # fmt: skip
        scheduler = sched(opt) if sched is not None else None
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if amp else None
        for step in range(steps):
            x, y = _batch(step, rank)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(x), y)
            if scaler is None:
                loss.backward()
                opt.step(samples=len(x))
            else:
                scaler.scale(loss).backward()
                if poison == (rank, step):
                    m[0].weight.grad[0, 0] = float("inf")
                scaler.step(opt, samples=len(x))
                scaler.update()
            if scheduler is not None:
                scheduler.step()

    try:
        run_ranks(work, world, timeout_s=90)
    finally:
        for o in opts:
            if o is not None:
                o.close()
    return models, [o for o in opts if o is not None]


def _reference(
    world: int, steps: int, make_opt: Callable[[torch.nn.Module], torch.optim.Optimizer], sched: Sched | None, *,
    clip: float = 0.0, skip: tuple[int, int] | None = None,
) -> torch.nn.Module:  # fmt: skip
    """Single-process training on the concatenated batches; `skip` = (rank, step) left out."""
    ref = _model()
    opt = make_opt(ref)
    scheduler = sched(opt) if sched is not None else None
    for step in range(steps):
        batches = [_batch(step, r) for r in range(world) if (r, step) != skip]
        opt.zero_grad()
        x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
        opt.step()
        if scheduler is not None:
            scheduler.step()
    return ref


def _assert_matches(params: dict[str, torch.Tensor], ref: torch.nn.Module, models: list[torch.nn.Module]) -> None:
    for name, p in ref.named_parameters():
        torch.testing.assert_close(params[name], p.detach(), rtol=1e-5, atol=1e-6)
    for m in models:  # every replica equals the PS after the last pull
        for name, p in m.named_parameters():
            assert torch.equal(p.detach(), params[name])


def _steplr(opt: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)


SGD = {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}


@pytest.mark.parametrize("world", [1, 2])
def test_steplr_matches_single_process(ps: RunningPS, world: int) -> None:
    steps = 6
    models, opts = _train(ps.connect_settings(), world, steps, SGD, _steplr)
    ref = _reference(world, steps, lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3), _steplr)
    assert ps.server.store.version == steps
    _assert_matches(ps.server.store.params, ref, models)
    assert opts[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)
    assert ps.server.store.optimizer_settings.lr == 0.1  # a step's lr applies to that step only


def test_onecycle_adam_cycles_lr_and_betas(ps: RunningPS) -> None:
    """OneCycleLR changes lr and (cycle_momentum) Adam's beta1 every step: both must reach the PS."""
    steps = 8

    def onecycle(opt: torch.optim.Optimizer) -> Any:
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=steps)

    adam = {"name": "adam", "lr": 0.01}
    models, opts = _train(ps.connect_settings(), 2, steps, adam, onecycle)
    ref = _reference(2, steps, lambda m: torch.optim.Adam(m.parameters(), lr=0.01), onecycle)
    _assert_matches(ps.server.store.params, ref, models)
    assert opts[0].param_groups[0]["betas"][0] != 0.9  # the schedule moved beta1


@pytest.fixture
def shards(certs) -> Iterator[list[RunningPS]]:  # type: ignore[no-untyped-def]
    running = [start_ps(certs), start_ps(certs)]
    yield running
    for ps in running:
        stop_ps(ps)


def test_param_groups_with_their_own_lr_over_two_shards(shards: list[RunningPS]) -> None:
    steps = 5
    models, _ = _train([s.connect_settings() for s in shards], 2, steps, SGD, _steplr, groups=True)

    def make(m: torch.nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(_groups(m), lr=0.1, momentum=0.9, weight_decay=1e-3)

    ref = _reference(2, steps, make, _steplr)
    params = {k: v for s in shards for k, v in s.server.store.params.items()}
    assert all(s.server.store.params for s in shards) and len(params) == 4
    _assert_matches(params, ref, models)


def test_gradscaler_with_cpu_autocast(ps: RunningPS) -> None:
    """AMP: the scaler's gradients are unscaled on our param groups exactly as a stock optimizer's."""
    steps = 4
    models = [_model()]
    opt = NetSenseOptimizer(models[0], connect=ps.connect_settings(), optimizer=SGD)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    ref = _model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    try:
        for step in range(steps):
            x, y = _batch(step, 0)
            for m, o, s, kw in ((models[0], opt, scaler, {"samples": len(x)}), (ref, ref_opt, ref_scaler, {})):
                o.zero_grad()
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = torch.nn.functional.cross_entropy(m(x), y)
                s.scale(loss).backward()
                s.step(o, **kw)
                s.update()
    finally:
        opt.close()
    assert opt.last.skipped is False and scaler.get_scale() == ref_scaler.get_scale()
    _assert_matches(ps.server.store.params, ref, models)


def test_gradscaler_inf_sits_the_step_out(ps: RunningPS) -> None:
    """Rank 1's Inf at step 1: it sends a skip PUSH, the barrier still completes, the update is
    rank 0's gradient alone; rank 1's scaler backs off."""
    steps = 3
    models, opts = _train(ps.connect_settings(), 2, steps, SGD, None, amp=True, poison=(1, 1))
    ref = _reference(2, steps, lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3), None, skip=(1, 1))
    assert ps.server.store.version == steps
    _assert_matches(ps.server.store.params, ref, models)


def test_every_worker_skipping_leaves_the_model_as_it_was(ps: RunningPS) -> None:
    models, opts = _train(ps.connect_settings(), 1, 2, SGD, None, amp=True, poison=(0, 1))
    ref = _reference(1, 1, lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3), None)
    assert ps.server.store.version == 2 and opts[0].last.skipped
    _assert_matches(ps.server.store.params, ref, models)


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_clip_grad_norm_on_the_aggregated_gradient(ps: RunningPS, overlap: bool) -> None:
    """``clip_grad_norm`` clips the mean gradient of the step on the PS, not each worker's; with
    overlap the PS applies the step whole (the norm needs every key), still exact."""
    steps, clip = 4, 0.05
    models, _ = _train(ps.connect_settings(), 2, steps, {**SGD, "clip_grad_norm": clip}, _steplr, overlap=overlap)
    ref = _reference(2, steps, lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3), _steplr, clip=clip)
    _assert_matches(ps.server.store.params, ref, models)
    unclipped = _reference(2, steps, lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3), _steplr)
    assert not torch.allclose(unclipped[0].weight, ref[0].weight)  # the clip was active
