"""`NetSenseOptimizer`: the PyTorch-native API. ``loss.backward(); opt.step()`` trains through the PS.

`step()` encodes each key's gradient (with error feedback for lossy codecs), pushes the buckets
on parallel QUIC streams, waits for the next version, and writes it into the model in place.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from netsense.compression import Codec, LinkState, Payload, make_codec
from netsense.compression.policy import Decision, Policy, build_policy
from netsense.errors import AuthError, ConfigError, PeerError, PeerTimeout, ProtocolError
from netsense.transport.auth import load_secret
from netsense.transport.sharding import assign_shards
from netsense.transport.tls import TransportSettings, client_configuration
from netsense.transport.wire import Params

from .client import Identity, PSClient
from .layout import DEFAULT_CHUNK_ELEMS, KeySlot, key_layout
from .netthread import NetThread
from .overlap import PUSH_WINDOW, BackwardPushes, BucketReply, merge_parts, push_and_pull, slots_by_param
from .uplink import UplinkController
from .withdraw import PushSlot, fail, push_slot, replace, withdraw

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectSettings:
    """Where the PS is and how to trust it / be trusted by it."""

    host: str = "127.0.0.1"
    """PS address."""
    port: int = 4433
    """PS UDP port."""
    ca: str | None = None
    """CA certificate to verify the PS against (from `netsense certs`)."""
    secret_file: str | None = None
    """Shared secret for the HMAC challenge."""
    insecure: bool = False
    """Skip TLS verification and authentication: local experiments only."""
    server_name: str | None = None
    """Name to verify in the PS certificate (default: `host`)."""
    transport: TransportSettings = field(default_factory=TransportSettings)
    """QUIC knobs."""
    connect_timeout_s: float = 10.0
    """Give up connecting after this long."""
    reconnect_deadline_s: float = 300.0
    """After a dropped connection, keep reconnecting (with backoff) for this long, then fail."""
    reconnect_backoff_s: float = 0.2
    """First wait between reconnect attempts; doubles per attempt (with jitter) up to the cap."""
    reconnect_backoff_max_s: float = 5.0
    """Cap of the wait between reconnect attempts."""


@dataclass
class StepStats:
    """What one `step()` cost, for progress and benchmarks (the per-step breakdown)."""

    version: int = 0
    compute_s: float = 0.0
    """Since the previous `step()` returned: forward/backward and the data loader (0 on the first)."""
    encode_s: float = 0.0
    """Policy choice and encoding (with error feedback) of every key."""
    wire_s: float = 0.0
    """Push + pull on every shard: first push byte to the last PARAMS (includes `wait_s`)."""
    push_s: float = 0.0
    """First push byte to the last push's ack, on the slowest shard."""
    wait_s: float = 0.0
    """After the last push ack until the PARAMS arrived: the barrier (other workers) and the downlink."""
    decode_s: float = 0.0
    """Decoding the PARAMS payloads."""
    apply_s: float = 0.0
    """Writing the decoded parameters into the model (excludes `decode_s`)."""
    bytes_up: int = 0
    bytes_down: int = 0
    codec: str = ""
    early_buckets: int = 0
    """Overlap: buckets pushed from gradient hooks during backward, before `step()` was called."""
    staleness: int = 0
    """Async PS (SSP): updates applied between the version this step's gradient was computed on
    and its own update (the largest over shards); always 0 against a synchronous PS."""


class NetSenseOptimizer:
    """Drop-in for ``torch.optim.Optimizer.step`` in data-parallel training via a NetSense PS.

    `connect` is one PS or a list of PS shards: keys are spread over the shards by
    `assign_shards` (size-balanced, deterministic), each shard gets only its keys, and a step
    pushes to and pulls from every shard in parallel. The PS holds the optimizer (``optimizer`` settings are sent by rank 0 at start); this object
    only moves gradients up and parameters down. Rank 0's initial parameters win: other ranks
    are overwritten with them at construction.

    ``overlap=True`` pushes keys from gradient hooks during backward (`worker/overlap.py`); pushes
    need the batch's sample count, which is the last `step()`'s unless ``zero_grad(samples=n)``
    says otherwise (the first step without it is not overlapped). One backward per step: the
    hooks would push the first of several accumulated backwards.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        connect: ConnectSettings | Sequence[ConnectSettings],
        rank: int = 0,
        world_size: int = 1,
        worker_id: str | None = None,
        optimizer: dict[str, object] | None = None,
        codec: str = "fp32",
        chunk_elems: int = DEFAULT_CHUNK_ELEMS,
        bucket_bytes: int = 4 << 20,
        policy: str | Policy | None = None,
        ladder: str | None = None,
        decision_log: str | os.PathLike[str] | None = None,
        policy_settings: dict[str, object] | None = None,
        overlap: bool = False,
        overlap_bucket_bytes: int = 1 << 20,
    ) -> None:
        self.model = model
        self.slots: list[KeySlot] = key_layout(model, chunk_elems)
        shards = [connect] if isinstance(connect, ConnectSettings) else list(connect)
        if not 1 <= len(shards) <= len(self.slots):
            raise ConfigError(f"{len(shards)} PS shards for {len(self.slots)} keys: use 1..{len(self.slots)} shards")
        self.owner = assign_shards([(s.key, 4 * s.numel) for s in self.slots], len(shards))
        """Key -> index of the PS shard that owns it (the same on every worker)."""
        self.shard_slots: list[list[KeySlot]] = [[s for s in self.slots if self.owner[s.key] == i] for i in range(len(shards))]
        """Each shard's keys, in layout order."""
        self.rank = rank
        self.world_size = world_size
        self.codec_spec = codec
        self._codecs: dict[str, Codec] = {}
        self._codec(codec)  # fail fast on a bad spec
        # `--codec X` is `--policy fixed:X`; a policy given explicitly wins over the codec.
        self.uplink = UplinkController(
            build_policy(policy or f"fixed:{codec}", ladder, policy_settings),
            payload_bytes=sum(4 * s.numel for s in self.slots),
            decision_log=decision_log,
            log_fields={"worker_id": worker_id, "rank": rank},
        )
        """Per-step level choice and the decision log (DESIGN.md §5)."""
        self._push_s = 0.0
        self._staleness = [0]
        self._decode_s = 0.0
        self._step_end: float | None = None
        self.feedback = None  # created on first lossy step (lossless codecs need no residuals)
        self.bucket_bytes = bucket_bytes
        self.version = -1
        """Replica version: the lowest of the shards' versions (in sync mode all advance together)."""
        self.versions = [-1] * len(shards)
        """Version of each shard's keys in this replica."""
        self.last = StepStats()
        self.bytes_up = 0
        self.bytes_down = 0
        self._net = NetThread()
        self._connect = shards[0]
        self._shards = shards
        self.reconnects = 0
        """Connections re-established after a drop (PS restart, path change, timeout)."""
        identity = worker_id or f"{socket.gethostname()}-{os.getpid()}-r{rank}"
        try:
            self.clients = [
                PSClient(
                    c.host,
                    c.port,
                    _client_config(c),
                    Identity(identity, rank, _secret(c)),
                    socket_buffer_bytes=c.transport.socket_buffer_bytes,
                )
                for c in shards
            ]
            """One connection per PS shard."""
            self.client = self.clients[0]
            self._net.run(self._start(optimizer or {}, shards[0].connect_timeout_s))
        except BaseException:
            self._net.close()
            raise
        self.overlap = overlap
        """Push keys from gradient hooks during backward (see `worker/overlap.py`)."""
        self.overlap_bucket_bytes = overlap_bucket_bytes
        """Bucket size of the pushes sent from hooks: smaller than `bucket_bytes`, so the first push
        leaves early in backward (a 4 MiB bucket held the whole 4 MB test MLP until backward ended)."""
        self._backward: BackwardPushes | None = None
        self._windows: dict[int, asyncio.Semaphore] = {}  # pipelined pushes on the wire, per shard
        self._slots: dict[int, tuple[list[PushSlot], int, list[dict[str, Payload]]]] = {}
        """Per shard, this step's withdrawable pushes: their slots, the index of the first in the
        shard's bucket list, and that list (a replacement is written back for reconnect retries)."""
        self._next_samples: int | None = None
        self._param_slots = slots_by_param(self.slots)
        self._hooks = (
            [s.param.register_post_accumulate_grad_hook(self._grad_ready) for s in self.slots if s.start == 0] if overlap else []
        )

    # --- public ----------------------------------------------------------------------------

    def zero_grad(self, set_to_none: bool = True, *, samples: int | None = None) -> None:
        """Clear the gradients; with overlap, `samples` is the coming batch's size (default: the
        last step's), which the pushes sent during backward carry."""
        self.model.zero_grad(set_to_none=set_to_none)
        if samples is not None:
            self._next_samples = samples

    @torch.no_grad()
    def step(self, samples: int = 1, codec: str | None = None) -> StepStats:
        """Push this worker's gradients (from `samples` samples), pull and apply the next version.

        The codec is `codec` when given, else the uplink policy's choice for this step."""
        t0 = time.perf_counter()
        early, self._backward = self._backward, None  # overlap: what the gradient hooks already did
        if early is not None:
            if codec is not None and codec != early.spec:
                raise ConfigError(f"step(codec={codec!r}) with overlap=True: the hooks already encoded with {early.spec!r}")
            if early.samples is not None and early.samples != samples:
                raise ConfigError(
                    f"step(samples={samples}) but the pushes sent during backward carry {early.samples}: "
                    "with overlap=True call zero_grad(samples=n) before backward when the batch size changes"
                )
            decision, spec = early.decision, early.spec
        else:
            decision = None
            if codec is None:
                decision = self.uplink.choose(self._net.run(self._read_link()), started=t0)
            spec = codec or (decision.spec if decision is not None else self.codec_spec)
        self._next_samples = samples
        stats = StepStats(codec=spec)
        payloads: dict[str, Payload] = dict(early.payloads) if early is not None else {}
        # What each payload stands for, kept while the policy may re-encode the push mid-flight.
        sources: dict[str, torch.Tensor] | None = {} if _recheck_after(decision) is not None and early is None else None
        for slot in self.slots:
            if slot.key in payloads:
                continue
            grad = slot.param.grad
            g = slot.view(grad) if grad is not None else torch.zeros(slot.shape, dtype=slot.param.dtype, device=slot.param.device)
            payloads[slot.key], source = self._encode(slot.key, g, self._codec_for(slot.key, spec))
            if sources is not None:
                sources[slot.key] = source
        if early is None:
            buckets = [_buckets({s.key: payloads[s.key] for s in slots}, self.bucket_bytes) for slots in self.shard_slots]
        else:  # the pushed buckets first (their futures pair with them), then the rest
            sent = {k for shard in early.sent for b in shard for k in b}
            buckets = [
                early.sent[i] + _buckets({s.key: payloads[s.key] for s in slots if s.key not in sent}, self.bucket_bytes)
                for i, slots in enumerate(self.shard_slots)
            ]
        # Candidate rounds (every `progress_every` steps) are timed before the push leaves: on the
        # wire, the network thread contends for the GIL at every torch call of a round, and the
        # rate-step test measured an fp16 cast of 65k elements at ~20 ms (0.3 s per 4 MB), which
        # priced fp16 and qsgd:8 out of the law for 50 steps. The cheap rest waits for the push.
        rounds = decision is not None and early is None and bool(self.uplink.progress_candidates())
        if rounds:
            self._track_progress(decision.level, spec)  # type: ignore[union-attr]
        t1 = time.perf_counter()
        exchange = self._net.submit(
            self._exchange(buckets, samples, early.futures if early else None, early.push_started if early else None)
        )
        if decision is not None and not rounds:
            self._track_progress(decision.level, spec)  # while the push is on the wire
        params, regear = self._await_exchange(exchange, t1, decision, sources, payloads)
        if regear is not None:
            stats.codec = regear.spec
        t2 = time.perf_counter()
        self._decode_s = 0.0
        for shard, p in enumerate(params):
            self._apply(p, shard)
        t3 = time.perf_counter()
        stats.version, stats.staleness = self.version, max(self._staleness)
        stats.early_buckets = sum(len(f) for f in early.futures) if early is not None else 0
        stats.encode_s, stats.wire_s = t1 - t0 + (early.encode_s if early else 0.0), t2 - t1
        comm_s, step_encode_s = self._push_s, stats.encode_s
        if regear is not None:  # the re-encoding counts as encoding; the withdrawn push's time does not
            stats.encode_s += regear.encode_s
            stats.wire_s -= regear.encode_s
            comm_s = max(0.0, t1 + self._push_s - regear.pushed_at)
            step_encode_s = regear.encode_s
        stats.compute_s = t0 - self._step_end if self._step_end is not None else 0.0
        stats.push_s, stats.wait_s = self._push_s, max(0.0, stats.wire_s - self._push_s)
        stats.decode_s, stats.apply_s = self._decode_s, max(0.0, t3 - t2 - self._decode_s)
        sent = sum(c.bytes_sent for c in self.clients)
        received = sum(c.bytes_received for c in self.clients)
        stats.bytes_up, stats.bytes_down = sent - self.bytes_up, received - self.bytes_down
        self.bytes_up, self.bytes_down = sent, received
        if decision is not None:
            self.uplink.observe(
                bytes_sent=sum(p.wire_size for p in payloads.values()),
                comm_s=comm_s,
                encode_s=step_encode_s,
                wire_s=stats.wire_s,
                version=self.version,
            )
        self.uplink.mark_end()
        self.last = stats
        self._step_end = time.perf_counter()
        return stats

    def close(self) -> None:
        """Leave the job (BYE) and stop the network thread."""
        if self._net.loop.is_closed():
            return
        async def close_all() -> None:
            await asyncio.gather(*(c.close() for c in self.clients))

        for hook in self._hooks:
            hook.remove()
        try:
            self._net.run(close_all(), timeout=10)
        finally:
            self.uplink.close()
            self._net.close()

    def __enter__(self) -> NetSenseOptimizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals -------------------------------------------------------------------------

    def _encode(self, key: str, grad: torch.Tensor, codec: Codec) -> tuple[Payload, torch.Tensor]:
        """The payload of `key` and what it stands for: encoding that tensor again (at another
        level, through error feedback) sends exactly what this payload would have."""
        if codec.lossless and self.feedback is None:
            return codec.encode(grad), grad  # with residuals left by lossy steps, feedback flushes them
        if self.feedback is None:
            from netsense.compression.feedback import ErrorFeedback

            self.feedback = ErrorFeedback()
        return self.feedback.compress(key, grad, codec)

    def _track_progress(self, level: int | None, spec: str) -> None:
        """Feed the policy the progress efficiency q of the level just sent (error feedback's sums)
        and, when it asks, of candidate levels measured on g + r, the next step's likely input."""
        codec = self._codec_for(self.slots[0].key, spec)
        if self.feedback is not None and not codec.lossless:
            self.uplink.observe_progress(level, self.feedback.pop_progress(unbiased=codec.unbiased))
        candidates = self.uplink.progress_candidates()
        if not candidates:
            return
        tensors = []
        for slot in self.slots:
            if slot.param.grad is None:
                continue
            g = slot.view(slot.param.grad).float()
            r = self.feedback.residual(slot.key) if self.feedback is not None else None
            tensors.append(g + r if r is not None and r.shape == g.shape else g)
        self.uplink.measure_progress(candidates, tensors)

    def _codec(self, spec: str) -> Codec:
        return make_codec(spec)

    @torch.no_grad()
    def _grad_ready(self, param: torch.Tensor) -> None:
        """Overlap: a parameter's gradient is final for this backward; encode its keys, push full buckets."""
        early = self._backward
        if early is None:
            t = time.perf_counter()
            decision = self.uplink.choose(self._net.run(self._read_link()), started=t)
            early = self._backward = BackwardPushes(
                [len(s) for s in self.shard_slots],
                self.overlap_bucket_bytes,
                decision.spec if decision is not None else self.codec_spec,
                decision,
                self._next_samples,
                self._push_early,
            )
        t = time.perf_counter()
        for slot in self._param_slots[id(param)]:
            early.add(self.owner[slot.key], slot.key, self._encode(slot.key, slot.view(param.grad), self._codec_for(slot.key, early.spec))[0])
        early.encode_s += time.perf_counter() - t

    def _push_early(self, shard: int, bucket: dict[str, Payload]) -> Future[int] | Future[BucketReply]:
        assert self._backward is not None and self._backward.samples is not None
        step, keys = self.versions[shard], len(self.shard_slots[shard])
        if self._pipelined(shard):
            return self._net.submit(self._push_bucket(shard, step, self._backward.samples, bucket))
        return self._net.submit(self.clients[shard].push(step, self._backward.samples, keys, bucket))

    def _pipelined(self, shard: int) -> bool:
        """Overlap against a synchronous PS: each bucket's keys are pulled as soon as they are applied."""
        welcome = self.clients[shard].welcome
        return self.overlap and welcome is not None and welcome.staleness < 0

    async def _push_bucket(self, shard: int, step: int, samples: int, bucket: dict[str, Payload]) -> BucketReply:
        """One bucket of a pipelined step (on the net thread): push it, pull its keys."""
        window = self._windows.get(shard)
        if window is None:
            window = self._windows[shard] = asyncio.Semaphore(PUSH_WINDOW)
        return await push_and_pull(self.clients[shard], window, step, samples, len(self.shard_slots[shard]), bucket)

    async def _exchange_pipelined(
        self, shard: int, buckets: list[dict[str, Payload]], samples: int, inflight: Sequence[Future[BucketReply]], started: float
    ) -> Params:
        """Push + keyed pulls of one shard's buckets; the replies merged into the step's PARAMS."""
        step, client = self.versions[shard], self.clients[shard]
        replies = [asyncio.wrap_future(f) for f in inflight]
        replies += [asyncio.ensure_future(self._push_bucket(shard, step, samples, b)) for b in buckets[len(inflight) :]]
        try:
            done = await asyncio.gather(*replies)
        except PeerError as exc:
            return await self._resync_stale(exc, replies, step, shard)
        self._push_times[shard] = max(r.acked_at for r in done) - started
        merged = merge_parts([p for r in done for p in r.parts], [s.key for s in self.shard_slots[shard]], step)
        if merged is None:  # not one update from our version (the PS moved on): take the parameters whole
            log.warning("shard %d: keyed replies of step %d do not form its update; resyncing", shard, step)
            return await client.pull(-1, 0)
        return merged

    async def _resync_stale(self, exc: PeerError, pending: Sequence[asyncio.Future[Any]], step: int, shard: int) -> Params:
        """A push or pull of `step` refused: cancel what is still in flight; if the barrier moved on
        without us (we were too slow), resync and skip this step, else re-raise."""
        for f in pending:
            f.cancel()
        if exc.code != "stale":
            raise exc
        log.warning("step %d dropped by shard %d (%s); resyncing", step, shard, exc.reason)
        return await self.clients[shard].pull(-1, 0)

    def _await_exchange(
        self, exchange: Future[list[Params]], started: float, decision: Decision | None,
        sources: dict[str, torch.Tensor] | None, payloads: dict[str, Payload],
    ) -> tuple[list[Params], Regear | None]:  # fmt: skip
        """The step's PARAMS. A push still running `_recheck_after(decision)` after `started` is put
        to the policy once (`UplinkController.recheck`); if it wants a heavier level, the pushes not
        yet sent whole are withdrawn and their keys re-encoded (`worker/withdraw.py`)."""
        after = _recheck_after(decision) if sources is not None else None
        if after is None:
            return exchange.result(), None
        try:
            return exchange.result(timeout=max(0.0, started + after - time.perf_counter())), None
        except TimeoutError:
            regear = self._regear(started, sources or {}, payloads)
        return exchange.result(), regear

    def _regear(self, started: float, sources: dict[str, torch.Tensor], payloads: dict[str, Payload]) -> Regear | None:
        """Re-decide a slow push mid-flight; on a heavier level, withdraw and re-encode what is
        still unsent (updating `payloads`); returns what was done, None when nothing was."""
        elapsed = time.perf_counter() - started
        if not self._slots:
            return None  # pipelined pushes (overlap) are not withdrawable
        link, acked, unsent = self._net.run(self._push_progress())
        # Asked even when every byte has left: the slow push is news, and a heavier level then
        # holds from the next step (logged as `all-sent`).
        new = self.uplink.redecide(link, bytes_acked=acked, elapsed_s=elapsed)
        if new is None or not unsent:
            return None
        taken = self._net.run(self._withdraw())
        if not taken:
            return None  # all sent meanwhile: the heavier level stands for the next step
        t = time.perf_counter()
        try:
            buckets = [
                {key: self._encode(key, sources[key], self._codec_for(key, new.spec))[0] for key in self._slots[shard][0][i].bucket}
                for shard, i in taken
            ]
        except BaseException as exc:
            self._net.run(self._settle(taken, exc))
            raise
        for bucket in buckets:
            payloads.update(bucket)
        self._net.run(self._settle(taken, buckets))
        encode_s = time.perf_counter() - t
        self.uplink.withdrawn(new, link, bytes_acked=acked, elapsed_s=elapsed)
        codec = self._codec_for(self.slots[0].key, new.spec)
        if self.feedback is not None and not codec.lossless:
            self.uplink.observe_progress(new.level, self.feedback.pop_progress(unbiased=codec.unbiased))
        log.info("push of step %d withdrawn after %.2f s; %d bucket(s) re-encoded as %s", self.version, elapsed, len(taken), new.spec)
        return Regear(new.spec, encode_s, time.perf_counter())

    async def _push_progress(self) -> tuple[LinkState, int, bool]:
        """(the path now, bytes of this step's pushes acked, whether any push is not yet sent whole)."""
        slots = [slot for shard_slots, _, _ in self._slots.values() for slot in shard_slots]
        return await self._read_link(), sum(s.bytes_acked() for s in slots), any(s.unsent() for s in slots)

    async def _withdraw(self) -> list[tuple[int, int]]:
        """Withdraw every push not yet sent whole (see `withdraw`); (shard, slot index) each."""
        return [(shard, i) for shard, (slots, _, _) in self._slots.items() for i in withdraw(self.clients[shard], slots)]

    async def _settle(self, taken: list[tuple[int, int]], outcome: list[dict[str, Payload]] | BaseException) -> None:
        """Give each withdrawn push its replacement bucket (also written back into the shard's bucket
        list, which a reconnect retry sends), or the error that stopped the re-encoding."""
        for n, (shard, i) in enumerate(taken):
            slots, first, buckets = self._slots[shard]
            if isinstance(outcome, BaseException):
                fail(slots[i], outcome)
                continue
            buckets[first + i] = outcome[n]
            replace(slots[i], outcome[n])

    def _codec_for(self, key: str, spec: str) -> Codec:
        """Per-key encoder instances: stateful codecs (warm starts) keep state per key."""
        codec = self._codecs.get(f"{key}|{spec}")
        if codec is None:
            codec = self._codecs[f"{key}|{spec}"] = make_codec(spec)
        return codec

    async def _start(self, optimizer: dict[str, object], timeout: float) -> None:
        self._optimizer_settings = optimizer
        await asyncio.gather(*(self._start_shard(i, timeout) for i in range(len(self.clients))))

    async def _start_shard(self, shard: int, timeout: float) -> None:
        client = self.clients[shard]
        welcome = await client.connect(timeout)
        if not welcome.initialized and self.rank == 0:
            await self._init_shard(shard)
        self._apply(await client.pull(-1, 0), shard)

    async def _init_shard(self, shard: int) -> None:
        """Rank 0 seeds a shard with its keys of the current replica."""
        fp32 = make_codec("fp32")
        tensors = {s.key: fp32.encode(s.view(s.param.detach())) for s in self.shard_slots[shard]}
        await self.clients[shard].init(tensors, self._optimizer_settings, self.world_size)

    async def _read_link(self) -> LinkState:
        """The path now (runs on the net thread, which owns the connections); with shards, the one
        that bounds the push (see `UplinkController.read_shards`)."""
        assert all(c.conn is not None for c in self.clients), "not connected"
        if len(self.clients) == 1:
            return self.uplink.read_link(self.client.conn.quic)  # type: ignore[union-attr]
        total = sum(s.numel for s in self.slots)
        shares = [sum(s.numel for s in slots) / total for slots in self.shard_slots]
        return self.uplink.read_shards([c.conn.quic for c in self.clients], shares)  # type: ignore[union-attr]

    async def _exchange(
        self,
        buckets: list[list[dict[str, Payload]]],
        samples: int,
        inflight: list[list[Future[int]]] | None = None,
        started: float | None = None,
    ) -> list[Params]:
        """One step's push + pull on every shard at once (`buckets` per shard); with overlap, the
        first buckets of a shard are already on their way (`inflight`, pushed since `started`)."""
        self._push_times = [0.0] * len(self.clients)
        self._staleness = [0] * len(self.clients)
        self._slots = {}
        params = await asyncio.gather(
            *(self._exchange_shard(i, b, samples, inflight[i] if inflight else [], started) for i, b in enumerate(buckets))
        )
        self._push_s = max(self._push_times)  # the slowest shard's push bounds the step
        return list(params)

    async def _exchange_shard(
        self, shard: int, buckets: list[dict[str, Payload]], samples: int, inflight: list[Future[int]], started: float | None
    ) -> Params:
        """Push + pull on one shard; if its connection drops, reconnect and retry or resync."""
        while True:
            step = self.versions[shard]
            try:
                return await self._exchange_once(shard, buckets, samples, inflight, started)
            except PeerTimeout as exc:
                params = await self._reconnect(exc, shard)
            inflight, started = [], None  # a retry pushes every bucket again
            if params.version != step:
                # The PS moved on, or went back to a checkpoint: follow its version, drop this step.
                log.warning("after reconnecting shard %d is at version %d (step was %d); resynced", shard, params.version, step)
                return params
            self._apply(params, shard)  # same version: the gradients still fit, push them again

    async def _reconnect(self, cause: Exception, shard: int = 0) -> Params:
        """Reconnect with capped exponential backoff, re-authenticate, pull the full parameters."""
        s, client = self._shards[shard], self.clients[shard]
        deadline = time.monotonic() + s.reconnect_deadline_s
        delay, attempt, started = s.reconnect_backoff_s, 0, time.monotonic()
        log.warning("connection to the PS lost (%s); reconnecting", cause)
        while True:
            attempt += 1
            try:
                welcome = await client.reconnect(min(s.connect_timeout_s, max(0.1, deadline - time.monotonic())))
                if not welcome.initialized and self.rank == 0:
                    # A PS restarted without a checkpoint: rank 0 seeds it with the current replica.
                    await self._init_shard(shard)
                params = await client.pull(-1, 0)
            except (AuthError, PeerTimeout, PeerError, OSError) as exc:
                if isinstance(exc, AuthError) and "refused" in str(exc):
                    raise  # wrong secret: retrying cannot help
                if time.monotonic() + delay >= deadline:
                    raise PeerTimeout(f"could not reconnect to the PS within {s.reconnect_deadline_s} s ({attempt} attempts): {exc}") from None
                log.info("reconnect attempt %d failed (%s); next in %.2f s", attempt, exc, delay)
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(2 * delay, s.reconnect_backoff_max_s)
                continue
            self.reconnects += 1
            log.warning("reconnected to the PS after %.2f s (%d attempts), version %d", time.monotonic() - started, attempt, params.version)
            return params

    async def _exchange_once(
        self,
        shard: int,
        buckets: list[dict[str, Payload]],
        samples: int,
        inflight: Sequence[Future[int]] = (),
        started: float | None = None,
    ) -> Params:
        step, client, keys = self.versions[shard], self.clients[shard], len(self.shard_slots[shard])
        started = started if inflight and started is not None else time.perf_counter()
        if self._pipelined(shard):
            return await self._exchange_pipelined(shard, buckets, samples, inflight, started)  # type: ignore[arg-type]
        pushes = [asyncio.wrap_future(f) for f in inflight]
        slots = [PushSlot(b) for b in buckets[len(inflight) :]]
        self._slots[shard] = (slots, len(inflight), buckets)
        pushes += [asyncio.ensure_future(push_slot(client, slot, step, samples, keys)) for slot in slots]
        # An async PS (SSP) applies our push on its own and answers a pull with the full parameters
        # at whatever version is current; we pull only once the pushes are in, so the PS has counted
        # this step before it decides whether we may start the next (one more RTT than sync mode).
        asynchronous = client.welcome is not None and client.welcome.staleness >= 0
        pull = None if asynchronous else asyncio.ensure_future(client.pull(step, step + 1))
        try:
            acks = await asyncio.gather(*pushes)
            self._push_times[shard] = time.perf_counter() - started  # first byte to the last push's ack
        except PeerError as exc:
            return await self._resync_stale(exc, pushes if pull is None else [pull, *pushes], step, shard)
        if pull is None:
            self._staleness[shard] = max(0, max(acks) - 1 - step)  # the last ack names our update's version
            return await client.pull(-1, 0)
        return await pull

    def _apply(self, params: Params, shard: int = 0) -> None:
        """Write a PARAMS message of `shard` into the model; validates it against its keys."""
        slots = self.shard_slots[shard]
        if not params.full and params.base_version != self.versions[shard]:
            raise ProtocolError("version", f"delta for version {params.base_version}, replica is at {self.versions[shard]}")
        if params.full and len(params.tensors) != len(slots):
            raise ProtocolError("keys", f"PS shard {shard} has {len(params.tensors)} keys, this model assigns it {len(slots)}")
        for slot in slots:
            payload = params.tensors.get(slot.key)
            if payload is None:
                if params.full:
                    raise ProtocolError("key", f"PS parameters lack key {slot.key!r}: is it the same model?")
                continue
            if tuple(payload.shape) != slot.shape:
                raise ProtocolError("shape", f"key {slot.key!r}: PS shape {payload.shape} != model shape {slot.shape}")
            td = time.perf_counter()
            value = self._codec(payload.codec).decode(payload, device=slot.param.device)
            self._decode_s += time.perf_counter() - td
            target = slot.view(slot.param.data)
            if params.full:
                target.copy_(value)
            else:
                target.add_(value.to(target.dtype))
        self.versions[shard] = params.version
        self.version = min(self.versions)


RECHECK_FACTOR = 2.0
"""A push still running this many times its predicted communication time is put to the policy..."""
RECHECK_MIN_S = 0.2
"""...and at least this long past it: a few ms of scheduling noise on a fast path is no news."""


def _recheck_after(decision: Decision | None) -> float | None:
    """Seconds after the push starts at which it is re-decided, None when it never is (no
    prediction: bandwidth unknown, or a fixed policy)."""
    if decision is None or decision.predicted_comm_s is None or decision.level is None:
        return None
    comm = decision.predicted_comm_s
    return max(RECHECK_FACTOR * comm, comm + RECHECK_MIN_S)


@dataclass(frozen=True)
class Regear:
    """A step whose push was withdrawn mid-flight and re-encoded."""

    spec: str
    """The level it was re-encoded at."""
    encode_s: float
    """Seconds the re-encoding took."""
    pushed_at: float
    """perf_counter when the replacement pushes were handed to the network thread."""


def _buckets(payloads: dict[str, Payload], bucket_bytes: int) -> list[dict[str, Payload]]:
    """Group small keys into messages of about `bucket_bytes` (one stream each); large keys alone."""
    buckets: list[dict[str, Payload]] = []
    current: dict[str, Payload] = {}
    size = 0
    for key, p in payloads.items():
        if current and size + p.wire_size > bucket_bytes:
            buckets.append(current)
            current, size = {}, 0
        current[key] = p
        size += p.wire_size
    if current:
        buckets.append(current)
    return buckets


def _secret(connect: ConnectSettings) -> bytes | None:
    if connect.secret_file:
        return load_secret(connect.secret_file)
    if connect.insecure:
        return None
    raise ConfigError("no shared secret: pass --secret FILE (from `netsense certs`) or --insecure for local experiments")


def _client_config(connect: ConnectSettings):  # type: ignore[no-untyped-def]
    if connect.ca is not None and not Path(connect.ca).exists():
        raise ConfigError(f"CA file {connect.ca} does not exist; create it with `netsense certs --out DIR`")
    return client_configuration(
        connect.transport, ca=connect.ca, server_name=connect.server_name or connect.host, insecure=connect.insecure
    )
