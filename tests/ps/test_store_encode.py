"""ParameterStore's downlink encoder: the shadow is bit for bit what workers rebuild from the updates."""

from __future__ import annotations

import torch

from netsense.compression import make_codec
from netsense.ps.store import ParameterStore
from netsense.transport.wire import Push

FP32 = make_codec("fp32")


def _init(store: ParameterStore, params: dict[str, torch.Tensor], optimizer: dict | None = None) -> None:
    store.initialize({k: FP32.encode(v) for k, v in params.items()}, optimizer or {"name": "sgd", "lr": 0.1, "momentum": 0.9})


def _push(store: ParameterStore, worker: str, step: int, grads: dict[str, torch.Tensor], samples: int = 4, total: int | None = None):
    msg = Push(step, samples, total or len(store.params), {k: FP32.encode(v) for k, v in grads.items()})
    return store.push(worker, msg)


def test_lossy_downlink_shadow_is_what_workers_rebuild() -> None:
    store = ParameterStore(downlink_codec="fp16")
    torch.manual_seed(1)
    _init(store, {"w": torch.randn(4, 4)})
    store.join("a")
    replica = store.pull(-1)
    assert replica.full
    r = FP32.decode(replica.tensors["w"])
    for step in range(4):
        _push(store, "a", step, {"w": torch.randn(4, 4)})
        update = store.pull(step)
        assert not update.full and update.base_version == step
        r += make_codec("fp16").decode(update.tensors["w"])
        assert torch.equal(r, store.shadow["w"])  # bit for bit
    torch.testing.assert_close(r, store.params["w"], rtol=1e-2, atol=1e-2)
