"""The PS's asyncio shell: listens, and holds what every worker connection shares.

Only I/O and waiting live here. Every decision (validation, the barrier, the update, the downlink
bytes) is the store's; `PSServer` keeps the shared state transitions (wake pullers, the barrier
watchdog, checkpoints, the encoded-update caches), and each connection's handshake and requests
are a `WorkerSession` (`session`), which maps messages to store calls and store errors to ERROR
replies.
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

from netsense.compression.policy.calibration import progress_settings
from netsense.compression.policy.link import LinkState
from netsense.errors import ConfigError
from netsense.transport.listener import Listener, start_server
from netsense.transport.logsafe import LogLimiter
from netsense.transport.wire import Limits, Params, encode_message

from . import checkpoint
from .downlink import DownlinkController
from .release import WanFirst
from .returns import UpdateReturns
from .session import WorkerSession
from .store import ParameterStore, StepApplied
from .store.store import DOWNLINK_DOMAINS
from .store.guard import UpdateRefused
from .warmup import warm_up_torch

log = logging.getLogger(__name__)

DOMAIN_CHOICES = ("auto", *DOWNLINK_DOMAINS)
"""`ServerSettings.downlink_domain`'s values: ``auto`` resolves to one of the store's."""


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
    progress_table: str | None = None
    """File from `netsense calibrate`: the ``netsense`` downlink policy prices its levels at the
    ``down`` table's q (docs/POLICIES.md, "Calibrated q"; None: estimated during the run)."""
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
    wan_first: bool = True
    """At a PS told its site (`netsense ps --site`), answer the pulls of workers and relays at other
    sites before those of its own (synchronous mode; docs/ARCHITECTURE.md, "WAN-first release"); at
    a relay or worker, push the shards at other sites before its own site's ("WAN pushes first")."""
    downlink_domain: str = "auto"
    """What a lossy downlink compresses (docs/ARCHITECTURE.md, "Gradient-domain downlink"):
    ``params``, the change of the parameters, the PS stepping on the exact gradient; ``gradient``,
    the step's aggregated gradient under error feedback, at the codec of each key's smallest push, with
    every worker and relay running the PS's optimizer on it (synchronous mode; the downlink codec
    and policy are not used); ``auto``, ``gradient`` unless `staleness`, `policy` or a
    `downlink_codec` other than fp32 is set, which keep ``params`` (docs/history/BENCHMARKS-2026.md, "The
    gradient domain by default")."""

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
        if self.downlink_domain not in DOMAIN_CHOICES:
            raise ConfigError(f"server.downlink_domain must be one of {', '.join(DOMAIN_CHOICES)}, got {self.downlink_domain!r}")
        if self.downlink_domain == "gradient" and self.staleness is not None:
            raise ConfigError("server.downlink_domain 'gradient' needs synchronous training (unset server.staleness)")

    @property
    def domain(self) -> str:
        """`downlink_domain` with ``auto`` resolved: async pulls send whole parameters, and a
        downlink policy or codec the user set only runs in the parameter domain."""
        if self.downlink_domain != "auto":
            return self.downlink_domain
        explicit = self.staleness is not None or self.policy is not None or self.downlink_codec != "fp32"
        return "params" if explicit else "gradient"


class PSServer:
    """One parameter-server shard: a store, its connections and the barrier watchdog."""

    def __init__(
        self, settings: ServerSettings, *, secret: bytes | None, limits: Limits = Limits(), site: str | None = None
    ) -> None:
        self.settings = settings
        self.secret = secret
        self.limits = limits
        self.store = ParameterStore(
            downlink_codec=settings.downlink_codec, staleness=settings.staleness, downlink_domain=settings.domain
        )
        if settings.staleness is not None and (settings.policy or settings.downlink_codec != "fp32"):
            log.warning("async mode (staleness %d) sends full fp32 parameters; the downlink codec/policy is ignored", settings.staleness)
        gradient = settings.domain == "gradient"
        if gradient and (settings.policy or settings.downlink_codec != "fp32"):
            log.info("gradient-domain downlink: each key goes down at its smallest push's codec; the downlink codec/policy is not used")
        self.downlink = (
            DownlinkController(
                settings.policy or f"fixed:{settings.downlink_codec}",
                ladder=settings.ladder,
                decision_log=settings.decision_log,
                settings=progress_settings(settings.progress_table, "down", settings.policy),
            )
            if (settings.policy or settings.decision_log) and not gradient
            else None
        )
        """The downlink policy loop; None when the downlink codec is fixed and unlogged."""
        if self.downlink is not None:
            self.downlink.metric = self.store.update_metric  # an Adam job's rounds weigh errors by it
            self.downlink.per_coordinate = self._per_coordinate
        self.sessions: dict[str, WorkerSession] = {}
        self.returns = UpdateReturns()
        """Each update's copies, written and delivered: the workers' ACKs report the latest (`ps.returns`)."""
        self.release = WanFirst(site, enabled=settings.wan_first and settings.staleness is None)
        """Pulls of other sites first (`site`: this PS's, from ``--site``; None: no site, no hold)."""
        self._changed = asyncio.Condition()
        self._step_started_at: float | None = None
        self._blocked: tuple[int | None, float] = (None, 0.0)  # async: (slowest clock, since when) while a worker waits on it
        self._params_cache: tuple[tuple[int, bool, int, int], bytes] | None = None
        self._keyed_cache: dict[tuple[int, bool, int, tuple[str, ...]], bytes] = {}  # pipelined pulls of one update
        self._server: Listener | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._idle_timeout_s: float | None = None  # the QUIC idle timeout, known at `start`
        self.loop_stalls = 0
        """Times the event loop was blocked past a third of the idle timeout (`_note_stall`)."""
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

    def _per_coordinate(self) -> bool:
        """Whether the job's optimizer is Adam or AdamW (False before INIT names one)."""
        settings = self.store.optimizer_settings
        return settings is not None and settings.per_coordinate

    async def start(self, configuration: QuicConfiguration, socket_buffer_bytes: int = 8 << 20) -> int:
        """Listen; returns the bound port. torch's lazy first-use costs are paid first, while no
        connection can wait on this loop (`warm_up_torch`)."""
        warm_up_torch()
        self._idle_timeout_s = configuration.idle_timeout
        self._server = await start_server(
            self.settings.host,
            self.settings.port,
            configuration,
            lambda conn: WorkerSession(self, conn),
            limits=self.limits,
            socket_buffer_bytes=socket_buffer_bytes,
            preauth_window_bytes=self.settings.preauth_window_bytes,
        )
        self.port = self._server.port
        self._watchdog = asyncio.get_running_loop().create_task(self._barrier_watchdog())
        log.info("PS listening on %s:%d", self.settings.host, self.port)
        return self.port

    def close(self) -> None:
        """Stop listening, close every connection and cancel the requests being served (`stop`
        also waits for them to finish)."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self.downlink is not None:
            self.downlink.close()
        if self._server is not None:
            self._server.close()

    async def stop(self) -> None:
        """`close`, then wait until the watchdog and every cancelled request have finished, so no
        task is left pending for a loop that stops next (a PULL still waiting was destroyed
        pending)."""
        self.close()
        if self._server is not None:
            await self._server.stop()
        if self._watchdog is not None:
            await asyncio.gather(self._watchdog, return_exceptions=True)

    # --- shared state transitions -----------------------------------------------------------

    async def applied(self, result: StepApplied | None) -> None:
        """Wake pullers after an update."""
        if result is None:
            return
        self._step_started_at = None
        self.returns.close(result.version - 1)  # every worker took that update before it pushed for this one
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

    def params_bytes(self, params: Params, recipient: str = "") -> bytes:
        """Encoded PARAMS, cached: the same update goes to every worker, serialize it once (per
        `recipient` where it carries forwarded pushes, which differ from worker to worker)."""
        key = (params.version, params.full, params.base_version, len(params.pad), recipient)
        if self._params_cache is None or self._params_cache[0] != key:
            self._params_cache = (key, encode_message(params))
        return self._params_cache[1]

    def keyed_params_bytes(self, params: Params, keys: tuple[str, ...], recipient: str = "") -> bytes:
        """Encoded PARAMS of a pipelined pull, cached per key set (and `recipient`, as
        `params_bytes`): every worker asks for the same buckets of the same update. The cache
        holds one update."""
        key = (params.version, params.full, params.base_version, keys, recipient)
        data = self._keyed_cache.get(key)
        if data is None:
            if any(k[:3] != key[:3] for k in self._keyed_cache):
                self._keyed_cache.clear()
            data = self._keyed_cache[key] = encode_message(params)
        return data

    def live_links(self) -> list[LinkState]:
        """The link state of every live worker's connection, for the downlink's choice."""
        down, live = self.downlink, self.store.live
        if down is None:
            return []
        return [down.link_of(s.conn.quic) for wid, s in self.sessions.items() if wid in live]

    def note_push(self) -> None:
        if self._step_started_at is None and not self.store.asynchronous:
            self._step_started_at = time.monotonic()

    async def _barrier_watchdog(self) -> None:
        """Drop workers that hold up a step past the barrier timeout (a dead worker never pushes).
        Its tick also times the loop (`_note_stall`)."""
        while True:
            tick = min(0.25, self.settings.barrier_timeout_s / 4)
            t0 = time.monotonic()
            await asyncio.sleep(tick)
            self._note_stall(time.monotonic() - t0 - tick)
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

    def _note_stall(self, late_s: float) -> None:
        """Warn when the loop ran nothing for over a third of the QUIC idle timeout (as long as
        workers wait between PINGs): blocked for the whole timeout, it answers no packet and every
        connection whose peer went quiet meanwhile is idle-closed, a worker lost for no fault of
        its own (docs/RELIABILITY.md, "Job start under load")."""
        idle = self._idle_timeout_s
        if idle and late_s > idle / 3:
            self.loop_stalls += 1
            log.warning(
                "the PS event loop was blocked for %.1f s (connections are closed after %g s without a packet); "
                "something ran on it that should not", late_s, idle,
            )  # fmt: skip

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
