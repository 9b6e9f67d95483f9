"""`all_finite`: the fast sum check never lets a NaN or Inf through, and never refuses finite
values whose sum overflows."""

from __future__ import annotations

import pytest
import torch

from netsense.ps.store.core import all_finite


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_any_non_finite_element_is_found(dtype: torch.dtype, bad: float) -> None:
    for pos in (0, 4095, 100_000):
        t = torch.randn(100_001).to(dtype)
        t[pos] = bad
        assert not all_finite(t)
    both = torch.zeros(10, dtype=dtype)
    both[2], both[7] = float("inf"), float("-inf")  # sum is NaN, not Inf
    assert not all_finite(both)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_finite_values_whose_sum_overflows_pass(dtype: torch.dtype) -> None:
    t = torch.full((1000,), torch.finfo(dtype).max, dtype=dtype)
    assert not torch.isfinite(t.sum())
    assert all_finite(t)
    assert all_finite(torch.randn(1000).to(dtype)) and all_finite(torch.empty(0, dtype=dtype))
