"""Model buffers over QUIC: BatchNorm's running statistics are the same on every worker (the PS
averages them), they are in the PS checkpoint, and `netsense export` writes a state_dict that
`model.load_state_dict(torch.load(path))` takes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from netsense.cli import main
from netsense.ps import checkpoint
from netsense.ps.server import ServerSettings
from netsense.worker.optimizer import NetSenseOptimizer

from ..conftest import RunningPS, run_ranks, start_ps, stop_ps

STEPS = 5


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    n = 4 + 2 * rank  # unequal batch sizes: the PS weights the buffers by samples too
    return torch.randn(n, 6, generator=g) + rank, torch.randint(0, 3, (n,), generator=g)  # the ranks' data differ


def _train(
    ps: RunningPS | list[RunningPS], models: list[torch.nn.Module], opts: list[NetSenseOptimizer] | None = None, **kw: object
) -> list[list[torch.Tensor]]:
    """Train both ranks; returns, per rank, the BatchNorm layer's input of every step (`opts`
    collects the optimizers)."""
    seen: list[list[torch.Tensor]] = [[], []]
    for rank, m in enumerate(models):
        m[1].register_forward_pre_hook(lambda mod, args, r=rank: seen[r].append(args[0].detach().clone()))

    def work(rank: int) -> None:
        with NetSenseOptimizer(
            models[rank], connect=[p.connect_settings() for p in (ps if isinstance(ps, list) else [ps])], rank=rank, world_size=2, worker_id=f"w{rank}",
            optimizer={"name": "sgd", "lr": 0.1}, **kw,  # type: ignore[arg-type]
        ) as opt:  # fmt: skip
            if opts is not None:
                opts.append(opt)
            for step in range(STEPS):
                x, y = _batch(step, rank)
                opt.zero_grad()
                torch.nn.functional.cross_entropy(models[rank](x), y).backward()
                opt.step(samples=len(x))

    run_ranks(work)
    return seen


@pytest.fixture
def ckpt_ps(certs, tmp_path: Path):  # type: ignore[no-untyped-def]
    ps = start_ps(certs, ServerSettings(port=0, checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every_steps=1))
    yield ps
    stop_ps(ps)


def test_batchnorm_buffers_agree_and_follow_the_concatenated_batch(ckpt_ps: RunningPS) -> None:
    models = [_model(), _model()]
    seen = _train(ckpt_ps, models)
    bn0, bn1 = models[0][1], models[1][1]
    # Every rank holds the PS's buffers (before: -0.844 on one rank, -0.937 on the other).
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.equal(getattr(bn0, name), getattr(bn1, name)), name
    assert int(bn0.num_batches_tracked) == STEPS
    store = ckpt_ps.server.store
    assert torch.equal(store.state_keys["1.running_mean"], bn0.running_mean)
    assert "1.running_mean" not in store.params  # never optimized
    # The PS's rule: each step, the sample-weighted mean of the workers' updated buffers. For the
    # running mean that is exactly what one process tracks on the concatenated batch.
    m = bn0.momentum
    mean, var = torch.zeros(8), torch.ones(8)
    for step in range(STEPS):
        xs = [seen[r][step] for r in range(2)]
        n = [len(x) for x in xs]
        mean = (1 - m) * mean + m * torch.cat(xs).mean(0)
        var = (1 - m) * var + m * sum(k / sum(n) * x.var(0, unbiased=True) for k, x in zip(n, xs))
    torch.testing.assert_close(bn0.running_mean, mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn0.running_var, var, rtol=1e-5, atol=1e-6)


def test_checkpoint_exports_a_plain_state_dict(ckpt_ps: RunningPS, tmp_path: Path) -> None:
    models = [_model(), _model()]
    _train(ckpt_ps, models)
    ckpt_ps.net.run(ckpt_ps.server.flush_checkpoint())
    ckpt_dir = Path(ckpt_ps.server.settings.checkpoint_dir)  # type: ignore[arg-type]
    state, _ = checkpoint.load_latest(ckpt_dir)  # the newest written: a write still running skips a version
    assert state["version"] >= 1 and "1.running_mean" in state["state"] and state["model"]["1.running_mean"]["buffer"]
    with pytest.raises(Exception):
        torch.load(checkpoint.list_checkpoints(ckpt_dir)[0], weights_only=True)  # a PS checkpoint is not a state_dict
    out = tmp_path / "model.pt"
    assert main(["export", "--checkpoint-dir", str(ckpt_dir), "--out", str(out)]) == 0
    fresh = _model()
    fresh.load_state_dict(torch.load(out, weights_only=True))  # strict: every parameter and buffer
    for name, value in fresh.state_dict().items():
        held = state["params"].get(name, state["state"].get(name))
        assert value.dtype == models[0].state_dict()[name].dtype, name
        assert torch.equal(value, held.to(value.dtype)), name
    if state["version"] == STEPS:  # the last step was checkpointed: the export is the trained model
        for name, value in models[0].state_dict().items():
            assert torch.equal(value, fresh.state_dict()[name]), name


def test_buffers_agree_with_two_shards_and_export_joins_them(certs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    shards = [
        start_ps(certs, ServerSettings(port=0, checkpoint_dir=str(tmp_path / "ckpt" / f"shard-{i}"), checkpoint_every_steps=1))
        for i in range(2)
    ]
    try:
        models = [_model(), _model()]
        _train(shards, models)
        for ps in shards:
            ps.net.run(ps.server.flush_checkpoint())
        assert set(shards[0].server.store.state_keys) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
        assert not shards[1].server.store.state_keys  # every buffer on shard 0
    finally:
        for ps in shards:
            stop_ps(ps)
    assert torch.equal(models[0][1].running_var, models[1][1].running_var)
    out = tmp_path / "model.pt"
    assert main(["export", "--checkpoint-dir", str(tmp_path / "ckpt"), "--out", str(out)]) == 0
    _model().load_state_dict(torch.load(out, weights_only=True))  # both shards' keys, strict


@pytest.mark.parametrize("shards", [1, 2], ids=["one-ps", "two-shards"])
def test_buffers_under_overlap_agree_reach_the_checkpoint_and_equal_the_plain_step(certs, tmp_path: Path, shards: int) -> None:  # type: ignore[no-untyped-def]
    """With overlap (pushes from gradient hooks, keyed pulls) the buffers take the plain step's
    path: pushed with the step's gradients, averaged on the PS, written back into every worker.
    Step 0 pushes after backward (its sample count is not known before), later steps from the hooks."""
    held: dict[bool, tuple[list[torch.nn.Module], dict[str, torch.Tensor], dict[str, torch.Tensor]]] = {}
    for overlap in (False, True, None):  # None: the default, full duplex now that buffers ride with the hooks
        running = [
            start_ps(certs, ServerSettings(port=0, checkpoint_dir=str(tmp_path / f"ckpt-{overlap}" / f"shard-{i}"), checkpoint_every_steps=1))
            for i in range(shards)
        ]
        try:
            models, opts = [_model(), _model()], []
            _train(running, models, opts, overlap=overlap, bucket_bytes=64, overlap_bucket_bytes=64)
            if overlap is None:
                assert [o.duplex_off for o in opts] == [None, None] and all(o.overlap for o in opts)
            for ps in running:
                ps.net.run(ps.server.flush_checkpoint())
            params = {k: v.clone() for ps in running for k, v in ps.server.store.params.items()}
            state, _ = checkpoint.load_latest(tmp_path / f"ckpt-{overlap}" / "shard-0")
        finally:
            for ps in running:
                stop_ps(ps)
        assert state["version"] == STEPS
        held[overlap] = (models, params, dict(state["state"]))
    plain_models, plain_params, _ = held[False]
    for models, params, ckpt_state in (held[True], held[None]):
        _check_like_the_plain_step(models, params, ckpt_state, plain_models, plain_params)


def _check_like_the_plain_step(  # type: ignore[no-untyped-def]
    models, params, ckpt_state, plain_models, plain_params
) -> None:
    bn0, bn1, plain = models[0][1], models[1][1], plain_models[0][1]
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.equal(getattr(bn0, name), getattr(bn1, name)), name  # every rank holds the PS's
        torch.testing.assert_close(getattr(bn0, name), getattr(plain, name), rtol=1e-6, atol=1e-7)  # as without overlap
        assert torch.equal(ckpt_state[f"1.{name}"].to(getattr(bn0, name).dtype), getattr(bn0, name)), name  # checkpointed
    assert int(bn0.num_batches_tracked) == STEPS
    for key, value in plain_params.items():
        torch.testing.assert_close(params[key], value, rtol=1e-5, atol=1e-6)
