"""The store's per-step hyper-parameters, skip pushes and global-norm clipping: each equals what
torch does in one process, and a push that would break them is refused whole."""

from __future__ import annotations

import pytest
import torch

from netsense.compression import make_codec
from netsense.errors import ConfigError, ProtocolError
from netsense.ps.optim import OptimizerSettings
from netsense.ps.store import ParameterStore
from netsense.transport.wire import Push

FP32 = make_codec("fp32")
SGD = {"name": "sgd", "lr": 0.1, "momentum": 0.9}


def _store(optimizer: dict | None = None, workers: tuple[str, ...] = ("a", "b"), staleness: int | None = None) -> ParameterStore:
    s = ParameterStore(staleness=staleness)
    torch.manual_seed(0)
    s.initialize({"w": FP32.encode(torch.randn(2, 3)), "b": FP32.encode(torch.randn(3))}, optimizer or SGD, len(workers))
    for w in workers:
        s.join(w)
    return s


def _grads(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(2, 3, generator=g), "b": torch.randn(3, generator=g)}


def _push(s: ParameterStore, worker: str, step: int, grads: dict[str, torch.Tensor], hparams: tuple = (), groups: dict | None = None,
          samples: int = 4, skip: bool = False):  # fmt: skip
    msg = Push(step, samples, 2, {k: FP32.encode(v) for k, v in grads.items()}, hparams, groups or {}, skip)
    return s.push(worker, msg)


def _reference(params: dict[str, torch.Tensor], make, steps: list[tuple[dict[str, torch.Tensor], dict]], clip: float = 0.0):  # type: ignore[no-untyped-def]
    """torch in one process: each step's (gradient, per-key param-group overrides)."""
    ref = {k: torch.nn.Parameter(v.clone()) for k, v in params.items()}
    opt = make([ref["w"], ref["b"]])
    for grads, lrs in steps:
        for k, p in ref.items():
            p.grad = grads[k].clone()
        if clip:
            torch.nn.utils.clip_grad_norm_(list(ref.values()), clip)
        opt.param_groups[0].update(lrs)
        opt.step()
    return ref


def test_a_steps_hyper_parameters_apply_to_that_step_only() -> None:
    s = _store(workers=("a",))
    start = {k: v.clone() for k, v in s.params.items()}
    g0, g1 = _grads(0), _grads(1)
    _push(s, "a", 0, g0, ({"lr": 0.5, "momentum": 0.0, "weight_decay": 0.1},))
    _push(s, "a", 1, g1)  # a push without hyper-parameters: INIT's settings
    steps = [(g0, {"lr": 0.5, "momentum": 0.0, "weight_decay": 0.1}), (g1, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0})]
    ref = _reference(start, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), steps)
    for k in ("w", "b"):
        torch.testing.assert_close(s.params[k], ref[k].detach(), rtol=0, atol=0)
    assert s.optimizer_settings is not None and s.optimizer_settings.lr == 0.1
    assert s.state()["optimizer_state"]["param_groups"][0]["lr"] == 0.1  # checkpoints keep INIT's


def test_groups_give_keys_their_own_hyper_parameters() -> None:
    """Key b in group 1 (lr 0, i.e. frozen this step), w in group 0; Adam's betas by wire name."""
    s = _store({"name": "adam", "lr": 0.01}, workers=("a",))
    before = s.params["b"].clone()
    groups = ({"lr": 0.02, "beta1": 0.5, "beta2": 0.9, "eps": 1e-6, "weight_decay": 0.0},
              {"lr": 0.0, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0})  # fmt: skip
    _push(s, "a", 0, _grads(0), groups, {"b": 1})
    assert torch.equal(s.params["b"], before)
    opt = s._core.optimizer  # noqa: SLF001 - the group is back at INIT's values after the step
    assert opt is not None and opt.param_groups[0]["betas"] == (0.9, 0.999) and opt.param_groups[0]["lr"] == 0.01


def test_workers_of_a_sync_step_must_agree() -> None:
    s = _store()
    _push(s, "a", 0, _grads(0), ({"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0},))
    with pytest.raises(ProtocolError) as err:
        _push(s, "b", 0, _grads(1), ({"lr": 0.2, "momentum": 0.9, "weight_decay": 0.0},))
    assert err.value.code == "hparams" and "'a'" in str(err.value)
    assert s.version == 0 and "b" not in s._core.pending  # noqa: SLF001 - refused whole
    assert _push(s, "b", 0, _grads(1), ({"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0},)) is not None


def test_async_workers_each_bring_their_own() -> None:
    s = _store(staleness=2)
    _push(s, "a", 0, _grads(0), ({"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0},))
    assert _push(s, "b", 0, _grads(1), ({"lr": 0.2, "momentum": 0.9, "weight_decay": 0.0},)) is not None  # no agreement needed


@pytest.mark.parametrize("group", [{"beta1": 0.9}, {"lr": 0.1, "eps": 1e-8}])
def test_names_the_optimizer_does_not_take_are_refused(group: dict) -> None:
    s = _store()
    with pytest.raises(ProtocolError) as err:
        _push(s, "a", 0, _grads(0), (group,))
    assert err.value.code == "hparams" and not s._core.pending  # noqa: SLF001


def test_a_skipping_worker_sits_the_step_out() -> None:
    s = _store()
    start = {k: v.clone() for k, v in s.params.items()}
    g = _grads(0)
    assert _push(s, "b", 0, {}, skip=True) is None
    applied = _push(s, "a", 0, g, samples=3)
    assert applied is not None and applied.samples == 3 and applied.workers == ("a", "b")
    ref = _reference(start, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), [(g, {})])
    for k in ("w", "b"):
        assert torch.equal(s.params[k], ref[k].detach())
    with pytest.raises(ProtocolError, match="only push"):  # a skip and gradients in one step
        _push(s, "b", 1, {"w": g["w"]})
        _push(s, "b", 1, {}, skip=True)


def test_a_step_everyone_skipped_changes_nothing_but_the_version() -> None:
    s = _store()
    start = {k: v.clone() for k, v in s.params.items()}
    _push(s, "a", 0, {}, skip=True)
    applied = _push(s, "b", 0, {}, skip=True)
    assert applied is not None and applied.version == 1 and applied.samples == 0
    assert all(torch.equal(s.params[k], start[k]) for k in start)
    assert s.pull(0).version == 1


@pytest.mark.parametrize("max_norm", [0.3, 100.0])
def test_clip_grad_norm_clips_the_mean_gradient(max_norm: float) -> None:
    s = _store({**SGD, "clip_grad_norm": max_norm})
    start = {k: v.clone() for k, v in s.params.items()}
    ga, gb = _grads(0), _grads(1)
    _push(s, "a", 0, ga, samples=1)
    _push(s, "b", 0, gb, samples=3)
    mean = {k: ga[k] * 0.25 + gb[k] * 0.75 for k in ga}
    ref = _reference(start, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), [(mean, {})], clip=max_norm)
    for k in ("w", "b"):
        torch.testing.assert_close(s.params[k], ref[k].detach(), rtol=1e-6, atol=1e-7)


def test_a_clipping_store_applies_no_key_ahead() -> None:
    """The norm needs every key: keyed pulls wait for the whole step, which is still exact."""
    s = _store({**SGD, "clip_grad_norm": 0.3})
    _push(s, "a", 0, {"w": _grads(0)["w"]})
    _push(s, "b", 0, {"w": _grads(1)["w"]})
    assert s.want(["w"], 0) == 0 and s.applied_keys == 0 and not s.keys_ready(["w"], 1)
    _push(s, "a", 0, {"b": _grads(0)["b"]})
    assert _push(s, "b", 0, {"b": _grads(1)["b"]}) is not None
    assert s.keys_ready(["w"], 1) and s.pull_keys(0, ["w"]).version == 1


@pytest.mark.parametrize(
    "bad",
    [{"clip_grad_norm": -1.0}, {"clip_grad_norm": float("inf")}, {"weight_decay": float("nan")}, {"eps": float("nan")}, {"weight_decay": float("inf")}],
)
def test_settings_refuse_non_finite_and_negative_values(bad: dict) -> None:
    with pytest.raises(ConfigError):
        OptimizerSettings.from_dict({"name": "sgd", **bad})
