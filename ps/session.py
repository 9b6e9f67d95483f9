"""One worker connection on the PS: the HELLO/CHALLENGE/AUTH handshake, the admission bounds, and
the requests of an authenticated worker mapped to `PSServer` and store calls.

Per-connection state lives here; what every connection shares (the store, the barrier clock, the
caches, checkpoints) is the `PSServer`'s, so a session only asks it to wait, wake or encode.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from typing import TYPE_CHECKING

from netsense.errors import AuthError, ConfigError, ProtocolError
from netsense.transport.auth import new_nonce, verify_mac
from netsense.transport.logsafe import printable, quoted, suppressed_note
from netsense.transport.sensing.aioquic_private import peer_host
from netsense.transport.sensing.congestion import sensing_state
from netsense.transport.wire import Ack, Auth, Bye, Challenge, Hello, Init, Message, Params, Probe, Pull, Push, Welcome

from .store import StepApplied
from .store.guard import UpdateRefused

if TYPE_CHECKING:
    from netsense.transport.listener import ServerConnection

    from .server import PSServer

log = logging.getLogger(__name__)


class WorkerSession:
    """One connection's state: the handshake, then requests from an authenticated worker."""

    def __init__(self, server: PSServer, conn: ServerConnection) -> None:
        self.server = server
        self.conn = conn
        self.worker_id: str | None = None
        self.peer = "unauthenticated peer"
        self._hello: Hello | None = None
        self._server_nonce: bytes | None = None
        self.authenticated = False
        self.host: str | None = None
        self.closed = False
        self.admitted = False
        """Whether `_admit` has run: the caps hold for admitted connections (a new one waits one
        loop iteration for its peer address)."""
        self.opened_at = time.monotonic()
        self.site = ""
        """The site its HELLO named ("" : not said): the PS answers other sites first (`WanFirst`)."""
        self.pulling: collections.Counter[int] = collections.Counter()
        """Its pulls waiting or being answered, by version (pipelined pulls: several at once)."""
        self._reported = -1
        """The newest update return (`UpdateReturns.latest`) an ACK of this connection reported."""
        self.keeps = False
        """Whether its last PUSH said it keeps its pushes (`Push.keeps`): it can take forwarded ones."""
        server.connections.add(self)
        loop = asyncio.get_event_loop()
        # aioquic creates the protocol before it feeds the first datagram, so the peer address
        # is known one loop iteration later.
        loop.call_soon(self._admit)
        self._deadline = loop.call_later(server.settings.handshake_timeout_s, self._handshake_expired)

    def _admit(self) -> None:
        """Bound connections per peer address and connections still mid-handshake.

        Per address, a new connection past a cap is closed: only that address suffers. Past the
        global cap on handshakes the OLDEST unauthenticated connection is closed instead, so a
        flood from many addresses cannot lock a worker out: its connection is the newest, and a
        real handshake takes milliseconds, not the time it takes to open 64 more connections."""
        if self.closed:
            return
        self.admitted = True
        self.host = peer_host(self.conn.quic)
        s, live = self.server.settings, [c for c in self.server.connections if not c.closed and c is not self]
        pending = sorted((c for c in live if not c.authenticated), key=lambda c: c.opened_at)
        same_host = sum(1 for c in live if c.host == self.host)
        same_host_pending = sum(1 for c in pending if c.host == self.host)
        if self.host is not None and same_host >= s.max_connections_per_host:
            self.refuse(f"more than {s.max_connections_per_host} connections from {self.host}")
        elif self.host is not None and same_host_pending >= s.max_unauthenticated_per_host:
            self.refuse(f"more than {s.max_unauthenticated_per_host} connections from {self.host} are mid-handshake")
        else:
            for old in pending[: max(0, len(pending) + 1 - s.max_unauthenticated)]:
                old.refuse(f"more than {s.max_unauthenticated} connections are mid-handshake; the oldest is closed")

    def _handshake_expired(self) -> None:
        if not self.authenticated and not self.closed:
            self.refuse(f"not authenticated within {self.server.settings.handshake_timeout_s} s")

    def refuse(self, reason: str) -> None:
        """Close this connection now (a bound was hit); the peer sees `reason`."""
        if self.closed:
            return
        self.log_refusal("closing connection from %s: %s", self.host or self.peer, reason)
        self.server.refused_connections += 1
        self._forget()
        self.conn.close(error_code=0x1, reason_phrase=reason[:200])

    def log_refusal(self, fmt: str, *args: object) -> None:
        """A WARNING about this peer, at most one per address per `refusal_log_interval_s`, with
        every argument escaped (peer strings cannot break the line)."""
        suppressed = self.server.refusal_log.allow(self.host)
        if suppressed is not None:
            log.warning(fmt + "%s", *(printable(a) for a in args), suppressed_note(suppressed))

    def _forget(self) -> None:
        self.closed = True
        self._deadline.cancel()
        self.server.connections.discard(self)

    async def handle(self, msg: Message) -> Message | bytes | None:
        if isinstance(msg, Hello):
            return self._on_hello(msg)
        if isinstance(msg, Auth):
            return await self._on_auth(msg)
        if not self.authenticated:
            raise ProtocolError("auth", f"{type(msg).__name__.upper()} before authentication; send HELLO first")
        if isinstance(msg, Probe):
            return Ack(self.server.store.version)  # path measurement: the bytes are dropped
        if self._hello is not None and self._hello.role == "probe":
            if isinstance(msg, Bye):
                return Ack(self.server.store.version)
            raise ProtocolError("role", f"{type(msg).__name__.upper()} on a probe connection: it may send only PROBE and BYE")
        store = self.server.store
        assert self.worker_id is not None
        if isinstance(msg, Init):
            if self._hello is None or self._hello.rank != 0:
                raise ProtocolError("init", "only rank 0 may initialize the parameters")
            store.initialize(msg.tensors, msg.optimizer, msg.world_size, msg.model, self._hello.job_id)
            if self.server.downlink is not None and store.version == 0:
                self.server.downlink.prepare(store.shadow)  # while the workers run their first step
            for wid in self.server.sessions:  # everyone already connected is in the first barrier
                store.join(wid)
            await self.server.applied(StepApplied(store.version, (), 0))
            return Ack(store.version)
        if isinstance(msg, Push):
            self.server.note_push()
            down = self.server.downlink
            if down is not None and store.initialized and down.due(store.version):
                down.before_step(
                    store.version, params=store.params, shadow=store.shadow, last_encode=store.last_encode,
                    payload_bytes=4 * store.numel,
                )
                if down.defers(store.version):  # update 0: chosen on itself (`DownlinkController.defers`)
                    version, dense = store.version, 4 * store.numel
                    down.defer(version)
                    store.defer_downlink(lambda params: down.choose_on_update(version, params, self.server.live_links(), dense))
                else:
                    store.set_downlink(down.choose(store.version, self.server.live_links(), 4 * store.numel))
            ahead = store.applied_keys
            self.keeps = msg.keeps
            try:
                result = store.push(self.worker_id, msg)
            except UpdateRefused:
                await self.server.refused()
                raise
            await self.server.applied(result)
            if result is None and store.applied_keys != ahead:
                await self.server.wake()  # keys applied ahead: pipelined pulls may go
            # The version this push made (async mode: the worker derives its staleness from it),
            # and what the latest update took to reach every worker (their policies price it).
            return Ack(result.version if result is not None else store.version, *self._return_report())
        if isinstance(msg, Pull):
            self.pulling[msg.wait_for] += 1
            try:
                return await (self._pull_keys(msg) if msg.keys else self._pull(msg))
            finally:
                self.pulling[msg.wait_for] -= 1
                if not self.pulling[msg.wait_for]:
                    del self.pulling[msg.wait_for]
        if isinstance(msg, Bye):
            self._leave(f"bye: {msg.reason}")
            return Ack(store.version)
        raise ProtocolError("type", f"{type(msg).__name__.upper()} is not a request the PS accepts")

    async def _pull(self, msg: Pull) -> bytes:
        """The next update whole (or the full parameters), once its version is applied."""
        store = self.server.store
        assert self.worker_id is not None
        if not store.initialized or store.version < msg.wait_for:
            self.server.check_refused(self.worker_id, msg.wait_for)
            try:
                await self.server.wait_version(max(msg.wait_for, 0), self.worker_id)
            except asyncio.TimeoutError:
                raise ProtocolError("timeout", f"version {msg.wait_for} not reached within the pull timeout") from None
            self.server.check_refused(self.worker_id, msg.wait_for)
        if store.asynchronous:
            try:
                await self.server.wait_turn(self.worker_id)
            except asyncio.TimeoutError:
                raise ProtocolError("timeout", f"more than {store.staleness} versions ahead for the whole pull timeout") from None
        await self.server.release.hold(self, self.server.sessions.values(), msg.wait_for)
        params = self._for_me(store.pull(msg.have_version))
        pad = self.server.downlink.pad_for(params.version) if self.server.downlink is not None else 0
        data = self.server.params_bytes(dataclasses.replace(params, pad=bytes(pad)) if pad else params, self._recipient(params))
        if self.server.downlink is not None:
            self.server.downlink.sent(self.conn.quic, store.version, len(data))
        if not params.full and not store.asynchronous:
            self._time_return(params.version, len(data))
        return data

    def _time_return(self, version: int, nbytes: int) -> None:
        """Time the copy of `version`'s update of `nbytes` written now, to the ack that completes its
        delivery (`SensingState.when_delivered`, on the connection's clock: monotonic), in the
        server's `UpdateReturns`. Full replies (a resync, async mode) and keyed ones (pipelined
        pulls, queued behind each other) are not an update's return and are not timed."""
        try:
            state = sensing_state(self.conn.quic)
        except ConfigError:  # a congestion controller without delivery counts: nothing to report
            return
        returns = self.server.returns
        returns.written(version, nbytes, time.monotonic())
        # Inside the connection's ack handling: record, no more.
        state.when_delivered(nbytes, lambda at: returns.delivered(version, at))

    def _return_report(self) -> tuple[int, float]:
        """(bytes, seconds) of the newest complete update return not yet reported on this
        connection (`Ack.delivered_bytes`), (0, 0.0) when there is none."""
        latest = self.server.returns.latest
        if latest is None or latest.version <= self._reported:
            return 0, 0.0
        self._reported = latest.version
        return latest.nbytes, latest.seconds

    async def _pull_keys(self, msg: Pull) -> bytes:
        """Pipelined pull: answer with `msg.keys` of the next update as soon as they are applied."""
        store = self.server.store
        assert self.worker_id is not None
        try:
            if store.want(msg.keys, msg.wait_for - 1):
                await self.server.wake()
        except UpdateRefused:
            await self.server.refused()
            raise
        if not store.keys_ready(msg.keys, msg.wait_for):
            self.server.check_refused(self.worker_id, msg.wait_for)
            try:
                await self.server.wait_keys(msg.keys, msg.wait_for, self.worker_id)
            except asyncio.TimeoutError:
                raise ProtocolError("timeout", f"keys of version {msg.wait_for} not applied within the pull timeout") from None
            self.server.check_refused(self.worker_id, msg.wait_for)
        await self.server.release.hold(self, self.server.sessions.values(), msg.wait_for)
        params = self._for_me(store.pull_keys(msg.have_version, msg.keys))
        # The fallback: every key, full, with the state keys; a keyed reply is never cached as it.
        whole = params.full and len(params.tensors) == len(store.params) + len(store.state_keys)
        # Not reported to the downlink policy: it times one delivery of the whole update per
        # worker, and per-bucket replies queued behind each other would read as a slow link.
        if whole:
            return self.server.params_bytes(params, self._recipient(params))
        return self.server.keyed_params_bytes(params, msg.keys, self._recipient(params))

    def _for_me(self, params: Params) -> Params:
        """`params` as this worker is sent it: forwarded pushes without its own and the others'
        intents (`Params.for_recipient`), or, to a peer that does not keep its pushes (a relay, a
        worker from before the field, one that has not pushed yet), the full parameters, which need
        none. A compressed update carries intents too: sent as it was, each worker heard its own
        intent beside the other's (an e2e test saw two intents of a two-worker step)."""
        if params.sums and not self.keeps:
            return self.server.store.full_params()
        if not params.sums and not params.intent_owners:
            return params
        assert self.worker_id is not None
        return params.for_recipient(self.worker_id)

    def _recipient(self, params: Params) -> str:
        """Whom `params`' bytes are for: this worker where they differ from worker to worker
        (forwarded pushes, the others' intents)."""
        return (self.worker_id or "") if params.sums or params.intents else ""

    def _on_hello(self, msg: Hello) -> Message:
        if self.authenticated:
            raise ProtocolError("auth", "already authenticated on this connection")
        if not msg.worker_id or not msg.worker_id.isprintable():
            self.log_refusal("refused HELLO from %s: worker id %s is empty or holds control characters", self.host, quoted(msg.worker_id))
            raise ProtocolError("hello", "worker_id must be non-empty printable text (no control characters)")
        self._hello = msg
        self._server_nonce = new_nonce()
        return Challenge(self._server_nonce)

    async def _on_auth(self, msg: Auth) -> Message:
        hello, nonce = self._hello, self._server_nonce
        if hello is None or nonce is None or self.authenticated:
            raise ProtocolError("auth", "AUTH without a pending challenge")
        self._server_nonce = None  # one attempt per challenge: no online guessing on one nonce
        if self.server.secret is not None:
            try:
                verify_mac(
                    self.server.secret, msg.mac, server_nonce=nonce, client_nonce=hello.client_nonce, worker_id=hello.worker_id
                )
            except AuthError as exc:
                self.log_refusal("refused %s from %s: %s", quoted(hello.worker_id), self.host, exc)
                self.server.errors_sent += 1
                raise ProtocolError("auth", str(exc)) from None
        if hello.role != "probe":
            self._check_job(hello)  # refused: the connection stays unauthenticated, and the handshake deadline closes it
        self.authenticated = True
        self._deadline.cancel()
        self.conn.open_window()
        if hello.role == "probe":  # measures the path only: never a session, never in the barrier
            self.peer = f"probe {quoted(hello.worker_id)}"
            log.info("%s authenticated", self.peer)
            return self._welcome()
        self.worker_id = hello.worker_id
        self.site = hello.site
        self.peer = f"worker {quoted(hello.worker_id)}"
        previous = self.server.sessions.get(hello.worker_id)
        if previous is not None and previous is not self:
            log.info("%s reconnected; replacing its old connection", self.peer)
        self.server.sessions[hello.worker_id] = self
        store = self.server.store
        if store.initialized:
            store.join(hello.worker_id)
        log.info("%s (rank %d) authenticated", self.peer, hello.rank)
        return self._welcome()

    def _check_job(self, hello: Hello) -> None:
        """Refuse a worker of another job than the one whose state this PS holds, unless it asks to
        resume (docs/ARCHITECTURE.md, "Job identity"); say so when a job resumes."""
        store, held = self.server.store, self.server.store.job_id
        if not store.initialized or not hello.job_id:
            return  # the job is named at INIT; a worker from before job ids cannot be told apart
        if not held:
            store.adopt_job(hello.job_id)  # state from before job ids: it is this job's now
            held = hello.job_id
        if hello.job_id != held and not hello.resume:
            self.server.errors_sent += 1
            log.warning("refused worker %r of job %r: this PS holds job %r at version %d", hello.worker_id, hello.job_id, held, store.version)
            raise ProtocolError(
                "job",
                f"this PS holds job {held!r} at version {store.version}, not job {hello.job_id!r}: start a fresh PS "
                f"(without its old checkpoint) for a new job, or pass --resume to continue job {held!r}",
            )
        if store.version > 0 and hello.worker_id not in self.server.resumed:
            self.server.resumed.add(hello.worker_id)
            via = f" (worker of job {hello.job_id!r} asked to resume)" if hello.job_id != held else ""
            log.warning("resuming job %s at version %d: worker %r%s", held, store.version, hello.worker_id, via)

    def _welcome(self) -> Welcome:
        store = self.server.store
        staleness = -1 if store.staleness is None else store.staleness
        job = store.job_id if store.initialized else ""
        return Welcome(store.version, store.initialized, len(store.live), staleness, job, self.server.release.site or "")

    def on_bad_message(self, exc: ProtocolError) -> None:
        self.server.errors_sent += 1

    def on_close(self, reason: str) -> None:
        log.info("%s disconnected: %s", self.peer, printable(reason))
        self._forget()
        self._leave(reason)

    def _leave(self, reason: str) -> None:
        wid = self.worker_id
        if wid is None or self.server.sessions.get(wid) is not self:
            return  # a newer connection of the same worker owns its membership
        del self.server.sessions[wid]
        result = self.server.store.leave(wid)
        if result is not None:
            asyncio.get_event_loop().create_task(self.server.applied(result))
        else:  # async: the slowest clock may have moved; sync: keys may be applied ahead now
            asyncio.get_event_loop().create_task(self.server.wake())
