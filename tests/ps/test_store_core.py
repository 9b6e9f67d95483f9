"""ParameterStore's core: pushes validated whole (a bad one is refused and changes nothing), and the
sample-weighted apply with torch.optim equal to one big batch."""

from __future__ import annotations

import pytest
import torch

from netsense.compression import make_codec
from netsense.errors import ProtocolError
from netsense.ps.store import ParameterStore
from netsense.compression.limits import all_finite
from netsense.transport.wire import Push
from storehelp import init_params as _init, push_grads as _push, store  # noqa: F401 (a fixture)

FP32 = make_codec("fp32")


def test_weighted_average_equals_one_big_batch() -> None:
    """Sample-weighted mean of per-worker mean gradients == gradient of the concatenated batch."""
    for opt in ({"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}, {"name": "adam", "lr": 0.01}):
        torch.manual_seed(0)
        model = torch.nn.Linear(5, 3)
        ref = torch.nn.Linear(5, 3)
        ref.load_state_dict(model.state_dict())
        store = ParameterStore()
        _init(store, dict(model.named_parameters()), opt)
        store.join("a")
        store.join("b")
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01) if opt["name"] == "sgd" else torch.optim.Adam(ref.parameters(), lr=0.01)
        for step in range(5):
            xa, xb = torch.randn(3, 5), torch.randn(5, 5)  # unequal batches
            for w, x in (("a", xa), ("b", xb)):
                m = torch.nn.Linear(5, 3)
                m.load_state_dict({k: v.clone() for k, v in store.params.items()})
                m.zero_grad()
                m(x).pow(2).mean().backward()
                _push(store, w, step, {k: p.grad for k, p in m.named_parameters()}, samples=len(x))
            ref_opt.zero_grad()
            ref(torch.cat([xa, xb])).pow(2).mean().backward()
            ref_opt.step()
        for k, p in ref.named_parameters():
            torch.testing.assert_close(store.params[k], p.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("grads", "code"),
    [
        ({"w": torch.ones(3, 2)}, "shape"),
        ({"nope": torch.ones(3)}, "key"),
        ({"w": torch.full((2, 3), float("nan"))}, "non-finite"),
        ({"b": torch.tensor([1.0, float("inf"), 0.0])}, "non-finite"),
    ],
)
def test_bad_push_refused_and_changes_nothing(store: ParameterStore, grads: dict, code: str) -> None:
    before = {k: v.clone() for k, v in store.params.items()}
    with pytest.raises(ProtocolError) as info:
        _push(store, "a", 0, grads)
    assert info.value.code == code
    assert not store.step_started
    assert all(torch.equal(before[k], store.params[k]) for k in before)


def test_stale_duplicate_and_wrong_count_refused(store: ParameterStore) -> None:
    with pytest.raises(ProtocolError, match="stale"):
        _push(store, "a", 3, {"b": torch.ones(3)})
    with pytest.raises(ProtocolError, match="keys"):
        _push(store, "a", 0, {"b": torch.ones(3)}, total=5)
    _push(store, "a", 0, {"b": torch.ones(3)})
    with pytest.raises(ProtocolError, match="duplicate"):
        _push(store, "a", 0, {"b": torch.ones(3)})


def test_corrupt_payload_bytes_refused(store: ParameterStore) -> None:
    from netsense.compression import Payload

    bad = Payload("fp32", (3,), "float32", (b"\x00" * 5,))
    with pytest.raises(ProtocolError, match="bad-payload"):
        store.push("a", Push(0, 4, 2, {"b": bad}))
    with pytest.raises(ProtocolError, match="bad-payload"):
        store.push("a", Push(0, 4, 2, {"b": Payload("nosuchcodec", (3,), "float32", ())}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_any_non_finite_element_is_found(dtype: torch.dtype, bad: float) -> None:
    for pos in (0, 4095, 100_000):
        t = torch.randn(100_001).to(dtype)
        t[pos] = bad
        assert not all_finite(t)
    both = torch.zeros(10, dtype=dtype)
    both[2], both[7] = float("inf"), float("-inf")  # sum is NaN, not Inf
    assert not all_finite(both)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_finite_values_whose_sum_overflows_pass(dtype: torch.dtype) -> None:
    t = torch.full((1000,), torch.finfo(dtype).max, dtype=dtype)
    assert not torch.isfinite(t.sum())
    assert all_finite(t)
    assert all_finite(torch.randn(1000).to(dtype)) and all_finite(torch.empty(0, dtype=dtype))
