"""`Exchange`: everything a worker does on the network, on its own event-loop thread.

The training thread (`NetSenseOptimizer`) calls the public methods, and each of them is ONE
crossing to the network thread (one `run_coroutine_threadsafe`); the private coroutines run
there. A step's push + pull on every shard, with reconnects and retries, is one coroutine
(`start_step`), so a step crosses once. The policy's choice needs the path (`read_link`), whose
state may only be read on the loop that runs the connection: the step's coroutine reads it as its
last act and the next `read_link` takes that snapshot. Between a step's pull and the next `step()`
nothing of this worker's crosses the path but its acknowledgements of the pull, which its sending
state (cwnd, bytes in flight, RTT samples, delivery rate) does not see, so the snapshot is the path
at `step()` start; a crossing of its own for it cost every adaptive step two thread hand-overs
(~1 % of a wide-mlp worker's training thread on a busy 2-core host: docs/history/BENCHMARKS-2026.md, "The clock
from the last worker's start"). A probe (`probe`) moves the path: the snapshot before it is
dropped. Redeciding a slow push (worker/redecide.py) adds one crossing (progress, the policy's
verdict and the withdrawal at once) and, when pushes were withdrawn, one to hand over their re-encoded
buckets. With overlap each bucket pushed from a gradient hook is a crossing of its own.

The connections, the reconnect counter and the pushes in flight are written only here. The uplink
(`read_link`, the redecide verdict) and the replica (the pulls of a reconnect) are touched here
only while the training thread waits on the crossing that does it, so never by both at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from netsense.compression import LinkState, Payload
from netsense.compression.policy import Decision
from netsense.errors import NetSenseError, PeerError, PeerTimeout
from netsense.transport.wire import Params

from .client import PSClient
from .connect import ConnectSettings, connect_first, make_client, reconnect
from .netthread import NetThread
from .overlap import PUSH_WINDOW, BucketReply, merge_parts, push_and_pull
from .redecide import PushSlot, Withdrawal, discard, fail, push_slot, replace, withdraw
from .replica import Replica
from .uplink import UplinkController
from .wanpushes import WanPushes, shard_role

log = logging.getLogger(__name__)

Decide = Callable[[LinkState, int], "Decision | None"]
"""(the path now, bytes of the step's pushes acked) -> a heavier decision, or None to keep the push."""


@dataclass(frozen=True)
class StepResult:
    """What one step's push + pull brought back."""

    params: list[Params]
    """Each shard's PARAMS (the next version, or the whole parameters after a resync)."""
    push_s: float
    """First push byte to the last push's ack, on the slowest shard."""
    staleness: int
    """Async PS: updates applied between this step's version and its own update (max over shards)."""
    delivered: tuple[int, float] | None = None
    """The last update's delivery as the PS timed it (`PSClient.delivered`): wire bytes over every
    shard and the slowest shard's seconds; None unless every shard reported one this step."""


@dataclass
class _Tally:
    """Per shard, what one step's pushes measured (written by the shards' coroutines)."""

    push_s: list[float]
    staleness: list[int]
    delivered: list[tuple[int, float] | None]

    def delivery(self) -> tuple[int, float] | None:
        """Every shard's report combined (`StepResult.delivered`), None if one is missing."""
        reports = [d for d in self.delivered if d is not None]
        if not reports or len(reports) < len(self.delivered):
            return None
        return sum(b for b, _ in reports), max(s for _, s in reports)


class Exchange:
    """One connection per PS shard, on a private event loop; connects (and seeds, on rank 0) at once."""

    def __init__(
        self,
        shards: list[ConnectSettings],
        replica: Replica,
        uplink: UplinkController,
        *,
        worker_id: str,
        rank: int,
        world_size: int,
        optimizer: dict[str, object],
        overlap: bool,
        wan_first: bool = True,
    ) -> None:
        self.replica = replica
        self.uplink = uplink
        self.shards = shards
        self.rank = rank
        self.world_size = world_size
        self.overlap = overlap
        """Pipeline against a sync PS: each bucket's keys are pulled as soon as they are applied."""
        self.reconnects = 0
        """Connections re-established after a drop (PS restart, path change, timeout)."""
        self._optimizer = optimizer  # sent with INIT by rank 0
        self._windows = [asyncio.Semaphore(PUSH_WINDOW) for _ in shards]  # pipelined pushes on the wire
        self._slots: dict[int, tuple[list[PushSlot], int, list[dict[str, Payload]]]] = {}
        """Per shard, this step's withdrawable pushes: their slots, the index of the first in the
        shard's bucket list, and that list (a replacement is written back for reconnect retries)."""
        self._reconnecting: set[int] = set()
        """Shards whose connection is being replaced: their link and pushes are not to be read."""
        self._link_after: LinkState | None = None  # the path as the last step left it, taken once
        self._wan_first = wan_first and all(x.wan_first for x in shards)
        self._wan: WanPushes | None = None
        """With shards both at this site and at others: the far pushes go first (`_start`)."""
        self._roles: list[str | None] = [None] * len(shards)
        self.start_probe: tuple[int, float, str] | None = None
        """The uplink's start-up probe taken while connecting (`_start`): bytes, seconds, and what
        they were (``init``: rank 0's INIT; ``probe``: filler); None when none was asked for."""
        self.net = NetThread()
        """The private event loop (on its own thread) that runs every connection."""
        try:
            self.clients: list[PSClient] = [make_client(s, worker_id, rank) for s in shards]
            """One connection per PS shard."""
            self.net.run(self._start(uplink.probe_bytes()))
        except BaseException:
            self.net.close()
            raise

    # --- crossings: called on the training thread, one run_coroutine_threadsafe each ----------

    def read_link(self) -> LinkState:
        """The path now; with shards, the one that bounds the push (`UplinkController.read_shards`):
        as the last step left it (no crossing), or by a crossing before the first step and after a
        probe."""
        link, self._link_after = self._link_after, None
        return link if link is not None else self.net.run(self._read_link())

    def probe(self, nbytes: int) -> tuple[int, float]:
        """Push `nbytes` of filler through the path, split over the shards as a push is: (bytes
        sent, seconds from the first byte to the last shard's ack)."""
        self._link_after = None  # the filler moves the path
        return self.net.run(self._probe(nbytes))

    def start_step(
        self,
        buckets: list[list[dict[str, Payload]]],
        samples: int,
        inflight: list[list[Future[Any]]] | None = None,
        started: float | None = None,
        *,
        pad_bytes: int = 0,
    ) -> Future[StepResult]:
        """Start one step's push + pull on every shard (`buckets` per shard); with overlap, the
        first buckets of a shard are already on their way (`inflight`, pushed since `started`).
        `pad_bytes` of filler (a policy's probe, `Decision.pad_bytes`) go out beside the pushes,
        split over the shards as a push is; the push time then runs to the filler's ack too."""
        return self.net.submit(self._step(buckets, samples, inflight, started, pad_bytes))

    def push_early(self, shard: int, bucket: dict[str, Payload], samples: int) -> Future[int] | Future[BucketReply]:
        """Overlap: push one bucket from a gradient hook (pipelined: with the pull of its keys)."""
        step, keys = self.replica.versions[shard], len(self.replica.shard_slots[shard])
        if self._pipelined(shard):
            return self.net.submit(self._push_bucket(shard, step, samples, bucket))
        return self.net.submit(
            self._push_after_wan(shard, step, lambda: self.clients[shard].push(step, samples, keys, bucket, sent=self._sent(shard, step)))
        )

    def redecide(self, decide: Decide) -> Withdrawal | None:
        """Put the step's slow push to `decide` (on the loop, so the progress it sees is what is
        withdrawn); on a heavier decision withdraw every push not yet sent whole. None: nothing was."""
        return self.net.run(self._redecide(decide))

    def settle(self, withdrawal: Withdrawal, outcome: list[dict[str, Payload]] | BaseException) -> None:
        """Give each withdrawn push its re-encoded bucket (also written back into the shard's
        bucket list, which a reconnect retry sends), or the error that stopped the re-encoding."""
        self.net.run(self._settle(withdrawal.taken, outcome))

    def close(self) -> None:
        """Leave the job (BYE on every shard) and stop the network thread."""
        if self._wan is not None:
            log.info("WAN pushes first: this site's shards waited %.2f s in all for the far pushes", self._wan.held_s)

        async def close_all() -> None:
            await asyncio.gather(*(c.close() for c in self.clients))

        try:
            self.net.run(close_all(), timeout=10)
        finally:
            self.net.close()

    # --- read without crossing ---------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.net.loop.is_closed()

    def traffic(self) -> tuple[int, int]:
        """(bytes sent, bytes received) over every shard so far: counters, read as they stand."""
        return sum(c.bytes_sent for c in self.clients), sum(c.bytes_received for c in self.clients)

    def _pipelined(self, shard: int) -> bool:
        welcome = self.clients[shard].welcome
        return self.overlap and welcome is not None and welcome.staleness < 0

    # --- on the network thread --------------------------------------------------------------

    async def _start(self, probe_bytes: int) -> None:
        """Connect to every shard (rank 0 seeds the empty ones), take the uplink's start-up probe
        when `probe_bytes` asks for one, then pull the first parameters. The probe is taken here,
        where it costs no time of its own: rank 0's INIT is the sample when it seeded every shard
        (the whole model through the path) with at least `probe_bytes` (a smaller model's rank 0
        sends filler after it), and any other rank sends its filler while the PS waits for that
        INIT. At step 0 it held each worker's first push 0.08-0.24 s on the matrix's
        links (docs/history/BENCHMARKS-2026.md, "Start-up: update 0 chosen on itself, the probe while
        connecting"). A rank that finds the PS running sends its filler here as it did at step 0:
        its first push waits for it either way."""
        seeded = await asyncio.gather(*(self._connect_shard(i) for i in range(len(self.clients))))
        self._order_pushes()
        if probe_bytes > 0:
            init = sum(n for n, _ in seeded)
            if all(n > 0 for n, _ in seeded) and init >= probe_bytes:  # the INITs ran side by side, as a push's parts do
                self.start_probe = (init, max(t for _, t in seeded), "init")
            else:
                try:
                    self.start_probe = (*await self._probe(probe_bytes), "probe")
                except NetSenseError as exc:
                    log.warning("uplink probe failed (%s); the first steps go out at the unknown-bandwidth level", exc)
        await asyncio.gather(*(self._pull_first(i) for i in range(len(self.clients))))

    async def _connect_shard(self, shard: int) -> tuple[int, float]:
        """Connect (and authenticate) to one shard and, on rank 0, seed it if it is empty; returns
        the bytes of the INIT sent and the seconds to its ack ((0, 0.0): none)."""
        client = self.clients[shard]
        welcome = await connect_first(client, self.shards[shard])
        if welcome.initialized or self.rank != 0:
            return 0, 0.0
        before, t0 = client.bytes_sent, time.perf_counter()
        await self._seed(shard)
        return client.bytes_sent - before, time.perf_counter() - t0

    async def _pull_first(self, shard: int) -> None:
        self.replica.apply(await self.clients[shard].pull(-1, 0), shard)

    async def _seed(self, shard: int) -> None:
        """Rank 0 seeds a shard with its keys of the current replica."""
        await self.clients[shard].init(self.replica.seed(shard), self._optimizer, self.world_size, self.replica.model_info(shard))

    def _split(self, nbytes: int) -> list[int]:
        """`nbytes` of filler per shard, by the shards' shares of the payload."""
        return [max(1, round(nbytes * share)) for share in self.replica.shares()]

    async def _probe(self, nbytes: int) -> tuple[int, float]:
        sizes = self._split(nbytes)
        t0 = time.perf_counter()
        await asyncio.gather(*(c.probe(n) for c, n in zip(self.clients, sizes)))
        return sum(sizes), time.perf_counter() - t0

    async def _read_link(self) -> LinkState:
        assert all(c.conn is not None for c in self.clients), "not connected"
        if len(self.clients) == 1:
            return self.uplink.read_link(self.clients[0].conn.quic)  # type: ignore[union-attr]
        return self.uplink.read_shards([c.conn.quic for c in self.clients], self.replica.shares())  # type: ignore[union-attr]

    async def _step(
        self,
        buckets: list[list[dict[str, Payload]]],
        samples: int,
        inflight: list[list[Future[Any]]] | None,
        started: float | None,
        pad_bytes: int,
    ) -> StepResult:
        tally = _Tally([0.0] * len(self.clients), [0] * len(self.clients), [None] * len(self.clients))
        self._slots = {}
        pads = self._split(pad_bytes) if pad_bytes > 0 else [0] * len(buckets)
        params = await asyncio.gather(
            *(
                self._step_shard(i, b, samples, inflight[i] if inflight else [], started, tally, pads[i])
                for i, b in enumerate(buckets)
            )
        )
        if all(c.conn is not None for c in self.clients):
            self._link_after = await self._read_link()  # read by the training thread after this returns
        # The slowest shard bounds the step.
        return StepResult(list(params), max(tally.push_s), max(tally.staleness), tally.delivery())

    async def _step_shard(
        self,
        shard: int,
        buckets: list[dict[str, Payload]],
        samples: int,
        inflight: list[Future[Any]],
        started: float | None,
        tally: _Tally,
        pad: int,
    ) -> Params:
        """Push + pull on one shard; if its connection drops, reconnect and retry or resync."""
        while True:
            step = self.replica.versions[shard]
            try:
                return await self._push_pull(shard, buckets, samples, inflight, started, tally, pad)
            except PeerTimeout as exc:
                seed = (lambda: self._seed(shard)) if self.rank == 0 else None
                self._reconnecting.add(shard)
                try:
                    params = await reconnect(self.clients[shard], self.shards[shard], exc, seed)
                    # A push withdrawn before the drop is re-encoded on the training thread: the
                    # retry must send the replacement, which error feedback already accounts for.
                    await self._replacements(shard)
                finally:
                    self._reconnecting.discard(shard)
                self.reconnects += 1
            inflight, started, pad = [], None, 0  # a retry pushes every bucket again, without the probe
            if params.version != step:
                # The PS moved on, or went back to a checkpoint: follow its version, drop this step.
                log.warning("after reconnecting shard %d is at version %d (step was %d); resynced", shard, params.version, step)
                return params
            self.replica.apply(params, shard)  # same version: the gradients still fit, push them again

    async def _push_pull(
        self,
        shard: int,
        buckets: list[dict[str, Payload]],
        samples: int,
        inflight: Sequence[Future[Any]],
        started: float | None,
        tally: _Tally,
        pad: int = 0,
    ) -> Params:
        step, client, keys = self.replica.versions[shard], self.clients[shard], len(self.replica.shard_slots[shard])
        started = started if inflight and started is not None else time.perf_counter()
        if self._pipelined(shard):
            return await self._push_pull_pipelined(shard, buckets, samples, inflight, started, tally, pad)
        pushes = [asyncio.wrap_future(f) for f in inflight]
        slots = [PushSlot(b) for b in buckets[len(inflight) :]]
        self._slots[shard] = (slots, len(inflight), buckets)
        pushes += [
            asyncio.ensure_future(
                self._push_after_wan(shard, step, lambda slot=slot: push_slot(client, slot, step, samples, keys, self._sent(shard, step)))
            )
            for slot in slots
        ]
        self._far_sent(shard, step, total=len(pushes))
        # After the pushes: aioquic serves its streams round robin, packet by packet, so the pushes
        # still reach the PS first and the barrier and the update run while the filler drains.
        filler = [asyncio.ensure_future(client.probe(pad))] if pad > 0 else []
        # An async PS (SSP) applies our push on its own and answers a pull with the full parameters
        # at whatever version is current; we pull only once the pushes are in, so the PS has counted
        # this step before it decides whether we may start the next (one more RTT than sync mode).
        asynchronous = client.welcome is not None and client.welcome.staleness >= 0
        pull = None if asynchronous else asyncio.ensure_future(client.pull(step, step + 1))
        try:
            acks = (await asyncio.gather(*pushes, *filler))[: len(pushes)]
            tally.push_s[shard] = time.perf_counter() - started  # first byte to the last push's (and filler's) ack
            tally.delivered[shard] = client.take_delivered()
        except PeerError as exc:
            self._far_pushed(shard, step)  # now: the near shard's held push must not wait out the resync
            return await self._resync_stale(exc, [*filler, *pushes] if pull is None else [pull, *filler, *pushes], step, shard)
        except BaseException:
            discard([*filler, *pushes] if pull is None else [pull, *filler, *pushes])  # a dropped connection fails the pull too
            raise
        finally:
            self._far_pushed(shard, step)
        if pull is None:
            tally.staleness[shard] = max(0, max(acks) - 1 - step)  # the last ack names our update's version
            return await client.pull(-1, 0)
        return await pull

    async def _push_pull_pipelined(
        self,
        shard: int,
        buckets: list[dict[str, Payload]],
        samples: int,
        inflight: Sequence[Future[BucketReply]],
        started: float,
        tally: _Tally,
        pad: int,
    ) -> Params:
        """Push + keyed pulls of one shard's buckets; the replies merged into the step's PARAMS."""
        step, client = self.replica.versions[shard], self.clients[shard]
        replies = [asyncio.wrap_future(f) for f in inflight]
        replies += [asyncio.ensure_future(self._push_bucket(shard, step, samples, b)) for b in buckets[len(inflight) :]]
        self._far_sent(shard, step, total=len(replies))
        filler = [asyncio.ensure_future(_acked_at(client.probe(pad)))] if pad > 0 else []
        try:
            done = await asyncio.gather(*replies)
            acked = await asyncio.gather(*filler)
        except PeerError as exc:
            self._far_pushed(shard, step)
            return await self._resync_stale(exc, [*replies, *filler], step, shard)
        except BaseException:
            discard([*replies, *filler])
            raise
        finally:
            self._far_pushed(shard, step)
        tally.push_s[shard] = max([r.acked_at for r in done] + acked) - started
        pushed_state = [s.key for s in self.replica.shard_state(shard) if any(s.key in b for b in buckets)]
        keys = [s.key for s in self.replica.shard_slots[shard]] + pushed_state  # the buffers come back averaged
        merged = merge_parts([p for r in done for p in r.parts], keys, step)
        if merged is None:  # not one update from our version (the PS moved on): take the parameters whole
            log.warning("shard %d: keyed replies of step %d do not form its update; resyncing", shard, step)
            return await client.pull(-1, 0)
        return merged

    async def _push_bucket(self, shard: int, step: int, samples: int, bucket: dict[str, Payload]) -> BucketReply:
        """One bucket of a pipelined step: push it, pull its keys (this site's shard after the far
        shards' pushes of the step have left)."""
        keys, state = len(self.replica.shard_slots[shard]), {s.key for s in self.replica.shard_state(shard)}
        await self._hold_local(shard, step)
        sent = (lambda: self._far_sent(shard, step)) if self._roles[shard] == "remote" else None
        return await push_and_pull(self.clients[shard], self._windows[shard], step, samples, keys, bucket, state, sent)

    # --- WAN pushes first (worker/wanpushes.py) ---------------------------------------------

    def _order_pushes(self) -> None:
        """Once connected: which shards are at this site and which at others (their WELCOME's site
        against ours); with both, pushes to this site's shards wait for the far ones to leave
        (not against an asynchronous PS: it applies each push alone, there is no step to order)."""
        self._roles = [
            shard_role(s.site, c.welcome.site if c.welcome is not None else "") for s, c in zip(self.shards, self.clients)
        ]
        asynchronous = any(c.welcome is not None and c.welcome.staleness >= 0 for c in self.clients)
        if self._wan_first and not asynchronous and "local" in self._roles and "remote" in self._roles:
            self._wan = WanPushes()
            for shard, role in enumerate(self._roles):
                if role == "remote":
                    self._wan.remote(shard)

    async def _hold_local(self, shard: int, step: int) -> None:
        if self._wan is not None and self._roles[shard] == "local":
            await self._wan.hold(step)

    async def _push_after_wan(self, shard: int, step: int, push: Callable[[], Awaitable[int]]) -> int:
        """`push()` once this site's shard may go (`_hold_local`); other shards' at once."""
        await self._hold_local(shard, step)
        return await push()

    def _far_pushed(self, shard: int, step: int) -> None:
        """Every push of `step` to far shard `shard` has left whole, or failed (idempotent; other
        shards are ignored by `WanPushes`)."""
        if self._wan is not None:
            self._wan.pushed(shard, step)

    def _sent(self, shard: int, step: int) -> asyncio.Future[None] | None:
        """For a push to a far shard: a future set when its last byte has left (`WanPushes.sent`).
        Left, not acked: waiting for the acks cost digits-cnn, 2 x 1, 3-5 ms of a 40 ms step."""
        return self._wan.sent(shard, step) if self._wan is not None and self._roles[shard] == "remote" else None

    def _far_sent(self, shard: int, step: int, total: int | None = None) -> None:
        """One more push of `step` to `shard` has left whole, or (`total`) how many the step has
        (`WanPushes.left`)."""
        if self._wan is not None:
            self._wan.left(shard, step, total=total)

    async def _resync_stale(self, exc: PeerError, pending: Sequence[asyncio.Future[Any]], step: int, shard: int) -> Params:
        """A push or pull of `step` refused: cancel what is still in flight; if the barrier moved on
        without us (we were too slow), or the PS refused the step whole because it would have
        poisoned the model (`non-finite-update`: docs/RELIABILITY.md, "Poisoned updates"), resync
        and skip this step, else re-raise."""
        discard(pending)
        if exc.code not in ("stale", "non-finite-update"):
            raise exc
        log.warning("step %d dropped by shard %d (%s); resyncing", step, shard, exc.reason)
        return await self.clients[shard].pull(-1, 0)

    async def _redecide(self, decide: Decide) -> Withdrawal | None:
        if not self._slots:
            return None  # pipelined pushes (overlap) are not withdrawable
        if self._reconnecting or any(c.conn is None for c in self.clients):
            # The push is slow because its connection is being replaced: there is no link to read,
            # and the retry after the reconnect pushes every bucket again anyway.
            log.info("slow push not redecided: reconnecting to shard(s) %s", sorted(self._reconnecting))
            return None
        slots = [slot for shard_slots, _, _ in self._slots.values() for slot in shard_slots]
        link, acked, unsent = await self._read_link(), sum(s.bytes_acked() for s in slots), any(s.unsent() for s in slots)
        # Asked even when every byte has left: the slow push is news, and a heavier level then
        # holds from the next step (logged as `all-sent`).
        new = decide(link, acked)
        if new is None or not unsent:
            return None
        taken = [(shard, i) for shard, (pushes, _, _) in self._slots.items() for i in withdraw(self.clients[shard], pushes)]
        if not taken:
            return None  # none could be withdrawn: the heavier level stands for the next step
        return Withdrawal(new, link, acked, taken, [self._slots[shard][0][i].bucket for shard, i in taken])

    async def _replacements(self, shard: int) -> None:
        """Wait until every push of `shard` withdrawn this step has its re-encoded bucket (written
        into the bucket list by `_settle`); raises what stopped a re-encoding."""
        pushes, _, _ = self._slots.get(shard, ([], 0, []))
        for slot in pushes:
            if slot.replacement is not None:
                await asyncio.shield(slot.replacement)

    async def _settle(self, taken: list[tuple[int, int]], outcome: list[dict[str, Payload]] | BaseException) -> None:
        for n, (shard, i) in enumerate(taken):
            slots, first, buckets = self._slots[shard]
            if isinstance(outcome, BaseException):
                fail(slots[i], outcome)
                continue
            buckets[first + i] = outcome[n]
            replace(slots[i], outcome[n])


async def _acked_at(request: Awaitable[None]) -> float:
    """When `request` was answered (perf_counter)."""
    await request
    return time.perf_counter()
