"""Overlap of the push with backward (docs/ARCHITECTURE.md, "Overlap"): gradient hooks encode
each key as soon as its gradient is final and push full buckets while earlier layers still compute.

`NetSenseOptimizer(overlap=True)` registers `Tensor.register_post_accumulate_grad_hook` on every
parameter; backward fires them roughly in reverse layer order. One `BackwardPushes` collects one
backward's keys per shard; a bucket goes out (on the network thread, via the `push` callback) once
it holds `bucket_bytes`, or once its shard has every key. `step()` then encodes what no hook saw
(parameters without a gradient), pushes the rest and waits for the pushes in flight and the pull.
What reaches the PS is the same keys, values and sample count as without overlap, the buffers
(state keys) included: they ride with shard 0's first bucket, so training is identical (tested);
only the bucket boundaries and the time of sending differ.

Pipelined pull (sync PS): each bucket's PUSH goes with a keyed PULL for the same keys, which the PS
answers as soon as every worker has pushed them and it has applied them, so the downlink of early
keys runs while later keys are still going up (the link is full duplex) and `step()` waits only for
the last bucket's round trip. The parts are merged into one PARAMS for the step (`merge_parts`), so
the replica takes the same bytes as from a whole pull. At most `PUSH_WINDOW` pushes per shard have
bytes still to send: aioquic serves its streams round robin, so with every bucket queued all of
them would finish together at the end and the PS could apply nothing early.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Container
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from netsense.compression import Payload
from netsense.transport.wire import MAX_PULL_KEYS, Params, Sum

from .client import PSClient
from .layout import KeySlot

PUSH_WINDOW = 2
"""Pushes per shard with bytes not yet sent, in a pipelined step. A slot frees once its push's last
byte has left (`PSClient.push(sent=)`), not at the ACK: the ACK comes a round trip plus the PS's
work later (longer under CPU load), which left the link idle with an ACK-gated window, and more
ACK-gated slots delay the first complete bucket (W x 1 MiB in round robin). Two slots keep one
push queued behind the one sending; buckets then complete one after another."""

PushFn = Callable[[int, dict[str, Payload]], "Future[Any]"]
"""push(shard, bucket) -> a future of the PUSH, scheduled on the network thread."""


@dataclass
class BackwardPushes:
    """The keys one backward pass has encoded (and, when the sample count is known, pushed)."""

    shard_keys: list[int]
    """Keys each shard owns (a shard's last bucket goes out when all are encoded)."""
    bucket_bytes: int
    """Push a shard's bucket once it holds this many encoded bytes."""
    spec: str
    """Codec of this step (the policy chose it at the first hook)."""
    decision: Any
    """The policy's `Decision`, or None for a fixed codec."""
    samples: int | None
    """Sample count the pushes carry; None: not known before `step()`, so nothing is pushed early."""
    push: PushFn
    """Sends one bucket of one shard; returns its future."""
    riders: dict[str, Payload] = field(default_factory=dict)
    """Shard 0's state keys (buffers, final once forward ran): they ride with its first bucket,
    never alone, as in the plain step (docs/ARCHITECTURE.md, "Model buffers"); emptied once sent."""
    encode_s: float = 0.0
    """Time spent encoding inside the hooks."""
    push_started: float | None = None
    """`perf_counter()` of the first early push."""
    payloads: dict[str, Payload] = field(default_factory=dict)
    """Every key encoded so far."""
    sent: list[list[dict[str, Payload]]] = field(default_factory=list)
    """Per shard: buckets already pushed, in order."""
    futures: list[list[Future[Any]]] = field(default_factory=list)
    """Per shard: the futures of `sent`."""
    _open: list[dict[str, Payload]] = field(default_factory=list)
    _open_bytes: list[int] = field(default_factory=list)
    _encoded: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.shard_keys)
        self.sent, self.futures = [[] for _ in range(n)], [[] for _ in range(n)]
        self._open, self._open_bytes, self._encoded = [{} for _ in range(n)], [0] * n, [0] * n

    def add(self, shard: int, key: str, payload: Payload) -> None:
        """One key of `shard` is encoded; push its bucket if full or if the shard is complete."""
        self.payloads[key] = payload
        self._open[shard][key] = payload
        self._open_bytes[shard] += payload.wire_size
        self._encoded[shard] += 1
        if self._open_bytes[shard] >= self.bucket_bytes or self._encoded[shard] == self.shard_keys[shard]:
            self._flush(shard)

    def unsent(self, shard: int) -> dict[str, Payload]:
        """Keys of `shard` encoded but not pushed yet (`step()` pushes them)."""
        return self._open[shard]

    def _flush(self, shard: int) -> None:
        if self.samples is None or not self._open[shard]:
            return  # the sample count comes with `step()`: these keys wait for it
        bucket, self._open[shard], self._open_bytes[shard] = self._open[shard], {}, 0
        if shard == 0 and self.riders:
            bucket.update(self.riders)
            self.riders = {}
        if self.push_started is None:
            self.push_started = time.perf_counter()
        self.sent[shard].append(bucket)
        self.futures[shard].append(self.push(shard, bucket))


def slots_by_param(slots: list[KeySlot]) -> dict[int, list[KeySlot]]:
    """id(parameter) -> its keys (one, or the chunks of a large tensor)."""
    out: dict[int, list[KeySlot]] = {}
    for s in slots:
        out.setdefault(id(s.param), []).append(s)
    return out


@dataclass(frozen=True)
class BucketReply:
    """What the PS answered for one bucket of a pipelined step."""

    ack_version: int
    """The PUSH's ACK."""
    acked_at: float
    """`perf_counter()` when the ACK arrived (the last one ends the step's push time)."""
    parts: list[Params]
    """The keyed PULL replies covering the bucket's keys."""


async def push_and_pull(
    client: PSClient,
    window: asyncio.Semaphore,
    step: int,
    samples: int,
    total_keys: int,
    bucket: dict[str, Payload],
    state_keys: Container[str] = (),
    on_sent: Callable[[], None] | None = None,
) -> BucketReply:
    """PUSH one bucket (within the shard's window) and PULL its keys of the next version; the pull
    leaves at once, so the PS can answer it the moment it has applied the keys. State keys in the
    bucket (`state_keys`) are pulled on their own: the PS averages them only when the whole step
    is in, and they must not hold up the reply of the gradient keys."""
    keys = [k for k in bucket if k not in state_keys]
    state = [k for k in bucket if k in state_keys]
    pulls = [
        asyncio.ensure_future(client.pull(step, step + 1, tuple(part[i : i + MAX_PULL_KEYS])))
        for part in (keys, state)
        for i in range(0, len(part), MAX_PULL_KEYS)
    ]
    push: asyncio.Future[int] | None = None
    try:
        async with window:  # the slot frees once the bytes are out, not at the ACK
            sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            push = asyncio.ensure_future(client.push(step, samples, total_keys, bucket, sent=sent))
            await asyncio.wait({sent, push}, return_when=asyncio.FIRST_COMPLETED)
        if on_sent is not None:  # its last byte has left (or it ended): `WanPushes` counts it
            on_sent()
        ack = await push
        acked_at = time.perf_counter()
        return BucketReply(ack, acked_at, list(await asyncio.gather(*pulls)))
    except BaseException:
        for task in [*pulls, push]:
            if task is not None:
                task.cancel()
        raise


def merge_parts(parts: list[Params], keys: list[str], step: int) -> Params | None:
    """One PARAMS for the whole step from the keyed replies, or None when they do not make one
    consistent update from `step` (the PS moved on or fell back to full parameters: resync)."""
    if not parts:
        return None
    full = parts[0].full
    tensors: dict[str, Payload] = {}
    sums: dict[str, Sum] = {}
    for p in parts:
        if p.version != step + 1 or p.full != full or (not full and p.base_version != step):
            return None
        tensors.update(p.tensors)
        sums.update(p.sums)  # forwarded pushes (`Params.sums`)
    if set(tensors) | set(sums) != set(keys) or set(tensors) & set(sums):
        return None
    if any(p.gradient != parts[0].gradient for p in parts):
        return None
    return Params(
        step + 1, full, {k: tensors[k] for k in keys if k in tensors}, base_version=-1 if full else step,
        gradient=parts[0].gradient, sums={k: sums[k] for k in keys if k in sums},
    )  # fmt: skip
