"""`NetSenseOptimizer` is a torch optimizer wherever torch looks: schedulers, GradScaler,
state_dict, param groups, the closure contract; and its groups become each step's PUSH fields."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from netsense.compression import make_codec
from netsense.errors import ConfigError
from netsense.transport.wire import Push, decode_message, encode_message
from netsense.worker.hparams import group_defaults, step_fields, wire_group
from netsense.worker.layout import key_layout
from netsense.worker.optimizer import NetSenseOptimizer

RunningPS = Any  # the `ps` fixture of tests/conftest.py (this folder is not a package)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def _loss(m: torch.nn.Module) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return m(torch.randn(5, 4, generator=g)).square().mean()


# --- without a PS -----------------------------------------------------------------------------


def test_group_defaults_follow_the_ps_defaults() -> None:
    from netsense.ps.optim import OptimizerSettings

    ps = OptimizerSettings()
    assert group_defaults({}) == {"lr": ps.lr, "momentum": ps.momentum, "weight_decay": ps.weight_decay, "nesterov": False}
    adam = group_defaults({"name": "adamw", "lr": 0.001, "beta2": 0.99})
    assert adam == {"lr": 0.001, "betas": (ps.beta1, 0.99), "eps": ps.eps, "weight_decay": 0.0}
    with pytest.raises(ConfigError, match="unknown"):
        group_defaults({"name": "lbfgs"})


def test_step_fields_map_keys_to_groups_and_round_trip_the_wire() -> None:
    m = _model()
    slots = key_layout(m, chunk_elems=4)  # weights are split into chunks: 0.weight#0..2, 1.weight#0..1
    groups = [{"params": list(m[0].parameters()), "lr": 0.1, "momentum": 0.5, "weight_decay": 0.0},
              {"params": list(m[1].parameters()), "lr": torch.tensor(0.01), "momentum": 0.0, "weight_decay": 1e-4}]  # fmt: skip
    fields = step_fields("sgd", groups, slots)
    assert fields.hparams == ({"lr": 0.1, "momentum": 0.5, "weight_decay": 0.0}, {"lr": pytest.approx(0.01), "momentum": 0.0, "weight_decay": 1e-4})
    assert set(fields.key_groups) == {"1.weight#0", "1.weight#1", "1.bias"} and set(fields.key_groups.values()) == {1}
    fp32 = make_codec("fp32")
    grads = {k: fp32.encode(torch.zeros(2)) for k in ("0.bias", "1.weight#1")}
    msg = decode_message(encode_message(fields.push(3, 5, len(slots), grads)))
    assert isinstance(msg, Push) and msg.hparams == fields.hparams and not msg.skip
    assert msg.groups == {"1.weight#1": 1}  # only this push's keys, and only outside group 0


@pytest.mark.parametrize("lr", [float("nan"), float("inf"), -0.1, 1e9])
def test_a_group_value_the_ps_would_refuse_is_a_local_config_error(lr: float) -> None:
    with pytest.raises(ConfigError, match="param group 0"):
        wire_group("sgd", {"lr": lr, "momentum": 0.9, "weight_decay": 0.0}, 0)


# --- against a PS ----------------------------------------------------------------------------


def test_it_is_an_optimizer_for_schedulers_and_scalers(ps: RunningPS) -> None:
    m = _model()
    with NetSenseOptimizer(m, connect=ps.connect_settings(), optimizer={"name": "sgd", "lr": 0.1}) as opt:
        assert isinstance(opt, torch.optim.Optimizer)
        assert len(opt.param_groups) == 1 and opt.param_groups[0]["lr"] == 0.1 and opt.defaults["momentum"] == 0.9
        torch.optim.lr_scheduler.StepLR(opt, step_size=1)
        torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.2, total_steps=10)  # needs momentum in the defaults
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
        scaler = torch.amp.GradScaler("cpu")
        opt.zero_grad()
        scaler.scale(_loss(m)).backward()
        stats = scaler.step(opt, samples=5)
        scaler.update()
        assert stats is not None and stats.version == 1 and not stats.skipped


def test_the_step_lr_reaches_the_ps(ps: RunningPS) -> None:
    """lr 0 for one step: the PS must not move the parameters; the next step's lr moves them again."""
    m = _model()
    with NetSenseOptimizer(m, connect=ps.connect_settings(), optimizer={"name": "sgd", "lr": 0.1, "momentum": 0.0}) as opt:
        before = [p.detach().clone() for p in m.parameters()]
        opt.param_groups[0]["lr"] = 0.0
        opt.zero_grad()
        _loss(m).backward()
        opt.step(samples=5)
        assert all(torch.equal(a, p) for a, p in zip(before, m.parameters()))
        opt.param_groups[0]["lr"] = 0.1
        opt.zero_grad()
        _loss(m).backward()
        opt.step(samples=5)
        assert not all(torch.equal(a, p) for a, p in zip(before, m.parameters()))


def test_state_dict_round_trip_carries_the_schedule(ps: RunningPS) -> None:
    m = _model()
    with NetSenseOptimizer(m, connect=ps.connect_settings(), optimizer={"name": "adam", "lr": 0.01}) as opt:
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        for _ in range(2):
            opt.zero_grad()
            _loss(m).backward()
            opt.step(samples=5)
            sched.step()
        saved, saved_sched = opt.state_dict(), sched.state_dict()
        assert saved["param_groups"][0]["lr"] == pytest.approx(0.0025) and saved["state"] == {}
    m2 = _model()
    with NetSenseOptimizer(m2, connect=ps.connect_settings(), rank=1, worker_id="restart", optimizer={"name": "adam", "lr": 0.01}) as opt2:
        assert opt2.param_groups[0]["lr"] == 0.01
        opt2.load_state_dict(saved)
        sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=1, gamma=0.5)
        sched2.load_state_dict(saved_sched)
        assert opt2.param_groups[0]["lr"] == pytest.approx(0.0025) and opt2.param_groups[0]["betas"] == (0.9, 0.999)
        sched2.step()
        assert opt2.param_groups[0]["lr"] == pytest.approx(0.00125)


def test_closure_contract_and_positional_samples(ps: RunningPS) -> None:
    m = _model()
    with NetSenseOptimizer(m, connect=ps.connect_settings(), optimizer={"name": "sgd", "lr": 0.1}) as opt:

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = _loss(m)
            loss.backward()
            return loss

        loss = opt.step(closure, samples=5)
        assert isinstance(loss, torch.Tensor) and opt.last.version == 1 == opt.version
        with pytest.raises(ConfigError, match="samples=n"):
            opt.step(5)  # type: ignore[arg-type]


def test_param_groups_must_cover_the_model_exactly(ps: RunningPS) -> None:
    m = _model()
    with pytest.raises(ConfigError, match="in no param group"):
        NetSenseOptimizer(m, connect=ps.connect_settings(), params=list(m[0].parameters()))
    with pytest.raises(ConfigError, match="not trainable parameters of the model"):
        NetSenseOptimizer(m, connect=ps.connect_settings(), params=[*m.parameters(), torch.nn.Parameter(torch.zeros(2))])



def test_gradscaler_unscale_first_then_local_clip(ps: RunningPS) -> None:
    """``scaler.unscale_(opt)`` before ``scaler.step(opt)`` (to clip locally): the grads are not
    unscaled twice, and the update equals a stock optimizer's under the same calls."""
    m, ref = _model(), _model()
    settings = {"name": "sgd", "lr": 0.1, "momentum": 0.0}
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.0)
    with NetSenseOptimizer(m, connect=ps.connect_settings(), optimizer=settings) as opt:
        for model, o, kw in ((m, opt, {"samples": 5}), (ref, ref_opt, {})):
            scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
            o.zero_grad()
            scaler.scale(_loss(model)).backward()
            scaler.unscale_(o)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
            scaler.step(o, **kw)
            scaler.update()
    for a, b in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-6, atol=1e-7)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (scripts/gpu-check.sh runs it on a GPU machine)")
def test_gradscaler_on_cuda_unscales_and_skips(ps: RunningPS) -> None:
    m, ref = _model().cuda(), _model().cuda()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    with NetSenseOptimizer(m, connect=ps.connect_settings(), optimizer={"name": "sgd", "lr": 0.1}) as opt:
        for step in range(3):
            for model, o, kw in ((m, opt, {"samples": 5}), (ref, ref_opt, {})):
                scaler = torch.amp.GradScaler("cuda", init_scale=256.0)
                o.zero_grad()
                with torch.autocast("cuda", dtype=torch.float16):
                    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(step)).cuda()
                    loss = model(x).float().square().mean()
                scaler.scale(loss).backward()
                if step == 1:
                    model[0].weight.grad[0, 0] = float("inf")
                scaler.step(o, **kw)
                scaler.update()
            assert opt.last.skipped == (step == 1)
    for a, b in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)
