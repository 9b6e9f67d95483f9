"""A non-finite local gradient (worker/encoding.py): one WARNING with the key and the step, a
count in StepStats and the metrics, and the key pushed as zero (under error feedback: the residual
alone), so the barrier is kept and nothing non-finite reaches the PS or the residual."""

from __future__ import annotations

import logging

import pytest
import torch

from netsense.compression import make_codec
from netsense.metrics import WorkerCollector
from netsense.worker.encoding import GradientEncoder
from netsense.worker.layout import key_layout
from netsense.worker.optimizer import NetSenseOptimizer


class _NoUplink:
    """GradientEncoder.encode needs no policy."""


def _encoder() -> tuple[GradientEncoder, torch.nn.Module]:
    model = torch.nn.Linear(4, 3)
    return GradientEncoder(key_layout(model), _NoUplink(), version=lambda: 7), model  # type: ignore[arg-type]


def test_a_nan_gradient_is_pushed_as_zero_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    enc, _ = _encoder()
    key = enc.slots[0].key
    bad = torch.ones(enc.slots[0].shape)
    bad[0, 0] = float("nan")
    with caplog.at_level(logging.WARNING, logger="netsense.worker.encoding"):
        payload, source = enc.encode(key, bad, "fp32")
    assert torch.equal(make_codec("fp32").decode(payload), torch.zeros_like(bad)) and torch.equal(source, torch.zeros_like(bad))
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert key in record.getMessage() and "step 7" in record.getMessage()
    assert enc.nonfinite == 1 and enc.take_counts() == (1, 0) and enc.take_counts() == (0, 0)


def test_under_error_feedback_an_inf_gradient_sends_the_residual_alone() -> None:
    enc, _ = _encoder()
    key = enc.slots[0].key
    codec = make_codec("qsgd:4")
    g = torch.randn(enc.slots[0].shape, generator=torch.Generator().manual_seed(0))
    enc.encode(key, g, "qsgd:4")
    assert enc.feedback is not None
    residual = enc.feedback.residual(key).clone()
    bad = g.clone()
    bad[1, 2] = float("inf")
    payload, source = enc.encode(key, bad, "qsgd:4")
    sent = codec.decode(payload)
    assert torch.isfinite(sent).all() and torch.allclose(sent, source)
    after = enc.feedback.residual(key)
    assert torch.isfinite(after).all()
    torch.testing.assert_close(sent + after, residual)  # zero gradient + the old residual: nothing lost, nothing made up
    assert enc.nonfinite == 1


def test_a_step_with_a_nan_key_keeps_the_barrier_and_the_model_finite(ps) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    with NetSenseOptimizer(model, connect=ps.connect_settings(), worker_id="w0", optimizer={"name": "sgd", "lr": 1.0}) as opt:
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        model.weight.grad = torch.full_like(model.weight, float("nan"))
        model.bias.grad = torch.ones_like(model.bias)
        stats = opt.step(samples=1, codec="fp32")  # before the fix: PeerError non-finite, the worker dies
        assert stats.version == 1 and stats.nonfinite == 1 and opt.nonfinite_keys == 1
        torch.testing.assert_close(model.weight.detach(), before["weight"], rtol=0, atol=0)  # the NaN key moved nothing
        torch.testing.assert_close(model.bias.detach(), before["bias"] - 1.0)  # the finite key applied as usual
        assert ps.server.errors_sent == 0
        metrics = {m.name: m.samples[0].value for m in WorkerCollector(opt).collect() if m.samples}
        assert metrics["netsense_worker_nonfinite_keys"] == 1


def test_values_clamped_by_a_16_bit_cast_are_counted(ps) -> None:  # type: ignore[no-untyped-def]
    model = torch.nn.Linear(4, 3)
    with NetSenseOptimizer(model, connect=ps.connect_settings(), worker_id="w0", optimizer={"name": "sgd", "lr": 1e-9}) as opt:
        model.weight.grad = torch.zeros_like(model.weight)
        model.weight.grad[0, 0] = 1e6  # beyond fp16's 65504
        model.bias.grad = torch.zeros_like(model.bias)
        stats = opt.step(samples=1, codec="fp16")
        assert stats.clamped == 1 and stats.nonfinite == 0 and opt.clamped_values == 1
        metrics = {m.name: m.samples[0].value for m in WorkerCollector(opt).collect() if m.samples}
        assert metrics["netsense_worker_clamped_values"] == 1
