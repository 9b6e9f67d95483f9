"""Thread crossings of a step (worker/exchange.py): push + pull, with any retry, is one crossing;
a policy's choice adds one, to read the path before the gradients are encoded."""

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
        opt.step(samples=3)  # the (fixed) policy chooses: the path is read first
        assert crossings == ["Exchange._read_link", "Exchange._step"]
        assert opt.version == 3
