"""Thread crossings of a step (worker/exchange.py): push + pull, with any retry, is one crossing;
an adaptive policy's choice adds one, to read the path before the gradients are encoded; a fixed
policy's takes the path as the last step left it (no crossing)."""

from __future__ import annotations

from typing import Any

import torch

from netsense.worker.optimizer import NetSenseOptimizer


def _count_crossings(opt: NetSenseOptimizer) -> list[Any]:
    """Every coroutine handed to the network thread (`run` goes through `submit`)."""
    net = opt._exchange.net
    crossings: list[Any] = []
    submit = net.submit

    def counting(coro: Any) -> Any:
        crossings.append(coro.__qualname__)
        return submit(coro)

    net.submit = counting  # type: ignore[method-assign]
    return crossings


def test_a_step_crosses_to_the_network_thread_once_plus_once_for_a_policy(ps) -> None:  # type: ignore[no-untyped-def]
    model = torch.nn.Linear(8, 4)
    with NetSenseOptimizer(model, connect=ps.connect_settings(), worker_id="w0", bucket_bytes=64) as opt:
        crossings = _count_crossings(opt)
        for step in range(2):
            model(torch.randn(3, 8)).sum().backward()
            opt.step(samples=3, codec="fp32")
            assert crossings == ["Exchange._step"], f"step {step}"  # every bucket of every shard, one crossing
            crossings.clear()
        model(torch.randn(3, 8)).sum().backward()
        opt.step(samples=3)  # the (fixed) policy chooses, on the path the last step left
        assert crossings == ["Exchange._step"]
        crossings.clear()
        opt.step(samples=3)
        assert crossings == ["Exchange._step"]
        assert opt.version == 4
        decision, link = opt.uplink.last  # type: ignore[misc]
        assert decision.spec == "fp32" and link.time_s > 0


class _SlowPush:
    """A step's future whose push is still running whenever it is waited for with a timeout (the
    redecide time), however fast the loopback PS answered: the state a redecide is for."""

    def __init__(self, future: Any) -> None:
        self._future = future

    def result(self, timeout: float | None = None) -> Any:
        if timeout is not None:
            raise TimeoutError
        return self._future.result()


def _still_running_at_redecide(opt: NetSenseOptimizer) -> None:
    start_step = opt._exchange.start_step
    opt._exchange.start_step = lambda *a, **k: _SlowPush(start_step(*a, **k))  # type: ignore[method-assign]


def test_an_adaptive_policy_reads_the_path_the_last_step_left(ps) -> None:  # type: ignore[no-untyped-def]
    """One crossing a step: the step's coroutine reads the path for the next choice; the first
    step, with no step before it, reads it by a crossing of its own."""
    model = torch.nn.Linear(8, 4)
    with NetSenseOptimizer(model, connect=ps.connect_settings(), worker_id="w0", policy="netsense") as opt:
        crossings = _count_crossings(opt)
        for step in range(3):
            model(torch.randn(3, 8)).sum().backward()
            opt.step(samples=3)
            reads = ["Exchange._read_link"] if step == 0 else []
            assert crossings == [*reads, "Exchange._step"], f"step {step}"
            crossings.clear()
        opt._exchange.probe(1000)  # filler moves the path: the snapshot before it is dropped
        crossings.clear()
        model(torch.randn(3, 8)).sum().backward()
        opt.step(samples=3)
        assert crossings == ["Exchange._read_link", "Exchange._step"]


def test_overlap_crosses_once_per_bucket_and_once_for_the_step(ps) -> None:  # type: ignore[no-untyped-def]
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    with NetSenseOptimizer(model, connect=ps.connect_settings(), worker_id="w0", overlap=True, overlap_bucket_bytes=1 << 20) as opt:
        crossings = _count_crossings(opt)
        for step in range(3):
            opt.zero_grad(samples=3)
            model(torch.randn(3, 8)).sum().backward()
            stats = opt.step(samples=3)
            reads = ["Exchange._read_link"] if step == 0 else []  # the first step has no path from a step before
            assert crossings == [*reads, "Exchange._push_bucket", "Exchange._step"], f"step {step}"
            assert stats.early_buckets == 1
            crossings.clear()


def test_a_second_backward_before_step_is_refused_with_overlap(ps) -> None:  # type: ignore[no-untyped-def]
    """Gradient accumulation cannot overlap: the first backward's gradients are already pushed.
    Said at the second backward, instead of a duplicate-key refusal by the PS."""
    import pytest

    from netsense.errors import ConfigError

    model = torch.nn.Linear(8, 4)
    with NetSenseOptimizer(model, connect=ps.connect_settings(), worker_id="w0", overlap=True) as opt:
        opt.zero_grad(samples=3)
        model(torch.randn(3, 8)).sum().backward()
        with pytest.raises(ConfigError, match="--no-overlap"):
            model(torch.randn(3, 8)).sum().backward()


def test_a_fixed_policy_never_crosses_to_redecide_a_slow_push(ps, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every push is "slow" here (redecided at once); a fixed policy cannot change its level, so
    its step does not cross to ask (it did, once per slow push), while an adaptive one does."""
    import netsense.worker.optimizer as optimizer_module

    monkeypatch.setattr(optimizer_module, "redecide_after", lambda decision: 0.0)
    model = torch.nn.Linear(8, 4)
    for policy, asks in (("fp16", False), ("netsense", True)):
        with NetSenseOptimizer(model, connect=ps.connect_settings(), worker_id=f"w-{policy}", policy=policy) as opt:
            _still_running_at_redecide(opt)
            crossings = _count_crossings(opt)
            for _ in range(3):
                model(torch.randn(3, 8)).sum().backward()
                opt.step(samples=3)
            assert ("Exchange._redecide" in crossings) is asks, (policy, crossings)


def test_a_steps_update_return_is_every_shards_bytes_in_the_slowest_shards_time() -> None:
    """`StepResult.delivered`: the shards' reports combined (bytes summed, the slowest time), or
    None when one shard has none this step (a partial figure would price the whole update)."""
    from netsense.worker.exchange import _Tally

    tally = _Tally([0.0] * 3, [0] * 3, [(1000, 0.02), (3000, 0.05), (500, 0.01)])
    assert tally.delivery() == (4500, 0.05)
    tally.delivered[1] = None
    assert tally.delivery() is None
    assert _Tally([0.0], [0], [None]).delivery() is None
