"""ParameterStore, the public face: what it refuses before routing a call (a checkpoint mid-step, unknown
keys, keyed pulls on an async store)."""

from __future__ import annotations

import pytest
import torch

from netsense.compression import make_codec
from netsense.errors import ProtocolError
from netsense.ps.store import ParameterStore
from netsense.transport.wire import Push

FP32 = make_codec("fp32")


def _store(downlink: str = "fp16", optimizer: dict | None = None, workers: tuple[str, ...] = ("w0", "w1")) -> ParameterStore:
    torch.manual_seed(0)
    s = ParameterStore(downlink_codec=downlink)
    params = {"a": torch.randn(4, 3), "b": torch.randn(5), "c": torch.randn(2, 2)}
    s.initialize({k: FP32.encode(v) for k, v in params.items()}, optimizer or {"name": "sgd", "lr": 0.1, "momentum": 0.9})
    for w in workers:
        s.join(w)
    return s


def _grads(step: int, worker: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(10 * step + worker)
    return {"a": torch.randn(4, 3, generator=g), "b": torch.randn(5, generator=g), "c": torch.randn(2, 2, generator=g)}


def _push(s: ParameterStore, worker: str, step: int, grads: dict[str, torch.Tensor], keys: tuple[str, ...], samples: int = 4):
    return s.push(worker, Push(step, samples, len(s.params), {k: FP32.encode(grads[k]) for k in keys}))


def test_no_checkpoint_mid_step_and_async_stores_refuse_keyed_pulls() -> None:
    s = _store()
    s.want(["a"], 0)
    _push(s, "w0", 0, _grads(0, 0), ("a",))
    _push(s, "w1", 0, _grads(0, 1), ("a",))
    with pytest.raises(ProtocolError, match="mid-step"):
        s.state()
    with pytest.raises(ProtocolError, match="unknown keys"):
        s.want(["nope"], 0)
    a = ParameterStore(staleness=1)
    a.initialize({"a": FP32.encode(torch.zeros(2))}, {"name": "sgd", "lr": 0.1})
    with pytest.raises(ProtocolError, match="synchronous"):
        a.want(["a"], 0)
