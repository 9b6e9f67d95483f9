"""Forwarded pushes (docs/ARCHITECTURE.md, "Forwarded pushes"): a gradient-domain PS whose step has
at most two pushers, each keeping its pushes, sends each worker the other's push instead of
compressing their mean again; the worker adds its own in the PS's order and its optimizer mirror
stays equal to the PS's parameters bit for bit, which then stepped on the exact mean."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from netsense.compression import Payload, make_codec
from netsense.ps.session import WorkerSession
from netsense.ps.store import ParameterStore
from netsense.ps.store.core import FORWARD_SPREAD
from netsense.transport.aggregate import weighted_sum
from netsense.transport.wire import Params, Push, decode_message, encode_message

from storehelp import FP32
from test_gradient_downlink import ADAM, SGD, apply, assert_equal, gradient_store, mirror_of, owed


def push(
    s: ParameterStore, worker: int, step: int, spec: str, *, keeps: bool = True, samples: int | None = None, intent: str = ""
) -> dict[str, Payload]:
    """Worker `worker`'s push of step `step` at `spec` (its weight: 4 + worker samples); its payloads."""
    g = torch.Generator().manual_seed(step * 7 + worker)
    codec = make_codec(spec)
    payloads = {k: codec.encode(torch.randn(v.shape, generator=g)) for k, v in s.params.items()}
    s.push(f"w{worker}", Push(step, samples or 4 + worker, len(s.params), payloads, keeps=keeps, intent=intent))
    return payloads


def rebuild(update: Params, own: dict[str, Payload]) -> dict[str, torch.Tensor]:
    """What a worker steps on: the update as it is sent it (over the wire), its own pushes added."""
    sent = decode_message(encode_message(update))
    assert isinstance(sent, Params)
    grads = {}
    for key, terms in sent.sums.items():
        pushes = list(terms.pushes)
        if terms.own >= 0:
            pushes.insert(terms.own, own[key])
        grads[key] = weighted_sum([(make_codec(p.codec).decode(p), w) for p, w in zip(pushes, terms.weights)], torch.float32)
    return grads


@pytest.mark.parametrize("optimizer", [SGD, ADAM], ids=["sgd", "adam"])
@pytest.mark.parametrize("spec", ["powersgd:2", "qsgd:4", "topk:0.2", "fp16"])
def test_each_worker_gets_the_others_push_and_steps_with_the_ps(optimizer: dict, spec: str) -> None:
    s = gradient_store(optimizer)
    mirrors = [mirror_of(s.pull(-1)) for _ in range(2)]
    for step in range(5):
        pushed = [push(s, w, step, spec) for w in (0, 1)]
        update = s.pull(step)
        assert set(update.sums) == set(s.params) and not update.tensors  # every key forwarded
        for w, m in enumerate(mirrors):
            mine = update.for_recipient(f"w{w}")
            for key, terms in mine.sums.items():
                assert terms.own == w and terms.weights == (4 / 9, 5 / 9)  # summed in worker-id order
                assert terms.pushes == (pushed[1 - w][key],)  # the other's push, byte for byte
            grads = rebuild(mine, pushed[w])
            m.step(grads, dict.fromkeys(grads))
            assert_equal(m, s)


def test_the_ps_steps_on_the_exact_mean_of_the_pushes() -> None:
    """Plain SGD: parameters = initial - lr * (sum of the steps' sample-weighted mean pushes), to
    the bit of the same arithmetic; nothing is compressed a second time, nothing owed."""
    s = gradient_store({"name": "sgd", "lr": 0.1, "momentum": 0.0})
    expect = {k: v.clone() for k, v in s.params.items()}
    for step in range(4):
        pushed = [push(s, w, step, "powersgd:1") for w in (0, 1)]
        for k in expect:
            mean = weighted_sum([(make_codec("powersgd:1").decode(pushed[w][k]), (4 + w) / 9) for w in (0, 1)], torch.float32)
            expect[k].add_(mean, alpha=-0.1)
    for k in s.params:
        assert torch.equal(s.params[k], expect[k]), k
    gd = s._core.gradient
    assert gd is not None and not gd.residual


def test_a_worker_that_pushed_nothing_gets_every_push() -> None:
    s = gradient_store(SGD)
    s.join("w2")
    late = mirror_of(s.pull(-1))
    pushed = [push(s, w, 0, "powersgd:2") for w in (0, 1)]
    s.push("w2", Push(0, 4, len(s.params), {}, skip=True, keeps=True))  # its AMP scaler skipped the step
    update = s.pull(0).for_recipient("w2")
    assert all(t.own == -1 and len(t.pushes) == 2 for t in update.sums.values())
    assert all(update.sums[k].pushes == (pushed[0][k], pushed[1][k]) for k in s.params)
    grads = rebuild(update, {})
    late.step(grads, dict.fromkeys(grads))
    assert_equal(late, s)


def test_one_pusher_is_sent_nothing_but_the_weight() -> None:
    s = gradient_store(SGD)
    s.leave("w1")
    m = mirror_of(s.pull(-1))
    pushed = push(s, 0, 0, "qsgd:4")
    update = s.pull(0).for_recipient("w0")
    assert all(t.own == 0 and t.pushes == () and t.weights == (1.0,) for t in update.sums.values())
    grads = rebuild(update, pushed)
    m.step(grads, dict.fromkeys(grads))
    assert_equal(m, s)


@pytest.mark.parametrize("case", ["a pusher does not keep its pushes", "three pushers", "clipping"])
def test_otherwise_the_mean_is_compressed_as_before(case: str) -> None:
    """A relay (or an older worker) does not keep its pushes, three pushes cost more bytes than
    their compressed mean, and clipping couples every key: then each key goes compressed."""
    optimizer = {**SGD, "clip_grad_norm": 1.0} if case == "clipping" else SGD
    s = gradient_store(optimizer)
    workers = (0, 1, 2) if case == "three pushers" else (0, 1)
    if case == "three pushers":
        s.join("w2")
    m = mirror_of(s.pull(-1))
    for w in workers:
        push(s, w, 0, "powersgd:1", keeps=not (case.startswith("a pusher") and w == 1))
    update = s.pull(0)
    assert not update.sums and all(p.codec == "powersgd:1" for p in update.tensors.values())
    apply(m, update)
    assert_equal(m, s)


def test_what_a_compressed_step_left_owed_waits_for_the_next_compressed_step() -> None:
    """Three pushers leave a residual; with two the keys go forwarded and it stays owed, untouched;
    with three again it goes with the compressed mean (plain SGD: the parameters moved by every
    step's exact mean, less what is still owed)."""
    s = gradient_store({"name": "sgd", "lr": 0.1, "momentum": 0.0})
    init = s.params["a"].clone()
    s.join("w2")
    m = mirror_of(s.pull(-1))
    codec = make_codec("powersgd:1")
    means = []
    for step, workers in enumerate([(0, 1, 2), (0, 1), (0, 1, 2)]):
        if step == 1:
            s.leave("w2")
        if step == 2:
            s.join("w2")
        pushed = {w: push(s, w, step, "powersgd:1") for w in workers}
        total = sum(4 + w for w in workers)
        means.append(weighted_sum([(codec.decode(pushed[w]["a"]), (4 + w) / total) for w in workers], torch.float32))
        update = s.pull(step)
        if step == 1:
            assert set(update.sums) == set(s.params)
            assert torch.equal(owed(s, "a"), before)  # forwarded: nothing owed is sent or dropped
            grads = rebuild(update.for_recipient("w0"), pushed[0])
            m.step(grads, dict.fromkeys(grads))
        else:
            assert not update.sums
            apply(m, update)
        assert_equal(m, s)
        before = owed(s, "a")
        assert bool(before.any())
    torch.testing.assert_close(s.params["a"], init - 0.1 * (sum(means) - before), rtol=0, atol=1e-5)


def test_pushes_of_unlike_size_go_as_the_compressed_mean() -> None:
    """Each worker's policy chose its level for its own path: a push more than `FORWARD_SPREAD`
    times the other's (a LAN-sized level beside a WAN-sized one) is not forwarded to the other;
    the key goes at the smaller push's codec, as before. Sizes within the spread (one codec) go
    forwarded."""
    s = gradient_store(SGD)
    m = mirror_of(s.pull(-1))
    pushed = [push(s, 0, 0, "fp16"), push(s, 1, 0, "qsgd:4")]
    update = s.pull(0)
    for k in s.params:
        small, large = sorted(p[k].wire_size for p in pushed)
        if large > FORWARD_SPREAD * small:
            assert k in update.tensors and update.tensors[k].codec == min((p[k] for p in pushed), key=lambda p: p.wire_size).codec
        else:
            assert k in update.sums
    assert update.tensors and update.sums  # this model's keys fall on both sides
    grads = {**rebuild(update.for_recipient("w0"), pushed[0]), **{k: make_codec(p.codec).decode(p) for k, p in update.tensors.items()}}
    m.step(grads, dict.fromkeys(grads))
    assert_equal(m, s)
    pushed = [push(s, w, 1, spec) for w, spec in ((0, "topk:0.2"), (1, "topk:0.2+fp16"))]
    assert all(pushed[0][k].wire_size != pushed[1][k].wire_size for k in s.params)
    assert all(max(p[k].wire_size for p in pushed) <= FORWARD_SPREAD * min(p[k].wire_size for p in pushed) for k in s.params)
    assert set(s.pull(1).sums) == set(s.params)


def test_a_pipelined_step_forwards_the_keys_it_applies_ahead() -> None:
    s = gradient_store(SGD)
    m = mirror_of(s.pull(-1))
    pushed = [push(s, w, 0, "powersgd:2") for w in (0, 1)]
    assert s.version == 1
    keyed = s.pull_keys(0, ["a", "b"])  # the finished step's keys, as a keyed pull takes them
    assert set(keyed.sums) == {"a", "b"} and not keyed.tensors
    grads = rebuild(s.pull(0).for_recipient("w1"), pushed[1])
    m.step(grads, dict.fromkeys(grads))
    assert_equal(m, s)


def test_payloads_are_kept_only_where_they_may_be_forwarded() -> None:
    """A parameter-domain PS never forwards: it keeps no pushes' payloads."""
    s = gradient_store(SGD, domain="params")
    s.push("w0", Push(0, 4, 3, {k: FP32.encode(torch.ones(v.shape)) for k, v in s.params.items()}, keeps=True))
    assert not s._core.pending["w0"].payloads


def test_a_peer_that_does_not_keep_its_pushes_is_sent_the_full_parameters() -> None:
    """A relay (or an older worker) that pulls a forwarded update could not rebuild it: it gets the
    full parameters, with the optimizer, which need no push of its own (ps/session.py)."""
    s = gradient_store(SGD)
    for w in (0, 1):
        push(s, w, 0, "powersgd:2")
    update = s.pull(0)
    assert update.sums
    session = SimpleNamespace(worker_id="w0", keeps=True, server=SimpleNamespace(store=s))
    mine = WorkerSession._for_me(session, update)  # type: ignore[arg-type]
    assert not mine.full and mine.sums["a"].own == 0
    session.keeps = False
    full = WorkerSession._for_me(session, update)  # type: ignore[arg-type]
    assert full.full and full.optimizer and not full.sums
    m = mirror_of(full)
    assert_equal(m, s)


def test_each_worker_is_told_the_others_intents() -> None:
    """`Params.intents`: a gradient-domain update hands each recipient the other contributors'
    `Push.intent`, forwarded or compressed; a step in which one said none hands on none."""
    s = gradient_store(SGD)
    push(s, 0, 0, "powersgd:2", intent="powersgd:2")
    push(s, 1, 0, "topk:0.2", intent="powersgd:1")  # a probe: its intent is its committed level
    update = s.pull(0)
    assert update.for_recipient("w0").intents == ("powersgd:1",)
    assert update.for_recipient("w1").intents == ("powersgd:2",)
    assert update.for_recipient("w9").intents == ("powersgd:2", "powersgd:1")
    push(s, 0, 1, "powersgd:2", intent="powersgd:2")
    push(s, 1, 1, "powersgd:2")
    assert s.pull(1).for_recipient("w0").intents == ()


def test_a_compressed_update_tells_each_worker_only_the_others_intent() -> None:
    """An update that goes down as a compressed mean (no forwarded pushes) carries the intents
    too, and each worker is sent the other's alone: before, `_for_me` passed such an update on
    whole, own intent included (ps/session.py)."""
    s = gradient_store(SGD)
    s.join("w2")
    for w in (0, 1, 2):  # three pushes cost more than their compressed mean: not forwarded
        push(s, w, 0, "powersgd:1", intent=f"powersgd:{w + 1}")
    update = s.pull(0)
    assert not update.sums and update.intents
    for w in (0, 1, 2):
        session = SimpleNamespace(worker_id=f"w{w}", keeps=True, server=SimpleNamespace(store=s))
        mine = WorkerSession._for_me(session, update)  # type: ignore[arg-type]
        assert mine.intents == tuple(f"powersgd:{v + 1}" for v in (0, 1, 2) if v != w) and not mine.intent_owners
        assert WorkerSession._recipient(session, mine) == f"w{w}"  # type: ignore[arg-type]  # cached per worker
