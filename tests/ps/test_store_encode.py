"""ParameterStore's downlink encoder: the shadow is bit for bit what workers rebuild from the updates."""

from __future__ import annotations

import torch

from netsense.compression import make_codec
from netsense.ps.store import ParameterStore
from storehelp import init_params as _init, push_grads as _push

FP32 = make_codec("fp32")


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
