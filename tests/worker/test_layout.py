"""The key layout: row-block chunks, and tensors split for shard balance (`shard_layout`)."""

from __future__ import annotations

import torch

from netsense.transport.sharding import assign_shards, shard_loads
from netsense.worker.layout import MIN_SHARD_CHUNK_ELEMS, key_layout, shard_layout


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
