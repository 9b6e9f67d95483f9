"""The gradient-domain downlink (ps/store/gradient.py): the PS steps on what it sends, and a worker's
optimizer mirror (worker/mirror.py) stepping on the same bytes stays equal to the PS bit for bit."""

from __future__ import annotations

import pytest
import torch

from netsense.compression import make_codec
from netsense.errors import ConfigError, ProtocolError
from netsense.ps.server import PSServer, ServerSettings
from netsense.ps.store import ParameterStore
from netsense.transport.wire import Params, Push, decode_message, encode_message
from netsense.worker.mirror import OptimizerMirror

from storehelp import FP32, step_grads

SGD = {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}
ADAM = {"name": "adam", "lr": 0.01}


def gradient_store(optimizer: dict, domain: str = "gradient") -> ParameterStore:
    torch.manual_seed(0)
    s = ParameterStore(downlink_domain=domain)
    params = {"a": torch.randn(6, 5), "b": torch.randn(5), "c": torch.randn(4, 4)}
    s.initialize({k: FP32.encode(v) for k, v in params.items()}, optimizer)
    for w in ("w0", "w1"):
        s.join(w)
    return s


def push(s: ParameterStore, worker: int, step: int, spec: str, hparams: tuple = ()) -> object:
    return push_decoded(s, worker, step, spec, hparams)[0]


def push_decoded(
    s: ParameterStore, worker: int, step: int, spec: str, hparams: tuple = ()
) -> tuple[object, dict[str, torch.Tensor]]:
    """`push`'s reply, and what the PS decodes of it (its weight: 4 + worker samples)."""
    codec = make_codec(spec)
    grads = step_grads(step, worker)
    g = torch.Generator().manual_seed(step * 7 + worker)
    grads = {"a": torch.randn(6, 5, generator=g), "b": grads["b"], "c": torch.randn(4, 4, generator=g)}
    payloads = {k: codec.encode(g) for k, g in grads.items()}
    reply = s.push(f"w{worker}", Push(step, 4 + worker, 3, payloads, hparams))
    return reply, {k: codec.decode(p) for k, p in payloads.items()}


def mirror_of(full: Params) -> OptimizerMirror:
    assert full.full and full.optimizer, "a gradient-domain full PARAMS carries the optimizer"
    m = OptimizerMirror(full.optimizer)
    m.load({k: FP32.decode(p) for k, p in full.tensors.items()}, full.optim_state)
    return m


def apply(m: OptimizerMirror, update: Params, hyper: dict | None = None) -> None:
    assert update.gradient and not update.full
    grads = {k: make_codec(p.codec).decode(p) for k, p in update.tensors.items()}
    m.step(grads, {k: hyper.get(k) if hyper else None for k in grads})


def assert_equal(m: OptimizerMirror, s: ParameterStore) -> None:
    assert m.params.keys() == s.params.keys()
    for k, v in s.params.items():
        assert torch.equal(m.params[k], v), k


@pytest.mark.parametrize("optimizer", [SGD, ADAM], ids=["sgd", "adam"])
@pytest.mark.parametrize("spec", ["powersgd:2", "qsgd:4", "topk:0.2"])
def test_mirror_follows_the_ps_bit_for_bit(optimizer: dict, spec: str) -> None:
    s = gradient_store(optimizer)
    m = mirror_of(s.pull(-1))
    for step in range(6):
        push(s, 0, step, spec)
        applied = push(s, 1, step, spec)
        assert applied is not None and s.version == step + 1
        update = s.pull(step)
        if spec.startswith("topk"):  # the sum of sparse pushes goes down exact
            assert all(p.codec in ("threshold:1e-45", "fp32") for p in update.tensors.values())
        else:
            assert all(p.codec == spec for p in update.tensors.values())  # each key at its push's codec
        apply(m, update)
        assert_equal(m, s)
    # a worker that joins now: the full PARAMS carries the optimizer's state, and it keeps up
    late = mirror_of(s.pull(-1))
    assert_equal(late, s)
    assert late.optimizer is not None and len(late.optimizer.state) == 3
    for step in range(6, 9):
        push(s, 0, step, spec)
        push(s, 1, step, spec)
        update = s.pull(step)
        apply(m, update)
        apply(late, update)
        assert_equal(m, s)
        assert_equal(late, s)


def test_the_step_applies_what_was_sent_and_error_feedback_keeps_the_rest() -> None:
    """Plain SGD: parameters = initial - lr * (sum of what was sent), and sent + residual = the sum
    of the steps' exact aggregated gradients (the sample-weighted means of the decoded pushes)."""
    s = gradient_store({"name": "sgd", "lr": 0.1, "momentum": 0.0})
    init = {k: v.clone() for k, v in s.params.items()}
    exact = {k: torch.zeros_like(v) for k, v in s.params.items()}
    sent = {k: torch.zeros_like(v) for k, v in s.params.items()}
    codec = make_codec("powersgd:1")
    for step in range(5):
        decoded = []
        for w in (0, 1):
            msg = Push(step, 4 + w, 3, {k: codec.encode(torch.randn(v.shape)) for k, v in s.params.items()})
            decoded.append({k: codec.decode(p) for k, p in msg.grads.items()})
            s.push(f"w{w}", msg)
        for k in exact:
            exact[k] += decoded[0][k] * (4 / 9) + decoded[1][k] * (5 / 9)
        for k, p in s.pull(step).tensors.items():
            sent[k] += make_codec(p.codec).decode(p)
    gd = s._core.gradient
    assert gd is not None
    for k in s.params:
        torch.testing.assert_close(s.params[k], init[k] - 0.1 * sent[k], rtol=0, atol=1e-5)
        torch.testing.assert_close(sent[k] + gd.residual[k], exact[k], rtol=0, atol=1e-5)
    assert gd.residual["a"].abs().sum() > 0  # rank 1 of a rank-2 sum leaves something owed


def owed(s: ParameterStore, key: str) -> torch.Tensor:
    gd = s._core.gradient
    assert gd is not None
    return gd.residual[key].clone() if key in gd.residual else torch.zeros_like(s.params[key])


def assert_drained(before: torch.Tensor, after: torch.Tensor, mean: torch.Tensor, count: int) -> None:
    """What went of what was owed: every entry if no more than `count`; else at most `count`, none
    smaller than the mean's `count`-th largest, and if fewer, every entry that large. What went,
    went whole, and what stayed is untouched."""
    went = (before != 0) & (after == 0)
    torch.testing.assert_close(after[~went], before[~went], rtol=0, atol=0)
    if int(torch.count_nonzero(before)) <= count:
        assert not bool(after.any())
        return
    assert int(went.sum()) <= count
    nonzero = mean.abs()[mean != 0]
    least = nonzero.topk(min(count, nonzero.numel())).values[-1]
    assert bool((before.abs()[went] >= least).all())  # nothing smaller than what is sent
    if int(went.sum()) < count:
        assert bool((after.abs() < least).all())


@pytest.mark.parametrize("spec", ["topk:0.1", "randk:0.2+fp16", "threshold:2.0"])
def test_sparse_pushes_go_down_exact(spec: str) -> None:
    """The mean of sparse pushes is sparse: sent as its nonzeros (dense fp32 where smaller). What a
    lossy step left owed goes with it where an entry is as large as the mean's count-th largest, at
    most the codec's count a step (all of it for threshold, whose count follows the data), so an update
    stays the size of a sparse all-gather; and nothing is lost: the parameters move by every
    step's mean push, less what is still owed."""
    a = gradient_store({"name": "sgd", "lr": 0.1, "momentum": 0.0})
    init = a.params["a"].clone()
    count = make_codec(spec).count_bounds(30)[1]  # key a: 6 x 5
    # a worker at fp32 beside one at the sparse level: the dense mean goes lossy, the rest owed
    # (a threshold's count has no bound, its mean always goes exact: PowerSGD leaves the debt)
    first = (spec, "fp32") if count < 30 else ("powersgd:1", "powersgd:1")
    means = [sum((4 + w) / 9 * push_decoded(a, w, 0, first[w])[1]["a"] for w in (0, 1))]
    assert bool(owed(a, "a").any())
    m = mirror_of(a.pull(-1))
    drained = 0
    for step in range(1, 12):
        before = owed(a, "a")
        decoded = [push_decoded(a, w, step, spec)[1]["a"] for w in (0, 1)]
        means.append(sum((4 + w) / 9 * d for w, d in enumerate(decoded)))
        update = a.pull(step)
        payload = update.tensors["a"]
        assert payload.codec in ("threshold:1e-45", "fp32")  # exact: nonzeros, or dense where smaller
        assert payload.codec == "fp32" or payload.wire_size < 4 * 30
        sent = make_codec(payload.codec).decode(payload)
        assert int(torch.count_nonzero(sent)) <= int(torch.count_nonzero(means[-1])) + count
        after = owed(a, "a")
        assert_drained(before, after, means[-1], count)
        drained += int(torch.count_nonzero(before)) - int(torch.count_nonzero(after))
        apply(m, update)
        assert_equal(m, a)
    assert drained > 0
    # plain SGD: the parameters moved by the sum of the steps' means, less what is still owed
    torch.testing.assert_close(a.params["a"], init - 0.1 * (sum(means) - owed(a, "a")), rtol=0, atol=1e-5)


def test_a_sparse_level_beside_a_dense_one_goes_at_the_sparse_level() -> None:
    """One worker pushes top-k, the other PowerSGD: the key goes at top-k (the smaller push), lossy
    under error feedback, not as the dense mean whole (which cost a 640k-parameter model 2.6 MB a
    step); the next all-sparse step goes exact again, with what was owed as large as its mean's
    count-th largest entry."""
    s = gradient_store({"name": "sgd", "lr": 0.1, "momentum": 0.0})
    m = mirror_of(s.pull(-1))
    push(s, 0, 0, "topk:0.1")
    push(s, 1, 0, "powersgd:1")
    update = s.pull(0)
    assert update.tensors["a"].codec == "topk:0.1"
    assert update.tensors["a"].wire_size <= make_codec("topk:0.1").encode(torch.randn(6, 5)).wire_size
    before = owed(s, "a")
    assert int(torch.count_nonzero(before)) == 30 - 3
    apply(m, update)
    assert_equal(m, s)
    mean = sum((4 + w) / 9 * push_decoded(s, w, 1, "topk:0.1")[1]["a"] for w in (0, 1))
    update = s.pull(1)
    assert update.tensors["a"].codec == "threshold:1e-45"
    assert_drained(before, owed(s, "a"), mean, 3)
    apply(m, update)
    assert_equal(m, s)


def test_lossless_pushes_make_the_parameter_domain_step() -> None:
    """fp32 pushes: nothing is compressed, so both domains reach the same parameters."""
    a, b = gradient_store(SGD), gradient_store(SGD, domain="params")
    for step in range(4):
        for w in (0, 1):
            push(a, w, step, "fp32")
            push(b, w, step, "fp32")
    for k in a.params:
        assert torch.equal(a.params[k], b.params[k])
    assert a._core.gradient is not None and not a._core.gradient.residual


def test_the_step_hyper_parameters_reach_the_mirror() -> None:
    s = gradient_store(SGD)
    m = mirror_of(s.pull(-1))
    for step in range(3):
        lr = 0.1 / (step + 1)  # a schedule: each push carries the step's lr
        group = ({"lr": lr, "momentum": 0.9, "weight_decay": 1e-3},)
        push(s, 0, step, "qsgd:4", group)
        push(s, 1, step, "qsgd:4", group)
        hyper = tuple(sorted(group[0].items()))
        apply(m, s.pull(step), {k: hyper for k in s.params})
        assert_equal(m, s)


def test_keys_applied_ahead_go_in_the_gradient_domain() -> None:
    s = gradient_store(SGD)
    m = mirror_of(s.pull(-1))
    for step in range(3):
        s.want(["a"], step)
        push(s, 0, step, "powersgd:2")
        push(s, 1, step, "powersgd:2")
        assert s.version == step + 1
        part = s.pull_keys(step, ["a"])
        assert part.gradient and not part.full
        apply(m, s.pull(step))
        assert_equal(m, s)


def test_the_wire_carries_the_new_fields_and_old_messages_stay_as_they_were() -> None:
    s = gradient_store(ADAM)
    push(s, 0, 0, "qsgd:4")
    push(s, 1, 0, "qsgd:4")
    full, update = s.pull(-1), s.pull(0)
    for msg in (full, update):
        back = decode_message(encode_message(msg))
        assert isinstance(back, Params)
        assert (back.gradient, back.optimizer, back.optim_state.keys()) == (msg.gradient, msg.optimizer, msg.optim_state.keys())
    assert {k.partition(":")[0] for k in full.optim_state} == {"exp_avg", "exp_avg_sq", "step"}
    plain = Params(1, True, {"a": FP32.encode(torch.ones(2))})
    assert b"gradient" not in encode_message(plain) and b"optim" not in encode_message(plain)


def test_a_mirror_refuses_what_its_ps_could_not_have_sent() -> None:
    s = gradient_store(SGD)
    push(s, 0, 0, "fp32")
    push(s, 1, 0, "fp32")
    full = s.pull(-1)
    values = {k: FP32.decode(p) for k, p in full.tensors.items()}
    bad_state = {
        "nope:a": FP32.encode(torch.zeros(6, 5)),
        "momentum_buffer:zz": FP32.encode(torch.zeros(6, 5)),
        "momentum_buffer:b": FP32.encode(torch.zeros(3)),  # wrong shape
    }
    for key, payload in bad_state.items():
        with pytest.raises(ProtocolError):
            OptimizerMirror(full.optimizer).load(values, {key: payload})
    with pytest.raises(ProtocolError, match="NaN"):
        OptimizerMirror(full.optimizer).load(values, {"momentum_buffer:b": FP32.encode(torch.full((5,), float("nan")))})
    adam = gradient_store(ADAM)
    push(adam, 0, 0, "fp32")
    push(adam, 1, 0, "fp32")
    full_adam = adam.pull(-1)
    partial = {k: p for k, p in full_adam.optim_state.items() if not k.startswith("step:")}
    with pytest.raises(ProtocolError, match="needs"):  # Adam's moments without its step count
        OptimizerMirror(full_adam.optimizer).load({k: FP32.decode(p) for k, p in full_adam.tensors.items()}, partial)
    with pytest.raises(ProtocolError, match="optimizer settings"):
        OptimizerMirror({"name": "lion"})
    m = OptimizerMirror(full.optimizer)
    with pytest.raises(ProtocolError, match="before"):
        m.step({"a": torch.zeros(6, 5)}, {})
    m.load(values, full.optim_state)
    before = {k: v.clone() for k, v in m.params.items()}
    for grads in ({"a": torch.zeros(6, 5), "b": torch.full((5,), float("inf"))}, {"a": torch.zeros(5, 6)}, {"x": torch.zeros(1)}):
        with pytest.raises(ProtocolError):
            m.step(grads, {})
        assert all(torch.equal(before[k], v) for k, v in m.params.items())  # checked whole before any step


def test_gradient_domain_needs_the_barrier() -> None:
    with pytest.raises(ConfigError, match="synchronous"):
        ParameterStore(downlink_domain="gradient", staleness=1)
    with pytest.raises(ConfigError, match="downlink_domain"):
        ParameterStore(downlink_domain="both")


@pytest.mark.parametrize(
    ("residual", "message"),
    [({"a": torch.full((6, 5), float("nan"))}, "NaN/Inf"), ({"a": torch.zeros(5, 6)}, "no parameter"), ({"zz": torch.zeros(2)}, "no parameter")],
)
def test_a_checkpoint_with_a_bad_residual_is_refused_whole(residual: dict, message: str) -> None:
    s = gradient_store(SGD)
    push(s, 0, 0, "powersgd:1")
    push(s, 1, 0, "powersgd:1")
    state = s.state()
    state["downlink_residual"] = residual
    back = ParameterStore(downlink_domain="gradient")
    with pytest.raises(ProtocolError, match=message):
        back.restore(state)
    assert not back.initialized  # nothing taken
    del state["downlink_residual"]  # a checkpoint from before residuals were kept: nothing owed
    back.restore(state)
    assert back._core.gradient is not None and not back._core.gradient.residual


@pytest.mark.parametrize(
    ("settings", "domain"),
    [
        ({}, "gradient"),  # the default: synchronous, no downlink policy or codec set
        ({"staleness": 1}, "params"),  # async pulls send whole parameters
        ({"policy": "dc2"}, "params"),  # a downlink policy the user set runs in the parameter domain
        ({"downlink_codec": "fp16"}, "params"),
        ({"downlink_domain": "params"}, "params"),
        ({"downlink_domain": "gradient", "policy": "dc2"}, "gradient"),  # said outright: the policy is not used
    ],
)
def test_the_auto_domain(settings: dict, domain: str) -> None:
    assert ServerSettings(**settings).domain == domain
    assert PSServer(ServerSettings(**settings), secret=None).store.downlink_domain == domain


def test_a_restored_store_sends_its_optimizer_and_owes_what_it_owed() -> None:
    s = gradient_store(ADAM)
    for step in range(3):
        push(s, 0, step, "powersgd:1")
        push(s, 1, step, "powersgd:1")
    assert s._core.gradient is not None and s._core.gradient.residual
    back = ParameterStore(downlink_domain="gradient")
    back.restore(s.state())
    assert back._core.gradient is not None
    owed, kept = s._core.gradient.residual, back._core.gradient.residual
    assert owed.keys() == kept.keys() and all(torch.equal(owed[k], kept[k]) for k in owed)
    assert all(kept[k] is not owed[k] for k in kept)  # copies: the snapshot does not alias the live store
    m = mirror_of(back.pull(-1))
    assert_equal(m, back)
    for w in ("w0", "w1"):
        back.join(w)
    push(back, 0, 3, "qsgd:4")
    push(back, 1, 3, "qsgd:4")
    apply(m, back.pull(3))
    assert_equal(m, back)


def test_a_lossless_step_flushes_what_was_owed() -> None:
    """After lossy steps, a step pushed in fp32 goes down whole with the residual: nothing is left
    owed, and the sum of what was sent is the sum of the steps' aggregated gradients."""
    s = gradient_store({"name": "sgd", "lr": 0.1, "momentum": 0.0})
    init = {k: v.clone() for k, v in s.params.items()}
    for step, spec in enumerate(["powersgd:1", "powersgd:1", "fp32"]):
        push(s, 0, step, spec)
        push(s, 1, step, spec)
    assert s._core.gradient is not None and not s._core.gradient.residual
    plain = gradient_store({"name": "sgd", "lr": 0.1, "momentum": 0.0}, domain="params")
    for step, spec in enumerate(["powersgd:1", "powersgd:1", "fp32"]):
        push(plain, 0, step, spec)
        push(plain, 1, step, spec)
    for k in s.params:  # plain SGD: the same total step, whatever the split over steps
        torch.testing.assert_close(s.params[k] - init[k], plain.params[k] - init[k], rtol=0, atol=1e-5)


def test_a_key_goes_down_at_its_smallest_push() -> None:
    """Two workers push a key at different levels (a relay's own-site shard over a LAN, the other
    site's over the WAN): the update goes to both, so at the smaller push's level, whoever's id
    comes first."""
    s = gradient_store(SGD)
    codecs = {0: make_codec("fp16"), 1: make_codec("powersgd:1")}
    sizes: dict[str, list[tuple[int, str]]] = {k: [] for k in s.params}
    for w in (0, 1):
        grads = {k: torch.randn(v.shape, generator=torch.Generator().manual_seed(w)) for k, v in s.params.items()}
        payloads = {k: codecs[w].encode(g) for k, g in grads.items()}
        for k, p in payloads.items():
            sizes[k].append((p.wire_size, p.codec))
        s.push(f"w{w}", Push(0, 4, 3, payloads))
    update = s.pull(0)
    assert {k: p.codec for k, p in update.tensors.items()} == {k: min(v, key=lambda x: x[0])[1] for k, v in sizes.items()}
    assert update.tensors["a"].codec == "powersgd:1"  # 6 x 5: the rank-1 push is the smaller


def test_a_full_pull_during_a_pipelined_step_sends_the_previous_version_whole() -> None:
    """Keys applied ahead of the version (a keyed pull) have stepped their optimizer already: a
    full pull before the step is whole still sends the previous version, parameters and their
    state, so a worker that joins then steps on with the others."""
    s = gradient_store(SGD)
    for step in range(2):
        push(s, 0, step, "powersgd:2")
        push(s, 1, step, "powersgd:2")
    s.want(["a"], 2)
    codec, g = make_codec("powersgd:2"), torch.Generator().manual_seed(5)
    grads = {w: {k: torch.randn(v.shape, generator=g) for k, v in s.params.items()} for w in (0, 1)}
    s.push("w0", Push(2, 4, 3, {k: codec.encode(x) for k, x in grads[0].items()}))
    s.push("w1", Push(2, 5, 3, {"a": codec.encode(grads[1]["a"])}))
    assert s.version == 2 and s.applied_keys == 1  # "a" stepped ahead
    mid = mirror_of(s.pull(-1))
    s.push("w1", Push(2, 5, 3, {k: codec.encode(x) for k, x in grads[1].items() if k != "a"}))
    assert s.version == 3
    apply(mid, s.pull(2))
    assert_equal(mid, s)
