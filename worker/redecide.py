"""Redeciding a slow push: withdraw it mid-flight and send it again at a heavier level (docs/POLICIES.md).

A policy decides a step's level before its push; a rate drop that lands while the step computes
shows only once that push is on the wire, far slower than predicted. Rather than wait for it to
crawl through, the worker may redecide mid-push (`Policy.redecide`): a push still running
`redecide_after(decision)` after it started is put to the policy once, and on a heavier level
every push whose last byte has not left is withdrawn (its QUIC stream reset, so the PS drops the
partial message and counts nothing), its keys are re-encoded at the new level from what the
withdrawn payload carried (error feedback keeps the sum exact), and the replacement goes out on a
fresh stream. A push whose last byte left is never withdrawn: the PS may already hold it, and a
second copy would be refused.

The slot helpers run on the network thread (`Exchange` in worker/exchange.py); the training
thread times the push and re-encodes (`NetSenseOptimizer.step` in worker/optimizer.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from netsense.compression import LinkState, Payload
from netsense.compression.policy import Decision
from netsense.errors import PeerTimeout, RequestAbandoned

from .client import PSClient, PushHandle

REDECIDE_FACTOR = 2.0
"""A push still running this many times its predicted communication time is put to the policy..."""
REDECIDE_MIN_S = 0.2
"""...and at least this long past it: a few ms of scheduling noise on a fast path is no news."""


def redecide_after(decision: Decision | None) -> float | None:
    """Seconds after the push starts at which it is redecided, None when it never is (no
    prediction: bandwidth unknown, or a fixed policy)."""
    if decision is None or decision.predicted_comm_s is None or decision.level is None:
        return None
    comm = decision.predicted_comm_s
    if decision.pad_bytes and decision.bandwidth_Bps:
        comm += decision.pad_bytes / decision.bandwidth_Bps  # the probe's filler goes out beside the push
    return max(REDECIDE_FACTOR * comm, comm + REDECIDE_MIN_S)


@dataclass(frozen=True)
class Withdrawal:
    """What the network thread withdrew for a heavier level: the training thread re-encodes it."""

    decision: Decision
    """The policy's new decision."""
    link: LinkState
    """The path it was taken on."""
    bytes_acked: int
    """Bytes of the step's pushes the PS had acknowledged."""
    taken: list[tuple[int, int]]
    """(shard, slot index) of each withdrawn push."""
    buckets: list[dict[str, Payload]]
    """The payloads each withdrawn push carried (their keys are re-encoded)."""


@dataclass(frozen=True)
class Redecided:
    """A step whose push was withdrawn mid-flight and re-encoded."""

    spec: str
    """The level it was re-encoded at."""
    encode_s: float
    """Seconds the re-encoding took."""
    pushed_at: float
    """perf_counter when the replacement pushes were handed to the network thread."""


@dataclass
class PushSlot:
    """One bucket's push: the payloads it carries now and the stream carrying them."""

    bucket: dict[str, Payload]
    handle: PushHandle = field(default_factory=PushHandle)
    replacement: asyncio.Future[dict[str, Payload]] | None = None
    """Set while withdrawn: resolves to the re-encoded bucket to send instead."""

    def bytes_acked(self) -> int:
        """Bytes of the current push the PS acknowledged (its contiguous prefix)."""
        state = self.handle.send_state()
        return state.acked if state is not None else 0

    def unsent(self) -> bool:
        """True while the push's last byte has not left (so it may still be withdrawn)."""
        state = self.handle.send_state()
        return state is not None and not state.fin_sent


async def push_slot(
    client: PSClient, slot: PushSlot, step: int, samples: int, total_keys: int, sent: asyncio.Future[None] | None = None
) -> int:
    """Push `slot`'s bucket; when it is withdrawn, wait for the replacement and push that instead.
    `sent`: set once the push's last byte has left (`PSClient.push`)."""
    while True:
        try:
            return await client.push(step, samples, total_keys, slot.bucket, handle=slot.handle, sent=sent)
        except RequestAbandoned:
            if slot.replacement is None:
                raise
            conn = slot.handle.conn
            # Shielded: a step that gives up on this push (its connection dropped) cancels the task,
            # but the replacement still arrives, and a reconnect retry waits for it.
            slot.bucket = await asyncio.shield(slot.replacement)
            slot.handle, slot.replacement = PushHandle(), None
            if client.conn is not conn:  # reconnected meanwhile: the retry sends the replacement
                raise PeerTimeout("connection replaced while a withdrawn push was re-encoded") from None


def withdraw(client: PSClient, slots: list[PushSlot]) -> list[int]:
    """Withdraw every push of `slots` whose last byte has not left; returns their indexes. Each
    withdrawn slot waits for `replace` (or `fail`) before its push goes on."""
    loop = asyncio.get_running_loop()
    taken = []
    for i, slot in enumerate(slots):
        if slot.replacement is not None:
            continue
        slot.replacement = loop.create_future()  # before abandoning: the push wakes up to wait on it
        if client.abandon(slot.handle):
            taken.append(i)
        else:
            slot.replacement = None
    return taken


def discard(futures: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel what is still running and consume every outcome: a step that gives up on its pushes
    and pull (a dropped connection fails each of them) leaves no "exception was never retrieved"."""
    for f in futures:
        f.cancel()
        f.add_done_callback(_consume)


def _consume(f: asyncio.Future[Any]) -> None:
    if not f.cancelled():
        f.exception()


def replace(slot: PushSlot, bucket: dict[str, Payload]) -> None:
    """Hand a withdrawn slot the bucket to push instead."""
    if slot.replacement is not None and not slot.replacement.done():
        slot.replacement.set_result(bucket)


def fail(slot: PushSlot, exc: BaseException) -> None:
    """A withdrawn slot gets no replacement (re-encoding failed): its push raises `exc`."""
    if slot.replacement is not None and not slot.replacement.done():
        slot.replacement.set_exception(exc)
