"""Store builders and pushes the tests/ps modules share (one copy each, not one per module)."""

from __future__ import annotations

import pytest
import torch

from netsense.compression import make_codec
from netsense.ps.store import ParameterStore
from netsense.transport.wire import Push

FP32 = make_codec("fp32")

# A store of two keys and workers a, b; pushes of given gradients (core, sync, encode tests).


def init_params(store: ParameterStore, params: dict[str, torch.Tensor], optimizer: dict | None = None) -> None:
    store.initialize({k: FP32.encode(v) for k, v in params.items()}, optimizer or {"name": "sgd", "lr": 0.1, "momentum": 0.9})


def push_grads(store: ParameterStore, worker: str, step: int, grads: dict[str, torch.Tensor], samples: int = 4, total: int | None = None):
    msg = Push(step, samples, total or len(store.params), {k: FP32.encode(v) for k, v in grads.items()})
    return store.push(worker, msg)


@pytest.fixture
def store() -> ParameterStore:
    s = ParameterStore()
    init_params(s, {"w": torch.ones(2, 3), "b": torch.zeros(3)})
    s.join("a")
    s.join("b")
    return s


# A two-worker store with a downlink codec, and each step's deterministic gradients (store, pipeline tests).


def two_worker_store(downlink: str = "fp16", optimizer: dict | None = None, workers: tuple[str, ...] = ("w0", "w1")) -> ParameterStore:
    torch.manual_seed(0)
    s = ParameterStore(downlink_codec=downlink)
    params = {"a": torch.randn(4, 3), "b": torch.randn(5), "c": torch.randn(2, 2)}
    s.initialize({k: FP32.encode(v) for k, v in params.items()}, optimizer or {"name": "sgd", "lr": 0.1, "momentum": 0.9})
    for w in workers:
        s.join(w)
    return s


def step_grads(step: int, worker: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(10 * step + worker)
    return {"a": torch.randn(4, 3, generator=g), "b": torch.randn(5, generator=g), "c": torch.randn(2, 2, generator=g)}


def push_keys(s: ParameterStore, worker: str, step: int, grads: dict[str, torch.Tensor], keys: tuple[str, ...], samples: int = 4):
    return s.push(worker, Push(step, samples, len(s.params), {k: FP32.encode(grads[k]) for k in keys}))


# An SSP store of workers fast and slow, and constant-gradient pushes (ssp, state tests).


def ssp_store(staleness: int, workers: tuple[str, ...] = ("fast", "slow")) -> ParameterStore:
    s = ParameterStore(staleness=staleness)
    s.initialize({"w": FP32.encode(torch.ones(2, 3)), "b": FP32.encode(torch.zeros(3))}, {"name": "sgd", "lr": 0.1})
    for w in workers:
        s.join(w)
    return s


def push_ssp(store: ParameterStore, worker: str, step: int, keys: tuple[str, ...] = ("w", "b"), samples: int = 4, value: float = 1.0):
    grads = {k: FP32.encode(torch.full(tuple(store.params[k].shape), value)) for k in keys}
    return store.push(worker, Push(step, samples, len(store.params), grads))
