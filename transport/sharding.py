"""Which PS shard owns which key: a pure, deterministic, size-balanced assignment.

One Python PS process is bound by aioquic's per-packet CPU cost (a connection moves ~37 MB/s in
1200-byte packets, ~100 MB/s in 8952-byte ones on loopback: docs/ARCHITECTURE.md), so the keys
are spread over S shard processes and a worker talks to all of them in parallel.

A key has one size per measure: its elements (what a dense level sends of it) and what a
low-rank level sends of it at ranks 1 and 4 (`netsense.worker.layout.shard_sizes`), for these
scale differently: a low-rank level sends rows + columns of a big matrix and all of a bias.
Balanced on elements alone, wide-mlp's two shards held 864 and 3028 elements of rank-1 factors,
so under `powersgd` one site's WAN push was 3.5x the other's (docs/ARCHITECTURE.md, "Sharding").
The assignment minimizes the sum over shards and measures of the squared loads (each measure as a
share of its total), which for one measure is LPT scheduling (within 4/3 of the best balance):

- keys sorted by their largest share, largest first; ties keep their order in the input (the key
  layout, which is registration order and the same on every worker);
- each key goes where it adds least to that sum (for one measure: the shard with the fewest bytes
  so far); a tie goes to the lighter shard, then the lowest index;
- then the best single move or swap of keys that lowers the sum, until none does.

Every worker computes it from the same (key, sizes) list, so all agree without telling each other,
and the PS never needs it: a shard's store knows only the keys that rank 0 sent it in INIT.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

SWAP_KEYS = 64
"""Most keys for which `assign_shards` also tries swaps (pairs: quadratic in keys); beyond, moves."""


def assign_shards(sizes: Sequence[tuple[str, int | Sequence[int]]], shards: int) -> dict[str, int]:
    """Key -> shard index in ``range(shards)`` for `(key, size)` pairs, a size being one number
    or one per measure (every key the same count); deterministic."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    keys = [k for k, _ in sizes]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate key in the layout")
    shares = _shares(keys, [(v,) if isinstance(v, int) else tuple(v) for _, v in sizes])
    order = sorted(range(len(keys)), key=lambda i: (-max(shares[i]), i))
    measures = len(shares[0]) if shares else 1
    load = [[0] * measures for _ in range(shards)]
    where = [0] * len(keys)
    for i in order:
        x = shares[i]
        # Least growth of the sum of squared loads (less the x^2 every shard adds alike), then the
        # lighter shard, then the lower index.
        shard = min(range(shards), key=lambda s: (_dot(load[s], x), sum(load[s]), s))
        where[i] = shard
        load[shard] = [a + b for a, b in zip(load[shard], x)]
    _improve(shares, where, load)
    return {keys[i]: where[i] for i in range(len(keys))}


def _shares(keys: list[str], vectors: list[tuple[int, ...]]) -> list[list[int]]:
    """Each key's sizes as exact integer shares of each measure's total (all scaled alike, so the
    same answer on every worker and ties wherever the sizes tie)."""
    measures = len(vectors[0]) if vectors else 1
    for key, vec in zip(keys, vectors):
        if len(vec) != measures or not vec:
            raise ValueError(f"key {key!r} has {len(vec)} sizes, the first key {measures}")
        if any(x < 0 for x in vec):
            raise ValueError(f"key {key!r} has a negative size {vec}")
    totals = [sum(v[m] for v in vectors) or 1 for m in range(measures)]
    scale = [math.prod(totals) // t for t in totals]
    return [[v[m] * scale[m] for m in range(measures)] for v in vectors]


def _improve(shares: list[list[int]], where: list[int], load: list[list[int]]) -> None:
    """Local search after the greedy pass: the best single move of a key,
    or swap of two (up to `SWAP_KEYS` keys), that lowers the sum of squared loads, until none
    does. Greedy alone left charlm's heavier shard of two with 1.27x the mean of the elements;
    with the search its worst case over elements and ranks 1, 2 and 4 is 1.16x, the best of all
    256 splits (digits-cnn, wide-mlp: 1.04, also the best)."""
    n, shards = len(where), len(load)
    for _ in range(4 * n):
        best: tuple[int, int, int, int] | None = None  # (gain, i, j or -1, shard for a move)
        for i in range(n):
            a, x = where[i], shares[i]
            for b in range(shards):
                if b != a:  # move i from a to b: the sum changes by 2 x.(L_b - L_a + x)
                    gain = -_dot(x, [lb - la + xi for lb, la, xi in zip(load[b], load[a], x)])
                    if gain > 0 and (best is None or gain > best[0]):
                        best = (gain, i, -1, b)
            if n > SWAP_KEYS:
                continue
            for j in range(i + 1, n):
                b = where[j]
                if b == a:
                    continue
                d = [y - xi for y, xi in zip(shares[j], x)]  # swap: changes by 2 d.(L_a - L_b + d)
                gain = -_dot(d, [la - lb + di for la, lb, di in zip(load[a], load[b], d)])
                if gain > 0 and (best is None or gain > best[0]):
                    best = (gain, i, j, b)
        if best is None:
            return
        _, i, j, b = best
        moved = [(i, b)] if j < 0 else [(i, where[j]), (j, where[i])]
        for k, to in moved:
            load[where[k]] = [la - xi for la, xi in zip(load[where[k]], shares[k])]
            load[to] = [lb + xi for lb, xi in zip(load[to], shares[k])]
            where[k] = to


def _dot(a: list[int], b: list[int]) -> int:
    return sum(x * y for x, y in zip(a, b))


def shard_loads(owner: dict[str, int], sizes: Sequence[tuple[str, int]], shards: int) -> list[int]:
    """Bytes per shard under `owner` (for logs and benchmarks)."""
    load = [0] * shards
    for key, size in sizes:
        load[owner[key]] += size
    return load
