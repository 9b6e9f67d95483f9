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


def test_several_measures_balance_each_where_one_alone_would_not() -> None:
    # (elements, factors): by elements alone both small keys join the lighter matrix's shard,
    # which then holds 22 of the 24 factor elements.
    sizes = [("A", (100, 2)), ("B", (90, 2)), ("c", (1, 10)), ("d", (1, 10))]
    assert assign_shards([(k, v[0]) for k, v in sizes], 2) == {"A": 0, "B": 1, "c": 1, "d": 1}
    owner = assign_shards(sizes, 2)
    assert owner == {"A": 0, "B": 1, "c": 1, "d": 0}
    for m in (0, 1):
        assert shard_loads(owner, [(k, v[m]) for k, v in sizes], 2) in ([101, 91], [12, 12])


@pytest.mark.parametrize("shards", [2, 3, 5])
def test_one_measure_twice_is_the_same_answer_as_once(shards: int) -> None:
    rng = random.Random(shards)
    sizes = [(f"k{i}", rng.randint(0, 1 << 16)) for i in range(40)]
    assert assign_shards([(k, (v, v)) for k, v in sizes], shards) == assign_shards(sizes, shards)


def test_several_measures_are_deterministic_and_cover_every_key() -> None:
    rng = random.Random(7)
    sizes = [(f"k{i}", (rng.randint(1, 1 << 20), rng.randint(1, 4000), rng.randint(0, 9000))) for i in range(80)]
    owner = assign_shards(sizes, 4)
    assert owner == assign_shards(list(sizes), 4) and set(owner) == {k for k, _ in sizes}
    assert set(owner.values()) == {0, 1, 2, 3}


def test_rejects_sizes_of_unequal_measures() -> None:
    with pytest.raises(ValueError, match="sizes"):
        assign_shards([("a", (1, 2)), ("b", (3,))], 2)
    with pytest.raises(ValueError, match="negative"):
        assign_shards([("a", (1, -2))], 2)
