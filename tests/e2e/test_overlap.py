"""Overlap (pushes from gradient hooks during backward) trains exactly like the plain sync step."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import torch

from netsense.worker.optimizer import NetSenseOptimizer

from ..conftest import RunningPS, start_ps, stop_ps


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    n = 4 + rank  # unequal batch sizes: the early pushes must carry the right sample count
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


@pytest.fixture(params=[1, 2], ids=["one-ps", "two-shards"])
def servers(request, certs) -> Iterator[list[RunningPS]]:  # type: ignore[no-untyped-def]
    running = [start_ps(certs) for _ in range(request.param)]
    yield running
    for ps in running:
        stop_ps(ps)


@pytest.mark.parametrize("hint", [False, True], ids=["samples-from-last-step", "zero-grad-samples"])
def test_overlap_matches_single_process(servers: list[RunningPS], hint: bool) -> None:
    steps, optimizer = 6, {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}
    models = [_model(), _model()]
    opts: list[NetSenseOptimizer | None] = [None, None]
    errors: list[BaseException] = []
    early: list[int] = []

    def work(rank: int) -> None:
        try:
            opt = opts[rank] = NetSenseOptimizer(
                models[rank], connect=[ps.connect_settings() for ps in servers], rank=rank, world_size=2,
                worker_id=f"w{rank}", optimizer=optimizer, bucket_bytes=256, overlap=True, overlap_bucket_bytes=256,
            )  # fmt: skip
            for step in range(steps):
                x, y = _batch(step, rank)
                opt.zero_grad(samples=len(x) if hint else None)
                torch.nn.functional.cross_entropy(models[rank](x), y).backward()
                early.append(opt.step(samples=len(x)).early_buckets)
        except BaseException as exc:  # surfaced in the main thread
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
    # Without a hint the first step does not know its sample count and pushes after backward.
    assert all(n > 0 for n in early[(0 if hint else 2) :]) and (hint or early[:2] == [0, 0])

    ref = _model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    for step in range(steps):
        (x0, y0), (x1, y1) = _batch(step, 0), _batch(step, 1)
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(torch.cat([x0, x1])), torch.cat([y0, y1])).backward()
        ref_opt.step()
    params = {k: v for ps in servers for k, v in ps.server.store.params.items()}
    assert all(ps.server.store.version == steps for ps in servers)
    for name, p in ref.named_parameters():
        torch.testing.assert_close(params[name], p.detach(), rtol=1e-5, atol=1e-6)
    for m in models:  # every replica equals the PS after the last pull
        for name, p in m.named_parameters():
            assert torch.equal(p.detach(), params[name])


class _WithUnused(torch.nn.Module):
    """A model whose `unused` parameter gets no gradient: its key is pushed only by `step()`."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
        self.unused = torch.nn.Parameter(torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _wait(condition, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"not within 30 s: {what}"
        time.sleep(0.01)


def test_early_keys_come_down_before_the_last_push(servers: list[RunningPS]) -> None:
    """Pipelined pull: the PS applies and sends a bucket's keys while another key of the step has not
    been pushed at all (it has no gradient, so only `step()` pushes it); the step completes after."""
    model = _WithUnused()
    stores = [ps.server.store for ps in servers]
    with NetSenseOptimizer(
        model, connect=[ps.connect_settings() for ps in servers], optimizer={"name": "sgd", "lr": 0.1},
        overlap=True, overlap_bucket_bytes=256,
    ) as opt:  # fmt: skip
        for step in range(3):
            x, y = _batch(step, 0)
            opt.zero_grad(samples=len(x))
            torch.nn.functional.cross_entropy(model(x), y).backward()
            early = opt._backward
            assert early is not None
            owner = opt.owner["unused"]  # other shards may finish their step before `step()`
            futures = early.futures[owner]
            assert futures, "nothing was pushed during backward"
            _wait(lambda: all(f.done() for f in futures), "the replies of the buckets pushed during backward")
            parts = [p for f in futures for p in f.result().parts]
            assert {p.version for p in parts} == {step + 1} and all(p.full or p.base_version == step for p in parts)
            assert stores[owner].applied_keys == sum(len(p.tensors) + len(p.sums) for p in parts) > 0
            assert stores[owner].version == step  # the step itself waits for `unused`
            stats = opt.step(samples=len(x))
            assert stats.version == step + 1 and all(s.version == step + 1 and s.applied_keys == 0 for s in stores)
        params = {k: v for s in stores for k, v in s.params.items()}
        for name, p in model.named_parameters():
            assert torch.equal(p.detach(), params[name])


def test_a_changed_batch_size_without_a_hint_is_refused(servers: list[RunningPS]) -> None:
    from netsense.errors import ConfigError

    model = _model()
    with NetSenseOptimizer(model, connect=[ps.connect_settings() for ps in servers], overlap=True, bucket_bytes=1 << 20) as opt:
        for n in (4, 4):
            opt.zero_grad()
            model(torch.randn(n, 6)).sum().backward()
            opt.step(samples=n)
        opt.zero_grad()
        model(torch.randn(3, 6)).sum().backward()
        with pytest.raises(ConfigError, match="zero_grad\\(samples=n\\)"):
            opt.step(samples=3)


@pytest.mark.parametrize("command", ["worker", "launch"])
def test_overlap_flag_reaches_the_train_settings(command: str) -> None:
    from netsense.cli import build_parser
    from netsense.cli.flags import resolve_config

    assert resolve_config(build_parser().parse_args([command])).train.overlap is None  # full duplex where exact
    assert resolve_config(build_parser().parse_args([command, "--overlap"])).train.overlap is True
    assert resolve_config(build_parser().parse_args([command, "--no-overlap"])).train.overlap is False
