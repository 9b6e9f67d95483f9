"""`launch --servers S` refuses a layout with a shard that owns no key, before any process starts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from netsense.errors import ConfigError
from netsense.launch.shardcheck import check_shards


def _task(*sizes: int) -> SimpleNamespace:
    def build() -> torch.nn.Module:
        model = torch.nn.Module()
        for i, n in enumerate(sizes):
            model.register_parameter(f"p{i}", torch.nn.Parameter(torch.zeros(n)))
        return model

    return SimpleNamespace(build_model=build)


def test_zero_size_keys_can_leave_a_shard_empty_even_with_enough_keys() -> None:
    # 3 keys for 3 shards, but the two empty ones both go to shard 1 (ties go to the lowest index)
    with pytest.raises(ConfigError, match="has 3 parameter keys, and shard 2 would own none; use at most 2"):
        check_shards(_task(100, 0, 0), "m", 3)  # type: ignore[arg-type]


def test_a_layout_where_every_shard_owns_a_key_passes() -> None:
    check_shards(_task(100, 50, 50), "m", 3)  # type: ignore[arg-type]
    check_shards(_task(1), "m", 1)  # type: ignore[arg-type]
