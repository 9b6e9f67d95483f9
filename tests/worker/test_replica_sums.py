"""A worker's replica takes a forwarded update (`Params.sums`): the other worker's push added to its
own, in the PS's order, gives the PS's parameters bit for bit; a forwarded push is checked as the
PS checks a push, and a bad one changes nothing."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from netsense.compression import Payload, make_codec
from netsense.errors import ProtocolError
from netsense.ps.store import ParameterStore
from netsense.transport.wire import Params, Push, Sum, decode_message, encode_message
from netsense.worker.replica import Replica


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _setup() -> tuple[ParameterStore, Replica, torch.nn.Module]:
    model = _model()
    replica = Replica(model, 1 << 22, 1)
    store = ParameterStore(downlink_domain="gradient")
    store.initialize(replica.seed(0), {"name": "sgd", "lr": 0.1, "momentum": 0.9})
    for w in ("w0", "w1"):
        store.join(w)
    replica.apply(store.pull(-1), 0)
    return store, replica, model


def _push(store: ParameterStore, worker: int, step: int, spec: str = "powersgd:2", intent: str = "") -> dict[str, Payload]:
    g = torch.Generator().manual_seed(10 * step + worker)
    codec = make_codec(spec)
    payloads = {k: codec.encode(torch.randn(v.shape, generator=g)) for k, v in store.params.items()}
    store.push(f"w{worker}", Push(step, 3 + worker, len(store.params), payloads, keeps=True, intent=intent))
    return payloads


def _sent(update: Params) -> Params:
    out = decode_message(encode_message(update))
    assert isinstance(out, Params)
    return out


def _held(replica: Replica) -> dict[str, torch.Tensor]:
    return {s.key: s.view(s.param.data).clone() for s in replica.slots}


@pytest.mark.parametrize("worker", [0, 1])
def test_the_replica_adds_its_own_push_and_equals_the_ps(worker: int) -> None:
    store, replica, _ = _setup()
    for step in range(4):
        pushed = [_push(store, w, step) for w in (0, 1)]
        replica.own = pushed[worker]
        replica.apply(_sent(store.pull(step).for_recipient(f"w{worker}")), 0)
        assert replica.forwarded and replica.versions == [step + 1]
        for key, value in _held(replica).items():
            assert torch.equal(value, store.params[key]), key


def _bad_update(store: ParameterStore, pushed: dict[str, Payload], change: str) -> Params:
    update = _sent(store.pull(0).for_recipient("w0"))
    key = next(iter(update.sums))
    terms = update.sums[key]
    if change == "non-finite":
        nan = torch.full(pushed[key].shape, float("nan"))
        terms = dataclasses.replace(terms, pushes=(make_codec("fp32").encode(nan),))
    elif change == "shape":
        terms = dataclasses.replace(terms, pushes=(make_codec("fp32").encode(torch.zeros(2)),))
    elif change == "key":
        return dataclasses.replace(update, sums={**update.sums, "no.such.key": terms})
    return dataclasses.replace(update, sums={**update.sums, key: terms})


@pytest.mark.parametrize("change", ["non-finite", "shape", "key", "own push missing"])
def test_a_bad_forwarded_update_is_refused_and_changes_nothing(change: str) -> None:
    store, replica, _ = _setup()
    pushed = [_push(store, w, 0) for w in (0, 1)]
    before = _held(replica)
    replica.own = {} if change == "own push missing" else pushed[0]
    with pytest.raises(ProtocolError) as info:
        replica.apply(_bad_update(store, pushed[0], change), 0)
    assert info.value.code == {"own push missing": "key"}.get(change, change)
    assert replica.versions == [0]
    for key, value in _held(replica).items():
        assert torch.equal(value, before[key]), key


def test_a_sum_names_the_recipient_only_where_it_pushed() -> None:
    a, b = (make_codec("fp32").encode(torch.full((2,), float(i))) for i in (1, 2))
    s = Sum((0.25, 0.75), -1, (a, b), ("w0", "w1"))
    assert s.for_recipient("w1") == Sum((0.25, 0.75), 1, (a,))
    assert s.for_recipient("w0") == Sum((0.25, 0.75), 0, (b,))
    assert s.for_recipient("w9") == Sum((0.25, 0.75), -1, (a, b))


@pytest.mark.parametrize(
    ("specs", "seen"),
    [
        (("powersgd:2", "powersgd:2"), (None, None)),  # alike: forwarded, the own level
        (("powersgd:2", "powersgd:1"), ("powersgd:1", None)),  # unlike: the mean at the smaller
        (("powersgd:1", "powersgd:2"), (None, "powersgd:1")),
        (("fp32", "fp16"), ("fp16", None)),
        (("fp32", "fp32"), (None, None)),
    ],
)
def test_the_step_spec_is_the_smallest_push_where_it_was_another_workers(
    specs: tuple[str, str], seen: tuple[str | None, str | None]
) -> None:
    """What each worker reads of the step (`Replica.step_spec`, netsense's anchor): the level of
    the step's smallest push where another worker sent it, through the real PS, forwarded or not."""
    for worker in (0, 1):
        store, replica, _ = _setup()
        pushed = [_push(store, w, 0, specs[w]) for w in (0, 1)]
        replica.own = pushed[worker]
        replica.apply(_sent(store.pull(0).for_recipient(f"w{worker}")), 0)
        assert replica.forwarded == (specs[0] == specs[1])
        assert replica.step_spec == seen[worker], (specs, worker)


def test_the_step_spec_is_read_from_the_models_largest_key_across_shards() -> None:
    """Shard 1 holds only small keys, whose powersgd:1 and :2 pushes are alike in size (forwarded,
    nothing to read): applied after shard 0's update it must not hide what shard 0's largest key
    showed, the other worker's powersgd:1 under this worker's powersgd:2."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    replica = Replica(model, 1 << 22, 2)
    stores = []
    for shard in (0, 1):
        store = ParameterStore(downlink_domain="gradient")
        store.initialize(replica.seed(shard), {"name": "sgd", "lr": 0.1})
        for w in ("w0", "w1"):
            store.join(w)
        replica.apply(store.pull(-1), shard)
        stores.append(store)
    assert list(stores[0].params) == ["0.weight"]
    own: dict[str, Payload] = {}
    for shard, store in enumerate(stores):
        own.update(_push(store, 0, 0, "powersgd:2"))
        _push(store, 1, 0, "powersgd:1")
    replica.own = own
    for shard, store in enumerate(stores):
        replica.apply(_sent(store.pull(0).for_recipient("w0")), shard)
    assert replica.step_spec == "powersgd:1"


def test_forwards_says_whether_a_shard_has_forwarded_pushes() -> None:
    """False until a shard forwards (pushes that do not keep are never forwarded), then sticky:
    a step of unlike levels (its large keys compressed) still says a step at the other's level
    would come back forwarded (`Policy.join_compressions`)."""
    store, replica, _ = _setup()
    codec = make_codec("powersgd:2")
    for w in (0, 1):
        payloads = {k: codec.encode(torch.randn(v.shape)) for k, v in store.params.items()}
        store.push(f"w{w}", Push(0, 3, len(store.params), payloads, keeps=False))
        if w == 0:
            replica.own = payloads
    replica.apply(_sent(store.pull(0).for_recipient("w0")), 0)
    assert not replica.forwards and replica.step_spec is None
    for step, specs in ((1, ("powersgd:2", "powersgd:2")), (2, ("powersgd:2", "powersgd:1"))):
        pushed = [_push(store, w, step, specs[w]) for w in (0, 1)]
        replica.own = pushed[0]
        replica.apply(_sent(store.pull(step).for_recipient("w0")), 0)
        assert replica.forwards and replica.forwarded == (step == 1)
    assert replica.step_spec == "powersgd:1"


def test_the_step_intents_are_the_others_through_the_real_ps() -> None:
    """`Replica.step_intents` (netsense's anchor where known): the other worker's intent, not its
    sent level (a probe at topk:0.2 heading for powersgd:1), and none from a step that said none."""
    store, replica, _ = _setup()
    assert replica.step_intents == ()
    replica.own = _push(store, 0, 0, "powersgd:2", intent="powersgd:2")
    _push(store, 1, 0, "topk:0.2", intent="powersgd:1")
    replica.apply(_sent(store.pull(0).for_recipient("w0")), 0)
    assert replica.step_intents == ("powersgd:1",) and replica.step_spec == "topk:0.2"
    replica.own = _push(store, 0, 1, intent="powersgd:2")
    _push(store, 1, 1)
    replica.apply(_sent(store.pull(1).for_recipient("w0")), 0)
    assert replica.step_intents == ()
