"""The key -> shard assignment is deterministic, balanced by size, and covers every key once."""

from __future__ import annotations

import random

import pytest

from netsense.transport.sharding import assign_shards, shard_loads


def test_one_shard_owns_everything() -> None:
    sizes = [("a", 10), ("b", 0), ("c", 5)]
    assert assign_shards(sizes, 1) == {"a": 0, "b": 0, "c": 0}


def test_largest_first_onto_least_loaded_ties_by_index() -> None:
    sizes = [("small", 1), ("big", 100), ("mid", 60), ("mid2", 60)]
    # big -> 0; mid -> 1 (load 0); mid2 -> 1 (60 < 100); small -> 0 (100 < 120)
    assert assign_shards(sizes, 2) == {"big": 0, "mid": 1, "mid2": 1, "small": 0}


def test_equal_sizes_keep_layout_order() -> None:
    sizes = [(f"k{i}", 8) for i in range(6)]
    assert assign_shards(sizes, 3) == {"k0": 0, "k1": 1, "k2": 2, "k3": 0, "k4": 1, "k5": 2}


def test_more_shards_than_keys_leaves_shards_empty() -> None:
    assert assign_shards([("a", 3)], 4) == {"a": 0}


@pytest.mark.parametrize("shards", [2, 3, 4, 8])
def test_balanced_within_lpt_bound_and_deterministic(shards: int) -> None:
    rng = random.Random(shards)
    sizes = [(f"layer{i}.weight", rng.randint(1, 1 << 20)) for i in range(60)]
    owner = assign_shards(sizes, shards)
    assert owner == assign_shards(list(sizes), shards)  # same input -> same answer
    assert set(owner) == {k for k, _ in sizes}
    loads = shard_loads(owner, sizes, shards)
    total, biggest = sum(loads), max(s for _, s in sizes)
    # LPT: the heaviest shard exceeds the mean by at most one key
    assert max(loads) <= total / shards + biggest


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        assign_shards([("a", 1)], 0)
    with pytest.raises(ValueError):
        assign_shards([("a", 1), ("a", 2)], 2)
