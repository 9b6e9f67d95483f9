"""Two workers over two PS shards follow single-process training exactly; each shard holds only its keys."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from netsense.transport.sharding import assign_shards
from netsense.worker.layout import shard_layout, shard_sizes
from netsense.worker.optimizer import NetSenseOptimizer

from ..conftest import RunningPS, start_ps, stop_ps


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    n = 4 + rank
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


@pytest.fixture
def shards(certs) -> Iterator[list[RunningPS]]:  # type: ignore[no-untyped-def]
    running = [start_ps(certs), start_ps(certs)]
    yield running
    for ps in running:
        stop_ps(ps)


def test_two_shards_match_single_process(shards: list[RunningPS]) -> None:
    steps, optimizer = 5, {"name": "sgd", "lr": 0.1, "momentum": 0.9}
    models = [_model(), _model()]
    with torch.no_grad():
        for p in models[1].parameters():
            p.add_(1.0)
    opts: list[NetSenseOptimizer | None] = [None, None]
    errors: list[BaseException] = []
    connect = [ps.connect_settings() for ps in shards]

    def work(rank: int) -> None:
        try:
            opt = opts[rank] = NetSenseOptimizer(
                models[rank], connect=connect, rank=rank, world_size=2, worker_id=f"w{rank}", optimizer=optimizer,
                bucket_bytes=256,  # several buckets per shard
            )  # fmt: skip
            for step in range(steps):
                x, y = _batch(step, rank)
                opt.zero_grad()
                torch.nn.functional.cross_entropy(models[rank](x), y).backward()
                opt.step(samples=len(x))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for o in opts:
        if o is not None:
            o.close()
    assert not errors, errors

    ref = _model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        (x0, y0), (x1, y1) = _batch(step, 0), _batch(step, 1)
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(torch.cat([x0, x1])), torch.cat([y0, y1])).backward()
        ref_opt.step()

    owner = assign_shards(shard_sizes(shard_layout(ref, 2)), 2)
    for i, ps in enumerate(shards):
        store = ps.server.store
        assert store.version == steps
        assert set(store.params) == {k for k, s in owner.items() if s == i}  # only its keys
    params = {k: v for ps in shards for k, v in ps.server.store.params.items()}
    for name, p in ref.named_parameters():
        torch.testing.assert_close(params[name], p.detach(), rtol=1e-5, atol=1e-6)
    for m in models:
        for name, p in m.named_parameters():
            assert torch.equal(p.detach(), params[name])
    assert opts[0] is not None and opts[0].versions == [steps, steps]


def test_more_shards_than_keys_is_a_config_error(shards: list[RunningPS]) -> None:
    from netsense.errors import ConfigError

    model = torch.nn.Linear(2, 1, bias=False)  # one key
    with pytest.raises(ConfigError, match="2 PS shards for 1 keys"):
        NetSenseOptimizer(model, connect=[ps.connect_settings() for ps in shards])


def test_adaptive_policy_reads_every_shard(shards: list[RunningPS]) -> None:
    model = _model()
    with NetSenseOptimizer(model, connect=[ps.connect_settings() for ps in shards], policy="netsense", worker_id="p0") as opt:
        for step in range(4):
            x, y = _batch(step, 0)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step(samples=len(x))
        assert opt.version == 4 and len(opt.uplink._shard_readers) == 2
        s = opt.last  # the step-time breakdown
        assert s.compute_s > 0 and s.encode_s > 0 and s.decode_s > 0 and 0 < s.push_s <= s.wire_s
        assert s.wait_s == pytest.approx(s.wire_s - s.push_s)
