"""`Upstream`: the relay's connection to one upstream PS shard, where the whole site is ONE worker.

It is the worker's own client (`netsense.worker.client.PSClient`, with the worker's connect and
reconnect loops), so the upstream PS authenticates, bounds and drops a relay exactly as it does a
worker: the relay joins as ``relay-<site>``, pushes the site's `Aggregate` with the site's total
samples, and pulls once per step for every local worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from netsense.compression import Payload, make_codec
from netsense.compression.feedback import ErrorFeedback, require_feedback_safe
from netsense.errors import NetSenseError, PeerError, PeerTimeout
from netsense.transport.wire import Init, Params, Welcome
from netsense.worker.client import StepFields
from netsense.worker.connect import ConnectSettings, connect_first, make_client, reconnect
from netsense.worker.wanpushes import WanPushes

from .adaptive import AdaptiveUpstream
from .site import Aggregate

log = logging.getLogger(__name__)

LOSSLESS = ("fp32", "none")
BUCKET_BYTES = 4 << 20
"""Dense bytes per upstream PUSH: big models go up in several streams, as a worker's buckets do."""


class Upstream:
    """One upstream shard, seen from the relay."""

    def __init__(
        self, settings: ConnectSettings, worker_id: str, *, codec: str = "fp32", rank: int = 0,
        adaptive: AdaptiveUpstream | None = None,
    ) -> None:  # fmt: skip
        self.settings = settings
        self.client = make_client(settings, worker_id, rank)
        self.codec_spec = codec
        self._codec = make_codec(codec)  # a bad spec fails here, before any I/O
        self._feedback: ErrorFeedback | None = None
        if codec not in LOSSLESS:
            require_feedback_safe(self._codec)
            self._feedback = ErrorFeedback()  # the relay's residual: what a lossy upstream codec left out
        self._fp32 = make_codec("fp32")
        self.adaptive = adaptive
        """The job's uplink policy, when the site's push adapts to the WAN (then `codec` is unused)."""
        self.seed: Callable[[], Awaitable[None]] | None = None
        """Seeds an upstream that came back empty (set by the relay when its site holds rank 0)."""
        self.last_push_s: float | None = None
        """The last `step`'s push, first byte to last ack (None: retried after a reconnect, untimed)."""
        self.wan: tuple[WanPushes, int] | None = None
        """The relay's `WanPushes` and this upstream's shard in it, when this shard is at another
        site: told when a step's pushes have left, or failed (docs/ARCHITECTURE.md, "WAN pushes first")."""

    @property
    def welcome(self) -> Welcome | None:
        return self.client.welcome

    async def connect(self) -> Welcome:
        return await connect_first(self.client, self.settings)

    async def first_params(self) -> Params:
        """The upstream's parameters once it is initialized (by this site's rank 0 through the relay,
        or by rank 0 at another site): a full pull waits for INIT on the PS."""
        while True:
            try:
                return await self.client.pull(-1, 0)
            except PeerTimeout as exc:
                return await reconnect(self.client, self.settings, exc, self.seed)
            except PeerError as exc:
                if exc.code != "timeout":
                    raise
                log.info("upstream not initialized within its pull timeout; still waiting for rank 0")

    async def init(self, init: Init, world_size: int) -> int:
        """Pass a local rank 0's INIT through (the PS ignores it if another rank 0 was first)."""
        return await self.client.init(init.tensors, init.optimizer, world_size, init.model)

    async def step(self, agg: Aggregate, total_keys: int) -> Params:
        """Push the site's step (at the policy's level when the push adapts) and pull its update."""
        started = time.perf_counter()
        adaptive = self.adaptive if not agg.skip else None
        payloads, pad = None, 0
        if adaptive is not None:
            conn = self.client.conn
            link = adaptive.read_link(conn.quic if conn is not None else None, agg.grads)
            if await self._probe_path(adaptive):
                link = adaptive.read_link(conn.quic if conn is not None else None, agg.grads)
            decision, payloads = await asyncio.to_thread(adaptive.encode, agg.grads, link, started)
            pad = decision.pad_bytes
        buckets, fields = self.encode(agg, payloads)
        self.client.step_fields = fields
        sent = time.perf_counter()
        progress = asyncio.ensure_future(asyncio.to_thread(adaptive.track_progress, decision)) if adaptive else None
        try:
            params, push_s = await self._send(agg, total_keys, buckets, pad)
            self.last_push_s = push_s
            returned = self.client.take_delivered()  # an update's return, as the PS reported it
            if adaptive is not None and payloads is not None and push_s is not None:
                wire_s = time.perf_counter() - sent
                adaptive.observe(
                    payloads, push_s=push_s, encode_s=sent - started, wire_s=wire_s, step=agg.step, pad_bytes=pad, returned=returned
                )
            return params
        finally:
            if progress is not None:
                await progress
            if self.adaptive is not None:
                self.adaptive.mark_end()

    async def _probe_path(self, adaptive: AdaptiveUpstream) -> bool:
        """Before the first decision, the start-up probe the policy asks for (`Policy.probe_bytes`),
        as a worker's uplink sends it; whether one ran. A failed probe costs only the probe."""
        uplink, conn = adaptive.uplink, self.client.conn
        nbytes = uplink.probe_bytes() if uplink is not None and conn is not None else 0
        if nbytes <= 0:
            return False
        assert uplink is not None and conn is not None
        started = time.perf_counter()
        try:
            await self.client.probe(nbytes)
        except NetSenseError as exc:
            log.warning("upstream probe failed (%s); the first steps go out at the unknown-bandwidth level", exc)
            return False
        uplink.observe_probe(bytes_sent=nbytes, comm_s=time.perf_counter() - started, link=uplink.read_link(conn.quic))
        return True

    async def _send(
        self, agg: Aggregate, total_keys: int, buckets: list[dict[str, Payload]], pad: int = 0
    ) -> tuple[Params, float | None]:
        """Push + pull with its push time (`pad` bytes of filler beside the push: the policy's
        padded probe); after a dropped connection, reconnect and push again if the PS is still at
        the step (without the filler, and no push time: the retry is no sample), else return where
        the PS is now (no push time)."""
        while True:
            try:
                return await self._push_pull(agg.step, agg.samples, total_keys, buckets, pad)
            except PeerTimeout as exc:
                params = await reconnect(self.client, self.settings, exc, self.seed)
                pad = 0
                if params.version != agg.step:
                    return params, None
                log.info("upstream still at step %d after reconnecting; pushing the site's step again", agg.step)

    async def _push_pull(
        self, step: int, samples: int, total_keys: int, buckets: list[dict[str, Payload]], pad: int = 0
    ) -> tuple[Params, float]:
        """The update and the push's time (first byte to the last ack, the filler's included)."""
        client = self.client
        started = time.perf_counter()
        pull = asyncio.ensure_future(client.pull(step, step + 1))
        wan = self.wan
        sent: list[asyncio.Future[None] | None] = [wan[0].sent(wan[1], step) for _ in buckets] if wan else [None] * len(buckets)
        if wan:
            wan[0].left(wan[1], step, total=len(buckets))
        pushes = [asyncio.ensure_future(client.push(step, samples, total_keys, b, sent=f)) for b, f in zip(buckets, sent)]
        filler = [asyncio.ensure_future(client.probe(pad))] if pad > 0 else []  # after the pushes, as a worker's
        try:
            try:
                await asyncio.gather(*pushes, *filler)
            finally:
                if wan:
                    wan[0].pushed(wan[1], step)
            push_s = time.perf_counter() - started
            return await pull, push_s
        finally:
            for f in (pull, *pushes, *filler):
                if not f.done():
                    f.cancel()
                f.add_done_callback(_consume)

    def encode(self, agg: Aggregate, payloads: dict[str, Payload] | None = None) -> tuple[list[dict[str, Payload]], StepFields]:
        """The site's PUSH buckets (state keys in the first) and their step fields; `payloads`:
        the gradients already encoded (by the policy), else at the relay's codec."""
        if agg.skip:
            return [{}], StepFields(skip=True)
        buckets: list[dict[str, Payload]] = [{}]
        size = 0
        for key, grad in agg.grads.items():
            dense = 4 * grad.numel()
            if buckets[-1] and size + dense > BUCKET_BYTES:
                buckets.append({})
                size = 0
            buckets[-1][key] = payloads[key] if payloads is not None else self._encode(key, grad)
            size += dense
        buckets[0].update({k: self._fp32.encode(v) for k, v in agg.state.items()})
        groups: list[dict[str, float]] = []
        key_groups: dict[str, int] = {}
        for key, hyper in agg.hparams.items():
            if hyper not in groups:
                groups.append(hyper)
            if groups.index(hyper):
                key_groups[key] = groups.index(hyper)
        return buckets, StepFields(tuple(groups), key_groups)

    def _encode(self, key: str, grad: Any) -> Payload:
        if self._feedback is None:
            return self._codec.encode(grad)
        payload, _ = self._feedback.compress(key, grad, self._codec)
        return payload

    @property
    def bytes_sent(self) -> int:
        return self.client.bytes_sent

    @property
    def bytes_received(self) -> int:
        return self.client.bytes_received

    async def close(self, reason: str = "relay stopped") -> None:
        await self.client.close(reason)


def _consume(f: asyncio.Future[Any]) -> None:
    if not f.cancelled():
        f.exception()
