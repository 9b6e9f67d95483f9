"""The PS's asyncio shell: authenticates workers and feeds their messages to the `ParameterStore`.

Only I/O and waiting live here. Every decision (validation, the barrier, the update, the downlink
bytes) is the store's; this module maps messages to store calls and store errors to ERROR replies.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aioquic.quic.configuration import QuicConfiguration

from netsense.errors import AuthError, ConfigError, ProtocolError
from netsense.transport.auth import new_nonce, verify_mac
from netsense.transport.channel import ServerConnection, server_port, start_server
from netsense.transport.logsafe import LogLimiter, printable, quoted, suppressed_note
from netsense.transport.sensing.aioquic_private import peer_host
from netsense.transport.wire import (
    Ack,
    Auth,
    Bye,
    Challenge,
    Hello,
    Init,
    Limits,
    Message,
    Params,
    Probe,
    Pull,
    Push,
    Welcome,
    encode_message,
)

from . import checkpoint
from .downlink import DownlinkController
from .store import ParameterStore, StepApplied
from .store.guard import UpdateRefused

log = logging.getLogger(__name__)


MIN_BARRIER_TIMEOUT_S = 0.1
"""Below this the barrier watchdog (a tick every quarter timeout) would all but spin."""
MAX_BARRIER_TIMEOUT_S = 1e6


@dataclass(frozen=True)
class ServerSettings:
    """How the PS listens and how long it waits."""

    host: str = "127.0.0.1"
    """Address to bind."""
    port: int = 4433
    """UDP port (0 picks a free one; the chosen port is reported)."""
    barrier_timeout_s: float = 30.0
    """After the first push of a step, workers not done within this are dropped from the step
    (0.1 to 1e6 s: the watchdog ticks at a quarter of it, so 0 would spin a core)."""
    pull_timeout_s: float = 600.0
    """Longest a PULL waits for the next version before answering ERROR."""
    downlink_codec: str = "fp32"
    """Codec of the PS -> worker update (same bytes to every worker); `policy` None means
    ``fixed:<downlink_codec>``."""
    policy: str | None = None
    """Downlink policy spec (``none``, ``fp16``, ``fixed:<codec>``, ``dc2``, ``netsense``, ...): one
    level per update for the slowest live worker's connection. None: `downlink_codec`."""
    ladder: str | None = None
    """Levels the downlink policy picks from, least lossy first (None: DEFAULT_LADDER)."""
    decision_log: str | None = None
    """JSONL file for one downlink decision record per update (None: no log)."""
    checkpoint_dir: str | None = None
    """Folder for atomic checkpoints (None: no checkpoints); `netsense ps --resume` reads it."""
    checkpoint_every_steps: int = 100
    """Checkpoint after this many applied steps (0: not by steps); bounds the steps a crash loses."""
    checkpoint_every_s: float = 0.0
    """Also checkpoint when this many seconds passed since the last one (0: not by time)."""
    checkpoint_keep: int = 3
    """Checkpoints kept on disk; older ones are deleted after each successful write."""
    handshake_timeout_s: float = 10.0
    """Close a connection that has not authenticated within this long."""
    max_unauthenticated: int = 64
    """Most connections that may be mid-handshake at once; a new one past it closes the OLDEST
    unauthenticated connection instead, so strangers cannot keep a real worker out."""
    max_unauthenticated_per_host: int = 16
    """Most connections from one peer IP address that may be mid-handshake at once; more are closed
    on arrival. Well below `max_unauthenticated`, so one address cannot fill the global cap."""
    max_connections_per_host: int = 32
    """Most connections from one peer IP address at once."""
    preauth_window_bytes: int = 64 * 1024
    """QUIC flow-control window (connection and stream) of a connection until it authenticates; it
    may use half of it (HELLO and AUTH take ~200 bytes), more closes it. Then the full windows."""
    refusal_log_interval_s: float = 10.0
    """At most one log line per peer address per this long for refused connections and failed
    handshakes; the next line says how many were suppressed."""
    staleness: int | None = None
    """None: synchronous training (BSP barrier). s >= 0: asynchronous, each push applied on arrival,
    a worker at most s versions ahead of the slowest live one (SSP); pulls send full fp32 params,
    so the downlink codec and policy are not used. A worker blocked past `barrier_timeout_s`
    has the slowest workers dropped (they re-enter with their next push)."""

    def __post_init__(self) -> None:
        if self.preauth_window_bytes < 4096:
            raise ConfigError(f"server.preauth_window_bytes must be >= 4096 (a HELLO must fit), got {self.preauth_window_bytes}")
        t = self.barrier_timeout_s
        if not (isinstance(t, (int, float)) and math.isfinite(t) and MIN_BARRIER_TIMEOUT_S <= t <= MAX_BARRIER_TIMEOUT_S):
            raise ConfigError(
                f"server.barrier_timeout_s must be a number of seconds in [{MIN_BARRIER_TIMEOUT_S}, {MAX_BARRIER_TIMEOUT_S:g}], got {t!r}"
            )
        if self.staleness is not None and self.staleness < 0:
            raise ConfigError(f"server.staleness must be >= 0 (or unset for synchronous training), got {self.staleness}")


class PSServer:
    """One parameter-server shard: a store, its connections and the barrier watchdog."""

    def __init__(self, settings: ServerSettings, *, secret: bytes | None, limits: Limits = Limits()) -> None:
        self.settings = settings
        self.secret = secret
        self.limits = limits
        self.store = ParameterStore(downlink_codec=settings.downlink_codec, staleness=settings.staleness)
        if settings.staleness is not None and (settings.policy or settings.downlink_codec != "fp32"):
            log.warning("async mode (staleness %d) sends full fp32 parameters; the downlink codec/policy is ignored", settings.staleness)
        self.downlink = (
            DownlinkController(
                settings.policy or f"fixed:{settings.downlink_codec}", ladder=settings.ladder, decision_log=settings.decision_log
            )
            if settings.policy or settings.decision_log
            else None
        )
        """The downlink policy loop; None when the downlink codec is fixed and unlogged."""
        self.sessions: dict[str, WorkerSession] = {}
        self._changed = asyncio.Condition()
        self._step_started_at: float | None = None
        self._blocked: tuple[int | None, float] = (None, 0.0)  # async: (slowest clock, since when) while a worker waits on it
        self._params_cache: tuple[tuple[int, bool, int], bytes] | None = None
        self._keyed_cache: dict[tuple[int, bool, int, tuple[str, ...]], bytes] = {}  # pipelined pulls of one update
        self._server: Any = None
        self._watchdog: asyncio.Task[None] | None = None
        self.port = 0
        self.errors_sent = 0
        self.connections: set[WorkerSession] = set()
        self.refused_connections = 0
        self.resumed: set[str] = set()  # workers told "resuming job X at version V" (once each)
        self.refusal_log = LogLimiter(settings.refusal_log_interval_s)
        """Rate limit of refusal lines, per peer address."""
        self.checkpoints_written = 0
        self.last_checkpoint: str | None = None
        self._ckpt_version = -1
        self._ckpt_at = time.monotonic()
        self._ckpt_task: asyncio.Future[None] | None = None
        if secret is None:
            log.warning("INSECURE: worker authentication is OFF (no shared secret); local experiments only")

    async def start(self, configuration: QuicConfiguration, socket_buffer_bytes: int = 8 << 20) -> int:
        """Listen; returns the bound port."""
        self._server = await start_server(
            self.settings.host,
            self.settings.port,
            configuration,
            lambda conn: WorkerSession(self, conn),
            limits=self.limits,
            socket_buffer_bytes=socket_buffer_bytes,
            preauth_window_bytes=self.settings.preauth_window_bytes,
        )
        self.port = server_port(self._server)
        self._watchdog = asyncio.get_running_loop().create_task(self._barrier_watchdog())
        log.info("PS listening on %s:%d", self.settings.host, self.port)
        return self.port

    def close(self) -> None:
        """Stop listening and close every connection."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self.downlink is not None:
            self.downlink.close()
        if self._server is not None:
            self._server.close()

    # --- shared state transitions -----------------------------------------------------------

    async def applied(self, result: StepApplied | None) -> None:
        """Wake pullers after an update."""
        if result is None:
            return
        self._step_started_at = None
        self._maybe_checkpoint()
        log.info(
            "step -> version %d (%d workers, %d samples, staleness %d)", result.version, len(result.workers), result.samples, result.staleness
        )
        await self.wake()

    async def wake(self) -> None:
        """Wake pullers: the version or (async mode) a clock or the live set changed."""
        async with self._changed:
            self._changed.notify_all()

    def restore(self, state: dict[str, Any]) -> None:
        """Resume from a checkpoint state (before `start`)."""
        self.store.restore(state)
        self._ckpt_version = self.store.version

    def _maybe_checkpoint(self) -> None:
        """Snapshot the store on the loop if a checkpoint is due; write it on a worker thread."""
        s, store = self.settings, self.store
        if s.checkpoint_dir is None or not store.initialized or store.version == self._ckpt_version or store.applied_keys:
            return
        if self._ckpt_task is not None and not self._ckpt_task.done():
            return  # the previous write is still running; the next step tries again
        by_steps = s.checkpoint_every_steps > 0 and store.version - self._ckpt_version >= s.checkpoint_every_steps
        by_time = s.checkpoint_every_s > 0 and time.monotonic() - self._ckpt_at >= s.checkpoint_every_s
        if not (by_steps or by_time or self._ckpt_version < 0):
            return
        state = store.state()
        self._ckpt_version, self._ckpt_at = store.version, time.monotonic()
        self._ckpt_task = asyncio.get_running_loop().run_in_executor(None, self._write_checkpoint, state)

    def _write_checkpoint(self, state: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        try:
            path = checkpoint.save(self.settings.checkpoint_dir, state, keep=self.settings.checkpoint_keep)  # type: ignore[arg-type]
        except OSError as exc:
            log.error("checkpoint of version %d failed: %s", state["version"], exc)
            return
        self.checkpoints_written += 1
        self.last_checkpoint = str(path)
        log.info("checkpoint %s (version %d) in %.3f s", path, state["version"], time.perf_counter() - t0)

    async def flush_checkpoint(self, final: bool = True) -> None:
        """Wait for a checkpoint write in flight; with `final`, then write the newest version.

        A step that lands while a write is running is skipped (the next step tries again), so
        without the final write a clean stop could leave the last steps out of the checkpoint."""
        if self._ckpt_task is not None:
            await self._ckpt_task
        s, store = self.settings, self.store
        if not final or s.checkpoint_dir is None or not store.initialized or store.applied_keys:
            return
        if store.version != self._ckpt_version:
            state = store.state()
            self._ckpt_version, self._ckpt_at = store.version, time.monotonic()
            self._ckpt_task = asyncio.get_running_loop().run_in_executor(None, self._write_checkpoint, state)
            await self._ckpt_task

    async def _wait(self, predicate: Callable[[], bool]) -> None:
        """Until `predicate` holds (re-checked on every `wake`), at most the pull timeout.

        The timeout runs in this task, inside the lock: `Condition.wait` re-acquires the lock
        before a cancellation or the timeout leaves it, so the lock is always released by its
        holder. (`asyncio.wait_for` around `Condition.wait_for` ran the wait in another task and,
        cancelled at a PS restart, left `RuntimeError: Lock is not acquired`.)"""
        async with self._changed:
            async with asyncio.timeout(self.settings.pull_timeout_s):
                await self._changed.wait_for(predicate)

    async def wait_version(self, version: int, worker_id: str | None = None) -> None:
        """Until the store reaches `version`, or refused the update to it with `worker_id`'s push in it."""
        store = self.store
        await self._wait(lambda: store.initialized and (store.version >= version or self._was_refused(worker_id, version)))

    async def wait_keys(self, keys: tuple[str, ...], version: int, worker_id: str | None = None) -> None:
        """Pipelined pull: wait until `keys` are applied for `version` (or the version is reached,
        or the update to it was refused with `worker_id`'s push in it)."""
        await self._wait(lambda: self.store.keys_ready(keys, version) or self._was_refused(worker_id, version))

    def _was_refused(self, worker_id: str | None, version: int) -> bool:
        return worker_id is not None and self.store.refused(worker_id, version - 1) is not None

    async def wait_turn(self, worker_id: str) -> None:
        """Async mode: hold a worker's PULL while it is more than `staleness` ahead (SSP)."""
        await self._wait(lambda: self.store.may_proceed(worker_id))

    async def refused(self) -> None:
        """An update was refused (the store dropped its step): the barrier clock restarts with the
        next push, and pulls waiting for that update are answered (`check_refused`)."""
        if not self.store.step_started:
            self._step_started_at = None
        await self.wake()

    def check_refused(self, worker_id: str, wait_for: int) -> None:
        """Raise `non-finite-update` if the update a PULL waits for was refused with this worker's
        push in it: the worker must resync (full pull) and push the step again."""
        reason = self.store.refused(worker_id, wait_for - 1)
        if reason is not None:
            raise UpdateRefused(
                f"the update to version {wait_for} was refused ({reason}); pull the parameters and push step {wait_for - 1} again"
            )

    def params_bytes(self, params: Params) -> bytes:
        """Encoded PARAMS, cached: the same update goes to every worker, serialize it once."""
        key = (params.version, params.full, params.base_version)
        if self._params_cache is None or self._params_cache[0] != key:
            self._params_cache = (key, encode_message(params))
        return self._params_cache[1]

    def keyed_params_bytes(self, params: Params, keys: tuple[str, ...]) -> bytes:
        """Encoded PARAMS of a pipelined pull, cached per key set: every worker asks for the same
        buckets of the same update. The cache holds one update."""
        key = (params.version, params.full, params.base_version, keys)
        data = self._keyed_cache.get(key)
        if data is None:
            if any(k[:3] != key[:3] for k in self._keyed_cache):
                self._keyed_cache.clear()
            data = self._keyed_cache[key] = encode_message(params)
        return data

    def note_push(self) -> None:
        if self._step_started_at is None and not self.store.asynchronous:
            self._step_started_at = time.monotonic()

    async def _barrier_watchdog(self) -> None:
        """Drop workers that hold up a step past the barrier timeout (a dead worker never pushes)."""
        while True:
            await asyncio.sleep(min(0.25, self.settings.barrier_timeout_s / 4))
            if self.store.asynchronous:
                await self._ssp_watchdog()
                continue
            started = self._step_started_at
            if started is None or time.monotonic() - started < self.settings.barrier_timeout_s:
                continue
            refusals = self.store.refused_updates
            dropped, result = self.store.drop_incomplete()
            if dropped:
                log.warning("barrier timeout: continuing without %s", ", ".join(sorted(dropped)))
            self._step_started_at = None if result or not self.store.step_started else time.monotonic()
            await self.applied(result)
            if self.store.refused_updates != refusals:
                await self.refused()

    async def _ssp_watchdog(self) -> None:
        """Async mode: the slowest workers are dead if a worker waited on them, with their clock
        unchanged, for the barrier timeout; drop them so the others go on."""
        store, now = self.store, time.monotonic()
        floor = store.min_live_clock if store.blocked else None
        if floor != self._blocked[0]:
            self._blocked = (floor, now)
            return
        if floor is None or now - self._blocked[1] < self.settings.barrier_timeout_s:
            return
        dropped, _ = store.drop_incomplete()
        log.warning("SSP timeout: continuing without %s", ", ".join(sorted(dropped)))
        self._blocked = (None, now)
        await self.wake()


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
        self.opened_at = time.monotonic()
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
                links = [down.link_of(s.conn.quic) for wid, s in self.server.sessions.items() if wid in store.live]
                store.set_downlink(down.choose(store.version, links, 4 * store.numel))
            ahead = store.applied_keys
            try:
                result = store.push(self.worker_id, msg)
            except UpdateRefused:
                await self.server.refused()
                raise
            await self.server.applied(result)
            if result is None and store.applied_keys != ahead:
                await self.server.wake()  # keys applied ahead: pipelined pulls may go
            # The version this push made (async mode: the worker derives its staleness from it).
            return Ack(result.version if result is not None else store.version)
        if isinstance(msg, Pull) and msg.keys:
            return await self._pull_keys(msg)
        if isinstance(msg, Pull):
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
            data = self.server.params_bytes(store.pull(msg.have_version))
            if self.server.downlink is not None:
                self.server.downlink.sent(self.conn.quic, store.version, len(data))
            return data
        if isinstance(msg, Bye):
            self._leave(f"bye: {msg.reason}")
            return Ack(store.version)
        raise ProtocolError("type", f"{type(msg).__name__.upper()} is not a request the PS accepts")

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
        params = store.pull_keys(msg.have_version, msg.keys)
        # The fallback: every key, full, with the state keys; a keyed reply is never cached as it.
        whole = params.full and len(params.tensors) == len(store.params) + len(store.state_keys)
        # Not reported to the downlink policy: it times one delivery of the whole update per
        # worker, and per-bucket replies queued behind each other would read as a slow link.
        return self.server.params_bytes(params) if whole else self.server.keyed_params_bytes(params, msg.keys)

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
        return Welcome(store.version, store.initialized, len(store.live), staleness, store.job_id if store.initialized else "")

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
