"""Which PS shard owns which key: a pure, deterministic, size-balanced assignment.

One Python PS process is bound by aioquic's per-packet CPU cost (a connection moves ~37 MB/s in
1200-byte packets, ~100 MB/s in 8952-byte ones on loopback: docs/ARCHITECTURE.md), so the keys
are spread over S shard processes and a worker talks to all of them in parallel. The assignment is
greedy largest-first onto the least-loaded shard (LPT scheduling, within 4/3 of the best balance):

- keys sorted by size, largest first; equal sizes keep their order in the input (the key layout,
  which is registration order and the same on every worker);
- each key goes to the shard with the fewest bytes so far; a tie goes to the lowest shard index.

Every worker computes it from the same (key, size) list, so all agree without telling each other,
and the PS never needs it: a shard's store knows only the keys that rank 0 sent it in INIT.
"""

from __future__ import annotations

from collections.abc import Sequence


def assign_shards(sizes: Sequence[tuple[str, int]], shards: int) -> dict[str, int]:
    """Key -> shard index in ``range(shards)`` for `(key, bytes)` pairs; deterministic."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    keys = [k for k, _ in sizes]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate key in the layout")
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i][1], i))
    load = [0] * shards
    owner: dict[str, int] = {}
    for i in order:
        key, size = sizes[i]
        if size < 0:
            raise ValueError(f"key {key!r} has a negative size {size}")
        shard = min(range(shards), key=lambda s: (load[s], s))
        owner[key] = shard
        load[shard] += size
    return owner


def shard_loads(owner: dict[str, int], sizes: Sequence[tuple[str, int]], shards: int) -> list[int]:
    """Bytes per shard under `owner` (for logs and benchmarks)."""
    load = [0] * shards
    for key, size in sizes:
        load[owner[key]] += size
    return load
