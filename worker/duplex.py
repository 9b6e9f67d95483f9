"""When the default step is full duplex: overlap + pipelined push/pull wherever it is exact.

Against a synchronous PS the full-duplex step (worker/overlap.py; docs/ARCHITECTURE.md, "Overlap")
gives bit for bit the parameters of the plain step (tests/e2e/test_overlap_exact.py), so the
training loop's default (``train.overlap`` unset) turns it on, and `--no-overlap` keeps the plain
step. It stays off, with the reason logged, where its result or its behaviour would differ:

- an asynchronous PS (SSP): pushes apply on arrival and there is no pipelined pull, so nothing
  would run in duplex, and a gradient pushed during backward would change the arrival order;
- an uplink policy that redecides a slow push mid-flight (adaptive policies): pipelined pushes are
  not withdrawable, so the default keeps the plain step where that matters.

After the first full-duplex step the optimizer also drops it when every shard's step fitted in one
hook bucket (`NetSenseOptimizer._check_duplex`): nothing of such a step can run in duplex.

`--overlap` (``overlap=True``) still forces it on in every case, as before.
"""

from __future__ import annotations


def duplex_blocker(*, asynchronous: bool, redecides: bool) -> str | None:
    """Why the default step stays half duplex (the plain step), or None: full duplex is exact.
    Model buffers are no blocker: they ride with the first gradient bucket of shard 0 under overlap
    too (`BackwardPushes.riders`; tests/e2e/test_buffers.py checks them against the plain step)."""
    if asynchronous:
        return "the PS is asynchronous (--staleness): pushes apply on arrival, there is no pipelined pull"
    if redecides:
        return "the uplink policy redecides slow pushes mid-flight, which pipelined pushes do not support"
    return None
