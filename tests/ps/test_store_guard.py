"""Nothing poisons the PS's model: gradients are checked in the parameters' dtype, and an optimizer
step that would make parameters or optimizer state NaN/Inf is refused whole, changing nothing
(ps/store/guard.py; docs/RELIABILITY.md, "Poisoned updates")."""

from __future__ import annotations

import math

import pytest
import torch

from netsense.compression import make_codec
from netsense.errors import ProtocolError
from netsense.ps.store import ParameterStore
from netsense.ps.store.guard import StepGuard, UpdateRefused, amax_abs, amax_each, check_update
from netsense.transport.wire import Push

FP32 = make_codec("fp32")
SGD = {"name": "sgd", "lr": 0.1, "momentum": 0.9}
HUGE = 3e38  # finite in float32 (max 3.4e38); momentum adds two of them
BIG_LR = {"name": "sgd", "lr": 10.0, "momentum": 0.9}  # one step of HUGE overflows the parameters


def _store(optimizer: dict | None = None, workers: tuple[str, ...] = ("a", "b"), staleness: int | None = None) -> ParameterStore:
    s = ParameterStore(staleness=staleness)
    s.initialize({"w": FP32.encode(torch.ones(2, 3)), "b": FP32.encode(torch.zeros(3))}, optimizer or SGD)
    for w in workers:
        s.join(w)
    return s


def _grads(value: float = 0.5) -> dict[str, torch.Tensor]:
    return {"w": torch.full((2, 3), value), "b": torch.full((3,), value)}


def _push(s: ParameterStore, worker: str, step: int, grads: dict[str, torch.Tensor], keys: tuple[str, ...] = ("w", "b")):
    return s.push(worker, Push(step, 4, len(s.params), {k: FP32.encode(grads[k]) for k in keys}))


def _snapshot(s: ParameterStore) -> dict[str, object]:
    return {"params": {k: v.clone() for k, v in s.params.items()}, "opt": _clone(s._core.optimizer.state_dict())}  # type: ignore[union-attr]


def _clone(v: object) -> object:
    if isinstance(v, torch.Tensor):
        return v.clone()
    if isinstance(v, dict):
        return {k: _clone(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clone(x) for x in v]
    return v


def _same(a: object, b: object) -> bool:
    """Bit-for-bit equal nested state (NaN-free by construction)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _finite(s: ParameterStore) -> bool:
    check_update(s._core.optimizer, s.params.values())  # type: ignore[arg-type]
    return True


# --- gradients, checked in the parameters' dtype ---------------------------------------------


def test_float64_gradient_that_is_inf_as_float32_is_refused() -> None:
    """The issue's measurement: float64 1e300 is finite, and +Inf once cast to the float32 params."""
    s = _store()
    before = _snapshot(s)
    big = make_codec("fp32").encode(torch.full((2, 3), 1e300, dtype=torch.float64))
    assert big.dtype == "float64"
    with pytest.raises(ProtocolError) as err:
        s.push("a", Push(0, 4, 2, {"w": big}))
    assert err.value.code == "non-finite" and "float32" in err.value.reason
    assert not s._core.pending and _same(before, _snapshot(s))


def test_float64_gradient_is_applied_as_float32() -> None:
    s = _store(workers=("a",))
    grads = {k: v.to(torch.float64) for k, v in _grads(0.25).items()}
    s.push("a", Push(0, 4, 2, {k: FP32.encode(v) for k, v in grads.items()}))
    assert s.version == 1 and all(p.dtype == torch.float32 for p in s.params.values())
    ref = _store(workers=("a",))
    _push(ref, "a", 0, _grads(0.25))
    assert all(torch.equal(s.params[k], ref.params[k]) for k in s.params)


def test_float64_initial_value_that_is_inf_as_float32_is_refused() -> None:
    s = ParameterStore()
    with pytest.raises(ProtocolError) as err:
        s.initialize({"w": FP32.encode(torch.full((2,), 1e300, dtype=torch.float64))}, SGD)
    assert err.value.code == "non-finite" and not s.initialized


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_float16_inf_and_nan_are_refused(value: float) -> None:
    s = _store()
    with pytest.raises(ProtocolError) as err:
        s.push("a", Push(0, 4, 2, {"w": make_codec("fp32").encode(torch.full((2, 3), value, dtype=torch.float16))}))
    assert err.value.code == "non-finite"


# --- the update, checked before it counts ----------------------------------------------------


def test_a_step_whose_parameters_would_overflow_is_refused_whole() -> None:
    s = _store(BIG_LR, workers=("a", "b"))
    before = _snapshot(s)
    assert _push(s, "a", 0, _grads(HUGE)) is None
    with pytest.raises(UpdateRefused) as err:
        _push(s, "b", 0, _grads(HUGE))
    assert err.value.code == "non-finite-update"
    assert s.version == 0 and s.refused_updates == 1 and not s._core.pending
    assert _same(before, _snapshot(s))
    # both workers' pulls for version 1 are told; after a resync the step runs as if nothing happened
    assert s.refused("a", 0) and s.refused("b", 0) and s.refused("c", 0) is None
    _push(s, "a", 0, _grads(0.5))
    assert s.refused("a", 0) is None and s.refused("b", 0)  # a pushed again: it resynced
    assert _push(s, "b", 0, _grads(0.5)) is not None
    clean = _store(BIG_LR, workers=("a", "b"))
    _push(clean, "a", 0, _grads(0.5))
    _push(clean, "b", 0, _grads(0.5))
    assert _same(_snapshot(clean), _snapshot(s)) and s.version == 1


def test_momentum_overflow_from_finite_pushes_is_refused_and_state_is_unchanged() -> None:
    """The issue's second measurement: two finite pushes of 3e38 overflow SGD momentum."""
    s = _store(workers=("a",))
    _push(s, "a", 0, _grads(HUGE))  # buf = 3e38, w = 1 - 3e37: still finite
    assert s.version == 1 and _finite(s)
    before = _snapshot(s)
    with pytest.raises(UpdateRefused):
        _push(s, "a", 1, _grads(HUGE))  # buf = 0.9 * 3e38 + 3e38 = Inf
    assert s.version == 1 and _same(before, _snapshot(s)) and _finite(s)
    assert s._core.guard.guarded_steps == 2  # neither huge step was provably safe: both were copied and checked


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_adam_second_moment_overflow_is_refused(name: str) -> None:
    """(1 - beta2) * grad**2 overflows for |grad| > ~6e20: the parameters would stay finite, the state would not."""
    s = _store({"name": name, "lr": 0.01}, workers=("a",))
    _push(s, "a", 0, _grads(1.0))
    before = _snapshot(s)
    with pytest.raises(UpdateRefused):
        _push(s, "a", 1, _grads(1e30))
    assert _same(before, _snapshot(s)) and s.version == 1
    _push(s, "a", 1, _grads(1.0))
    assert s.version == 2 and _finite(s)


def test_first_step_refused_leaves_no_optimizer_state() -> None:
    s = _store({"name": "adam", "lr": 0.01}, workers=("a",))
    with pytest.raises(UpdateRefused):
        _push(s, "a", 0, _grads(1e30))
    assert s._core.optimizer.state_dict()["state"] == {}  # type: ignore[union-attr]


def test_ordinary_steps_take_the_unguarded_path_and_match_plain_torch() -> None:
    for opt in (SGD | {"nesterov": True, "weight_decay": 0.01}, {"name": "adam", "lr": 0.01, "weight_decay": 0.01}, {"name": "adamw", "lr": 0.01}):
        s = _store(opt, workers=("a",))
        ref = {k: v.clone().requires_grad_() for k, v in s.params.items()}
        ref_opt = s.optimizer_settings.build(list(ref.values()))  # type: ignore[union-attr]
        for step in range(4):
            g = _grads(0.1 * (step + 1))
            _push(s, "a", step, g)
            for k, p in ref.items():
                p.grad = g[k].clone()
            ref_opt.step()
        assert s._core.guard.guarded_steps == 0, opt
        assert all(torch.equal(s.params[k], ref[k].detach()) for k in ref), opt


def test_pipelined_step_refused_late_undoes_keys_applied_ahead() -> None:
    s = _store(BIG_LR, workers=("a", "b"))
    before = _snapshot(s)
    bad = {"w": torch.full((2, 3), 0.5), "b": torch.full((3,), HUGE)}
    assert s.want(["w"], 0) == 0
    _push(s, "a", 0, bad, ("w",))
    _push(s, "b", 0, bad, ("w",))
    assert s.applied_keys == 1 and s._core.optimizer.state_dict()["state"]  # type: ignore[union-attr]
    assert s.applied_keys == 1 and not torch.equal(s.params["w"], before["params"]["w"])  # type: ignore[index]
    _push(s, "a", 0, bad, ("b",))
    with pytest.raises(UpdateRefused):
        _push(s, "b", 0, bad, ("b",))  # "b" would be -3e39: the whole step goes, "w" included
    assert s.applied_keys == 0 and s.version == 0 and _same(before, _snapshot(s))
    assert all(torch.equal(s.shadow[k], before["params"][k]) for k in s.params)  # type: ignore[index]
    for w in ("a", "b"):
        _push(s, w, 0, _grads(0.5))
    assert s.version == 1 and _finite(s)


def test_pipelined_refusal_triggered_by_a_keyed_pull_is_raised_to_it() -> None:
    s = _store(BIG_LR, workers=("a", "b"))
    _push(s, "a", 0, {"w": torch.full((2, 3), HUGE)}, ("w",))
    _push(s, "b", 0, {"w": torch.full((2, 3), HUGE)}, ("w",))
    with pytest.raises(UpdateRefused):
        s.want(["w"], 0)
    assert s.refused_updates == 1 and not s._core.pending and s.refused("a", 0) and s.refused("b", 0)


def test_refusal_on_leave_and_on_barrier_timeout_is_not_raised() -> None:
    for how in ("leave", "timeout"):
        s = _store(BIG_LR, workers=("a", "b", "c"))
        before = _snapshot(s)
        _push(s, "a", 0, _grads(HUGE))
        _push(s, "b", 0, _grads(HUGE))
        if how == "leave":
            assert s.leave("c") is None
        else:
            assert s.drop_incomplete() == (["c"], None)
        assert s.refused_updates == 1 and s.live == {"a", "b"} and _same(before, _snapshot(s))


def test_async_mode_refuses_only_the_pushing_workers_gradient() -> None:
    s = _store(workers=("a", "b"), staleness=2)
    _push(s, "a", 0, _grads(HUGE))
    _push(s, "b", 1, {"w": torch.full((2, 3), 0.5)}, ("w",))  # b's partial push stays pending
    before, clock = _snapshot(s), dict(s.clocks)
    with pytest.raises(UpdateRefused):
        _push(s, "a", 1, _grads(HUGE))
    assert _same(before, _snapshot(s)) and s.clocks == clock and s.version == 1
    assert "a" not in s._core.pending and "b" in s._core.pending


def test_checkpoint_with_non_finite_values_is_refused() -> None:
    s = _store(workers=("a",))
    _push(s, "a", 0, _grads(0.5))
    state = s.state()
    state["params"]["w"][0, 0] = math.inf  # type: ignore[index]
    with pytest.raises(ProtocolError) as err:
        ParameterStore().restore(state)
    assert err.value.code == "checkpoint" and "NaN/Inf" in err.value.reason


# --- the guard's parts -------------------------------------------------------------------------


def test_amax_abs_sees_nan_and_inf_and_empty_tensors() -> None:
    assert amax_abs([torch.tensor([1.0, -3.0]), torch.zeros(0)]) == 3.0
    assert amax_abs([]) == 0.0
    assert amax_abs([torch.tensor([1.0, math.nan])]) == math.inf
    assert amax_abs([torch.tensor([-math.inf])]) == math.inf


def test_amax_each_is_one_value_per_tensor() -> None:
    assert amax_each([torch.tensor([2.0, -5.0]), torch.zeros(0), torch.tensor([math.nan])]) == [5.0, 0.0, math.inf]


def test_unknown_optimizer_is_always_checked() -> None:
    p = torch.ones(3, requires_grad=True)
    opt = torch.optim.RMSprop([p], lr=0.1)
    p.grad = torch.full((3,), 0.1)
    guard = StepGuard()
    guard.step(opt, {"p": p}, ["p"])
    assert guard.guarded_steps == 1 and torch.isfinite(p).all()


@pytest.mark.parametrize(
    "opt",
    [SGD, SGD | {"nesterov": True, "weight_decay": 0.3}, {"name": "sgd", "lr": 0.5, "momentum": 0.0, "weight_decay": 0.1},
     {"name": "adam", "lr": 0.1, "weight_decay": 0.2}, {"name": "adamw", "lr": 0.3, "weight_decay": 0.5}],
)  # fmt: skip
def test_carried_bounds_stay_above_the_true_magnitudes_and_are_measured_once(opt: dict) -> None:
    """The bounds the guard carries from step to step (instead of reading parameters and state)
    are upper bounds of what torch actually computes, step after step."""
    s = _store(opt, workers=("a",))
    gen = torch.Generator().manual_seed(0)
    guard = s._core.guard
    for step in range(30):
        scale = 10.0 ** float(torch.randint(-3, 4, (), generator=gen))
        _push(s, "a", step, {k: torch.randn(v.shape, generator=gen) * scale for k, v in s.params.items()})
        for key, param in s.params.items():
            bound_p, bound_state = guard._bounds[key]
            state = [v for n, v in s._core.optimizer.state[param].items() if n != "step"]  # type: ignore[union-attr]
            assert amax_abs([param]) <= bound_p and all(amax_abs([t]) <= b for t, b in zip(state, bound_state)), (step, key)
    assert guard.measured == len(s.params) and guard.guarded_steps == 0  # measured at the first step only
