"""ParameterStore's checkpoint state: a restored store is the one that was saved, clocks included."""

from __future__ import annotations

import torch

from netsense.compression import make_codec
from netsense.ps.store import ParameterStore
from netsense.transport.wire import Push

FP32 = make_codec("fp32")


def _store(staleness: int, workers: tuple[str, ...] = ("fast", "slow")) -> ParameterStore:
    s = ParameterStore(staleness=staleness)
    s.initialize({"w": FP32.encode(torch.ones(2, 3)), "b": FP32.encode(torch.zeros(3))}, {"name": "sgd", "lr": 0.1})
    for w in workers:
        s.join(w)
    return s


def _push(store: ParameterStore, worker: str, step: int, keys: tuple[str, ...] = ("w", "b"), samples: int = 4, value: float = 1.0):
    grads = {k: FP32.encode(torch.full(tuple(store.params[k].shape), value)) for k in keys}
    return store.push(worker, Push(step, samples, len(store.params), grads))


def test_checkpoint_keeps_the_clocks() -> None:
    store = _store(2)
    _push(store, "fast", 0)
    fresh = ParameterStore(staleness=2)
    fresh.restore(store.state())
    assert fresh.clocks == store.clocks and fresh.version == 1
