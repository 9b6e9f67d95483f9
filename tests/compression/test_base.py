from __future__ import annotations

import pytest
import torch

from netsense.compression.base import bytes_to_tensor, empty_dense, tensor_to_bytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.uint8])
@pytest.mark.parametrize("numel", [0, 5, 3_000_001])
def test_empty_dense_is_a_writable_aligned_flat_tensor(dtype: torch.dtype, numel: int) -> None:
    out = empty_dense(numel, dtype, "cpu")
    assert out.shape == (numel,) and out.dtype == dtype and out.is_contiguous()
    assert out.data_ptr() % 64 == 0 or numel == 0
    out.fill_(3)
    assert bool((out == 3).all())
    other = empty_dense(numel, dtype, "cpu")
    other.fill_(1)
    assert bool((out == 3).all())  # separate memory


def test_bytes_round_trip_in_place_and_copied() -> None:
    x = torch.randn(1000)
    data = tensor_to_bytes(x)
    assert torch.equal(bytes_to_tensor(data, torch.float32, 1000, "cpu"), x)
    assert torch.equal(bytes_to_tensor(data, torch.float32, 1000, "cpu", copy=False), x)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_empty_dense_on_cuda() -> None:
    out = empty_dense(3_000_001, torch.float32, "cuda")
    assert out.device.type == "cuda" and out.numel() == 3_000_001
