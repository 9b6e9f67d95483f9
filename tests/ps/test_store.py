"""ParameterStore, the public face: what it refuses before routing a call (a checkpoint mid-step, unknown
keys, keyed pulls on an async store)."""

from __future__ import annotations

import pytest
import torch

from netsense.compression import make_codec
from netsense.errors import ProtocolError
from netsense.ps.store import ParameterStore
from storehelp import two_worker_store as _store, step_grads as _grads, push_keys as _push

FP32 = make_codec("fp32")


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
