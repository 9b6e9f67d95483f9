"""The key layout: row-block chunks, and tensors split for shard balance (`shard_layout`)."""

from __future__ import annotations

import torch

from netsense.transport.sharding import assign_shards, shard_loads
from netsense.worker.layout import MIN_SHARD_CHUNK_ELEMS, KeySlot, key_layout, shard_layout, shard_sizes


def _wide() -> torch.nn.Module:
    """One matrix is 88 % of the model (as the registry's wide-mlp)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 544), torch.nn.ReLU(), torch.nn.Linear(544, 544), torch.nn.Linear(544, 10))


def _loads(slots: list, shards: int) -> list[int]:  # type: ignore[type-arg]
    sizes = [(s.key, 4 * s.numel) for s in slots]
    return shard_loads(assign_shards(sizes, shards), sizes, shards)


def test_a_dominant_matrix_is_split_into_row_blocks_that_balance_the_shards() -> None:
    model = _wide()
    whole = key_layout(model)
    assert max(_loads(whole, 2)) > 3 * min(_loads(whole, 2))  # what whole tensors gave
    for shards in (2, 3, 4):
        slots = shard_layout(model, shards)
        loads = _loads(slots, shards)
        assert max(loads) <= 1.1 * min(loads), (shards, loads)
        total = sum(p.numel() for p in model.parameters())
        assert all(s.numel <= max(MIN_SHARD_CHUNK_ELEMS, -(-total // shards)) for s in slots)
    blocks = [s for s in shard_layout(model, 2) if s.name == "2.weight"]
    assert len(blocks) > 1 and all(s.shape[1:] == (544,) and s.numel == s.shape[0] * 544 for s in blocks)
    grad = torch.randn(544, 544)
    assert torch.equal(torch.cat([s.view(grad) for s in blocks]), grad)  # whole rows, in order, no gap


def test_one_shard_keeps_whole_tensors_and_small_models_are_not_shredded() -> None:
    model = _wide()
    assert [s.key for s in shard_layout(model, 1)] == [s.key for s in key_layout(model)]
    tiny = torch.nn.Linear(64, 64)  # 4k elements: below the least chunk, left whole
    assert [s.key for s in shard_layout(tiny, 4)] == ["weight", "bias"]


def test_a_vector_or_a_row_above_the_chunk_is_cut_flat() -> None:
    model = torch.nn.Module()
    model.register_parameter("v", torch.nn.Parameter(torch.zeros(10)))
    model.register_parameter("m", torch.nn.Parameter(torch.zeros(2, 8)))
    slots = key_layout(model, chunk_elems=4)
    assert [(s.key, s.shape) for s in slots] == [
        ("v#0", (4,)), ("v#1", (4,)), ("v#2", (2,)), ("m#0", (4,)), ("m#1", (4,)), ("m#2", (4,)), ("m#3", (4,))]  # fmt: skip
    rows = key_layout(model, chunk_elems=16)
    assert [(s.key, s.shape) for s in rows] == [("v", (10,)), ("m", (2, 8))]
    model.register_parameter("w", torch.nn.Parameter(torch.zeros(5, 3)))
    assert [(s.key, s.shape) for s in key_layout(model, chunk_elems=7) if s.name == "w"] == [
        ("w#0", (2, 3)), ("w#1", (2, 3)), ("w#2", (1, 3))]  # fmt: skip


def _wire(slot: KeySlot, rank: int) -> int:
    """Elements a level sends of `slot`: all of them dense (rank 0), else rank-r factors where
    they pay."""
    return slot.numel if rank == 0 else slot.lowrank_size(rank)


def _worst(slots: list[KeySlot], owner: dict[str, int], shards: int) -> float:
    """The heaviest shard over the mean, worst over a dense level and ranks 1, 2 and 4."""
    worst = 0.0
    for rank in (0, 1, 2, 4):
        sizes = [(s.key, _wire(s, rank)) for s in slots]
        loads = shard_loads(owner, sizes, shards)
        worst = max(worst, max(loads) * shards / sum(loads))
    return worst


def test_shards_balance_dense_and_low_rank_pushes() -> None:
    """Balanced on elements alone, wide-mlp's shard 1 held 3028 of the 3892 rank-1 factor elements
    (its site's WAN push 3.5x the other's under powersgd); balanced on every level's size, no
    level sends a shard more than 1.05x its share at two shards."""
    slots = shard_layout(_wide(), 2)
    dense_only = assign_shards([(s.key, s.numel) for s in slots], 2)
    assert _worst(slots, dense_only, 2) > 1.4
    assert _worst(slots, assign_shards(shard_sizes(slots), 2), 2) <= 1.05
    for shards in (3, 4):
        slots = shard_layout(_wide(), shards)
        assert _worst(slots, assign_shards(shard_sizes(slots), shards), shards) <= _worst(
            slots, assign_shards([(s.key, s.numel) for s in slots], shards), shards
        )


def test_lowrank_size_is_the_factors_where_they_pay() -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3), torch.nn.Linear(2, 2), torch.nn.Linear(12, 5))
    slots = {s.key: s for s in key_layout(model)}
    assert slots["0.weight"].lowrank_size(2) == 2 * (32 + 16 * 9)  # a conv kernel as rows x (in x kh x kw)
    assert slots["0.bias"].lowrank_size(1) == 32 and slots["1.weight"].lowrank_size(1) == 4  # a vector; 2 x 2: no gain
    assert slots["2.weight"].lowrank_size(1) == 17 and slots["2.weight"].lowrank_size(4) == 60  # 4 x 17 > 60: dense
