from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from netsense.compression import ErrorFeedback, make_codec

LOSSY = ["topk:0.05", "topka:0.05+fp16", "qsgd:2", "randk:0.1+q8", "threshold:1.5", "powersgd:1", "fp16"]


@settings(max_examples=20, deadline=None)
@given(spec=st.sampled_from(LOSSY), dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=st.integers(0, 2**16))
def test_mass_is_conserved(spec: str, dtype: torch.dtype, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    feedback = ErrorFeedback()
    codec = make_codec(spec)
    sent = torch.zeros(12, 30, dtype=torch.float64)
    inputs = torch.zeros(12, 30, dtype=torch.float64)
    for _ in range(6):
        grad = torch.randn(12, 30, generator=gen).to(dtype)
        _, decoded = feedback.compress("w", grad, codec)
        assert decoded.dtype == dtype and decoded.shape == grad.shape
        sent += decoded.double()
        inputs += grad.double()
    residual = feedback.residual("w")
    assert residual is not None
    # Float tolerance: the fp32 residual and the cast of (grad + residual) to the grad dtype.
    torch.testing.assert_close(sent + residual.double(), inputs, atol=1e-4, rtol=1e-5)


def test_lossless_skips_residual_and_flushes_old_one() -> None:
    feedback = ErrorFeedback()
    grad = torch.randn(100)
    feedback.compress("k", grad, make_codec("topk:0.1"))
    left = feedback.residual("k").clone()
    assert float(left.norm()) > 0
    _, decoded = feedback.compress("k", grad, make_codec("fp32"))
    assert torch.equal(decoded, grad + left)
    assert feedback.residual("k") is None
    _, decoded = feedback.compress("k", grad, make_codec("fp32"))
    assert torch.equal(decoded, grad)


def test_grad_not_mutated() -> None:
    grad = torch.randn(200)
    copy = grad.clone()
    feedback = ErrorFeedback(momentum=0.9)
    for spec in ("topk:0.1", "fp32", "topk:0.1"):
        feedback.compress("k", grad, make_codec(spec))
    ErrorFeedback().compress("k", grad, make_codec("topk:0.1"))
    assert torch.equal(grad, copy)


def test_reset_and_residual_norm() -> None:
    feedback = ErrorFeedback(momentum=0.5)
    codec = make_codec("topk:0.1")
    feedback.compress("a", torch.ones(10) * torch.arange(10.0), codec)
    feedback.compress("b", torch.ones(4), codec)
    ra, rb = feedback.residual("a"), feedback.residual("b")
    expect = (float(ra.square().sum()) + float(rb.square().sum())) ** 0.5
    assert feedback.residual_norm() == pytest.approx(expect)
    feedback.reset("a")
    assert feedback.residual("a") is None and feedback.residual("b") is not None
    feedback.reset()
    assert feedback.residual_norm() == 0.0


def test_momentum_correction_accumulates_and_masks_sent_coordinates() -> None:
    feedback = ErrorFeedback(momentum=0.9)
    codec = make_codec("topk:0.5")
    grad = torch.tensor([4.0, 3.0, 0.1, 0.2])
    _, first = feedback.compress("k", grad, codec)
    assert torch.equal(first, torch.tensor([4.0, 3.0, 0.0, 0.0]))
    _, second = feedback.compress("k", grad, codec)
    # Sent coordinates restarted: velocity = grad there; unsent: 0.9 * grad + grad, plus residual.
    velocity = torch.tensor([4.0, 3.0, 0.19, 0.38])
    residual = torch.tensor([0.0, 0.0, 0.1, 0.2])
    assert torch.allclose(second + feedback.residual("k"), velocity + residual)


def test_momentum_zero_equals_plain_feedback() -> None:
    a, b = ErrorFeedback(), ErrorFeedback(momentum=0.0)
    codec = make_codec("topk:0.2")
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        grad = torch.randn(50, generator=gen)
        assert torch.equal(a.compress("k", grad, codec)[1], b.compress("k", grad, codec)[1])


def test_invalid_momentum() -> None:
    with pytest.raises(ValueError):
        ErrorFeedback(momentum=1.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_residual_stays_on_device() -> None:
    feedback = ErrorFeedback(momentum=0.9)
    grad = torch.randn(1000, device="cuda")
    _, decoded = feedback.compress("k", grad, make_codec("topka:0.01+fp16"))
    assert decoded.device.type == "cuda" and feedback.residual("k").device.type == "cuda"
