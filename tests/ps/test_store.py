"""ParameterStore: the barrier, exact sync semantics, and refusal of bad pushes without side effects."""

from __future__ import annotations

import pytest
import torch

from netsense.compression import make_codec
from netsense.errors import ProtocolError
from netsense.ps.store import ParameterStore
from netsense.transport.wire import Push

FP32 = make_codec("fp32")


def _init(store: ParameterStore, params: dict[str, torch.Tensor], optimizer: dict | None = None) -> None:
    store.initialize({k: FP32.encode(v) for k, v in params.items()}, optimizer or {"name": "sgd", "lr": 0.1, "momentum": 0.9})


def _push(store: ParameterStore, worker: str, step: int, grads: dict[str, torch.Tensor], samples: int = 4, total: int | None = None):
    msg = Push(step, samples, total or len(store.params), {k: FP32.encode(v) for k, v in grads.items()})
    return store.push(worker, msg)


@pytest.fixture
def store() -> ParameterStore:
    s = ParameterStore()
    _init(s, {"w": torch.ones(2, 3), "b": torch.zeros(3)})
    s.join("a")
    s.join("b")
    return s


def test_applies_only_when_every_live_worker_pushed_every_key(store: ParameterStore) -> None:
    g = {"w": torch.ones(2, 3), "b": torch.ones(3)}
    assert _push(store, "a", 0, g) is None
    assert _push(store, "b", 0, {"w": g["w"]}) is None
    result = _push(store, "b", 0, {"b": g["b"]})
    assert result is not None and result.version == 1 and result.workers == ("a", "b")
    assert store.version == 1


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


def test_leave_discards_partial_step_and_completes_barrier(store: ParameterStore) -> None:
    g = {"w": torch.ones(2, 3), "b": torch.ones(3)}
    _push(store, "b", 0, {"w": g["w"]})  # b half done
    _push(store, "a", 0, g)
    result = store.leave("b")
    assert result is not None and result.workers == ("a",)
    torch.testing.assert_close(store.params["b"], torch.full((3,), -0.1))  # a's gradient only


def test_barrier_timeout_drops_only_incomplete_workers(store: ParameterStore) -> None:
    assert store.drop_incomplete() == ([], None)  # nobody finished: nothing to drop yet
    _push(store, "a", 0, {"w": torch.ones(2, 3), "b": torch.ones(3)})
    dropped, result = store.drop_incomplete()
    assert dropped == ["b"] and result is not None and result.version == 1
    # b rejoins by pushing the current step
    _push(store, "b", 1, {"w": torch.ones(2, 3), "b": torch.ones(3)})
    assert "b" in store.live


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


def test_first_step_waits_for_the_whole_job_until_the_timeout() -> None:
    s = ParameterStore()
    s.initialize({"b": FP32.encode(torch.zeros(3))}, {"name": "sgd", "lr": 0.1}, world_size=2)
    s.join("a")
    assert _push(s, "a", 0, {"b": torch.ones(3)}) is None  # b has not even connected yet
    s.join("b")
    result = _push(s, "b", 0, {"b": torch.ones(3)})
    assert result is not None and result.workers == ("a", "b")
    # a second job where b never comes: the barrier timeout lets a go alone
    s2 = ParameterStore()
    s2.initialize({"b": FP32.encode(torch.zeros(3))}, {"name": "sgd", "lr": 0.1}, world_size=2)
    s2.join("a")
    _push(s2, "a", 0, {"b": torch.ones(3)})
    dropped, result = s2.drop_incomplete()
    assert dropped == [] and result is not None and result.workers == ("a",)
