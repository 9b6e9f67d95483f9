"""Two workers over QUIC follow single-process training on the concatenated batches exactly."""

from __future__ import annotations

import threading

import pytest
import torch

from netsense.worker.optimizer import NetSenseOptimizer

from ..conftest import RunningPS


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    n = 4 + rank  # unequal batch sizes: the PS must weight by samples
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


@pytest.mark.parametrize(
    "optimizer",
    [{"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}, {"name": "adam", "lr": 0.01}],
    ids=["sgd-momentum", "adam"],
)
def test_two_workers_match_single_process(ps: RunningPS, optimizer: dict) -> None:
    steps = 6
    models = [_model(), _model()]
    with torch.no_grad():  # rank 1 starts different: rank 0's parameters must win
        for p in models[1].parameters():
            p.add_(1.0)
    opts: list[NetSenseOptimizer | None] = [None, None]
    errors: list[BaseException] = []

    def work(rank: int) -> None:
        try:
            opt = opts[rank] = NetSenseOptimizer(
                models[rank], connect=ps.connect_settings(), rank=rank, world_size=2, worker_id=f"w{rank}", optimizer=optimizer
            )
            for step in range(steps):
                x, y = _batch(step, rank)
                opt.zero_grad()
                torch.nn.functional.cross_entropy(models[rank](x), y).backward()
                opt.step(samples=len(x))
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    # rank 0 first so it initializes; rank 1 joins before the first step completes
    threads[0].start()
    threads[1].start()
    for t in threads:
        t.join(60)
    for o in opts:
        if o is not None:
            o.close()
    assert not errors, errors

    ref = _model()
    ref_opt = (
        torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
        if optimizer["name"] == "sgd"
        else torch.optim.Adam(ref.parameters(), lr=0.01)
    )
    for step in range(steps):
        (x0, y0), (x1, y1) = _batch(step, 0), _batch(step, 1)
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(torch.cat([x0, x1])), torch.cat([y0, y1])).backward()
        ref_opt.step()

    store = ps.server.store
    assert store.version == steps
    names = [n for n, _ in ref.named_parameters()]
    for name, p in ref.named_parameters():
        torch.testing.assert_close(store.params[name], p.detach(), rtol=1e-5, atol=1e-6)
    for m in models:  # every replica equals the PS after the last pull
        for name, p in zip(names, m.parameters()):
            assert torch.equal(p.detach(), store.params[name])
