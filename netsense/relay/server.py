"""`Relay`: a PS to the workers of one site, one worker to each upstream PS shard.

Each upstream shard gets its own `RelayServer`, a `PSServer` whose store is a `SiteStore`: the
PS's own sessions authenticate local workers (TLS + HMAC, the job's secret), bound their
connections and check their messages, and its barrier watchdog drops a dead local worker as the PS
would. When the site's step is whole the relay pushes it upstream (`Upstream`) and, once the
upstream's update is back, the same bytes answer every local pull. WAN traffic per step is then one
push and one pull per site, whatever the number of workers there (docs/ARCHITECTURE.md,
"Hierarchical aggregation").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from aioquic.quic.configuration import QuicConfiguration

from netsense.compression.policy import build_policy
from netsense.compression.policy.calibration import progress_settings
from netsense.errors import ConfigError, NetSenseError, PeerError
from netsense.launch.outputs import shard_file
from netsense.ps.server import PSServer, ServerSettings
from netsense.transport.hparams import scales_per_coordinate
from netsense.transport.wire import Init, Limits, Params
from netsense.worker.connect import ConnectSettings
from netsense.worker.wanpushes import WanPushes, shard_role

from .adaptive import AdaptiveUpstream
from .phases import SitePhases
from .site import Aggregate, SiteStore
from .upstream import Upstream

log = logging.getLogger(__name__)

LOG_EVERY = 100
"""Site steps between two log lines of a shard's step phases (`SitePhases.summary`)."""


@dataclass(frozen=True)
class RelaySettings:
    """One site's relay."""

    upstream: tuple[ConnectSettings, ...]
    """The upstream PS shards, in shard order (the relay serves one local shard per upstream one)."""
    site: str = "site"
    """Names the relay upstream: it joins each shard as worker ``relay-<site>``."""
    server: ServerSettings = field(default_factory=ServerSettings)
    """How the relay listens to its local workers: shard i on ``port + i`` (port 0: free ports),
    and the barrier timeout after which a silent local worker is dropped from the site's step."""
    site_workers: int = 0
    """Local workers the site's first step waits for (0: whoever is connected, as a PS with
    world_size 1)."""
    upstream_world: int = 0
    """The world size a passed-through INIT tells the upstream (its members: sites and direct
    workers). 0: the INIT's own world size less this site's workers plus one (the relay)."""
    upstream_codec: str = "fp32"
    """Codec of the site's push upstream; lossy ones run under error feedback at the relay."""
    upstream_policy: str | None = None
    """The job's uplink policy (``netsense``, ``dc2``, ...): the site's push adapts to each upstream
    shard's path as a worker's does (`AdaptiveUpstream`), and `upstream_codec` is unused."""
    ladder: str | None = None
    """The policy's levels (None: its default ladder)."""
    progress_table: str | None = None
    """`netsense calibrate`'s file: a ``netsense`` upstream policy prices its levels at the ``up``
    table's q, an approximation: the trials compress each worker's gradient, the relay the site's
    sum (docs/POLICIES.md, "Calibrated q")."""
    decision_log: str | None = None
    """JSONL decision log of the adaptive push (shard i of several: ``<stem>-shard<i><suffix>``)."""
    rank: int = 0
    """The rank the relay claims upstream: 0, so that this site's rank 0 can initialize the job
    through it (the PS ignores a second INIT, so a rank 0 at another site is first just as well)."""

    def __post_init__(self) -> None:
        if not self.upstream:
            raise ConfigError("relay: at least one upstream PS shard is needed")
        if not self.site or not all(c.isalnum() or c in "-_." for c in self.site) or len(self.site) > 64:
            raise ConfigError(f"relay site name must be 1-64 characters of [A-Za-z0-9_.-], got {self.site!r}")
        if self.site_workers < 0 or self.upstream_world < 0:
            raise ConfigError("relay site_workers and upstream_world must be >= 0")
        if self.server.staleness is not None:
            raise ConfigError("a relay aggregates synchronous steps; an asynchronous (staleness) job needs no relay")
        if self.upstream_policy is not None:
            build_policy(self.upstream_policy, self.ladder, self.policy_settings())  # a bad spec, ladder or table fails here, before any I/O

    def policy_settings(self) -> dict[str, Any] | None:
        """The upstream policy's settings: the progress table's up table for ``netsense``."""
        return progress_settings(self.progress_table, "up", self.upstream_policy)

    @property
    def worker_id(self) -> str:
        return f"relay-{self.site}"


class RelayServer(PSServer):
    """One local shard of the relay: the PS's shell over a `SiteStore`, and its upstream."""

    def __init__(self, settings: RelaySettings, upstream: Upstream, server: ServerSettings, *,
                 secret: bytes | None, limits: Limits = Limits(), shard: int = 0) -> None:  # fmt: skip
        super().__init__(server, secret=secret, limits=limits)
        self.relay = settings
        self.upstream = upstream
        self.shard = shard
        self.pushes: WanPushes | None = None
        """Shared by the relay's shards when its pushes go to other sites first (`Relay.start`)."""
        self.phases = SitePhases()
        """Where this shard's site steps go (gather, push, update, install): logged every
        `LOG_EVERY` steps and at the end (the ``stopped`` line of `netsense relay`)."""
        self.site = SiteStore(local_quorum=settings.site_workers, job_id=upstream.settings.job_id)
        self.store = self.site  # type: ignore[assignment]  # the sessions call the store's interface
        self.upstream.seed = self._seed
        self._init: tuple[Init, int] | None = None  # the INIT this relay passed up, and its world size
        self._stepping: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self.failed: BaseException | None = None
        """Why the relay gave up on its upstream (then it stops serving)."""

    async def start(self, configuration: QuicConfiguration, socket_buffer_bytes: int = 8 << 20) -> int:
        """Connect upstream (a wrong secret or address fails here), then listen locally."""
        welcome = await self.upstream.connect()
        if welcome.staleness >= 0:
            await self.upstream.close("asynchronous PS")
            raise ConfigError("the upstream PS is asynchronous (staleness set): a relay aggregates synchronous steps only")
        if welcome.job_id and not self.site.job_id:
            self.site.adopt_job(welcome.job_id)
        try:
            port = await super().start(configuration, socket_buffer_bytes)
        except BaseException:
            await self.upstream.close("relay could not listen")
            raise
        self._spawn(self._boot())
        return port

    # --- hooks: every path that can complete the site's step ends in one of these -----------

    async def applied(self, result: Any) -> None:
        self._kick()
        await super().applied(result)

    async def wake(self) -> None:
        self._kick()
        await super().wake()

    def _kick(self) -> None:
        if self._closing:  # a forward cancelled by `aclose` must not start the next one
            return
        init = self.site.take_init()
        if init is not None:
            self._spawn(self._forward_init(init))
        if self._stepping is None:
            agg = self.site.take()
            if agg is not None:
                self._stepping = self._spawn(self._forward(agg))

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- upstream -------------------------------------------------------------------------

    async def _boot(self) -> None:
        try:
            await self._install(await self.upstream.first_params())
        except NetSenseError as exc:
            self._fail(exc)

    async def _forward_init(self, init: Init) -> None:
        r = self.relay
        world = r.upstream_world or (max(1, init.world_size - r.site_workers + 1) if r.site_workers else init.world_size)
        self._init = (init, world)
        if self.upstream.adaptive is not None:  # the job's optimizer, as a worker knows it from its config
            self.upstream.adaptive.precondition = scales_per_coordinate(str(init.optimizer.get("name", "sgd")))
        try:
            await self.upstream.init(init, world)
        except NetSenseError as exc:
            log.error("the upstream PS refused the site's INIT: %s", exc)

    async def _seed(self) -> None:
        """The upstream came back empty (restarted without a checkpoint): if this site's rank 0
        initialized the job, seed it with the site's replica, as a direct rank 0 seeds it."""
        if self._init is not None and self.site.initialized:
            init, world = self._init
            log.warning("upstream restarted empty; seeding it with the site's replica at version %d", self.site.version)
            await self.upstream.client.init(self.site.full_params().tensors, init.optimizer, world, init.model)

    async def _forward(self, agg: Aggregate) -> None:
        taken = time.perf_counter()
        try:
            params, stepped = await self._push(agg)
            updated = time.perf_counter()
            if params is not None:
                await self._install(params)
            self._time(stepped and params is not None, taken, updated)
        except NetSenseError as exc:
            self._fail(exc)
        finally:
            self._stepping = None
        self._kick()

    @property
    def role(self) -> str | None:
        """Where this shard's PS is: ``local`` (this site), ``remote``, or None (unsaid)."""
        welcome = self.upstream.welcome
        return shard_role(self.upstream.settings.site, welcome.site if welcome is not None else "")

    async def _push(self, agg: Aggregate) -> tuple[Params | None, bool]:
        """The upstream's parameters after the site's step, and whether they are that step's
        update (False: a resync after the upstream refused or dropped the step). The site's own
        shard is pushed once the pushes to the other sites' shards have left (`WanPushes`)."""
        if self.pushes is not None and self.role == "local":
            await self.pushes.hold(agg.step)
        try:
            return await self.upstream.step(agg, len(self.site.params)), True
        except PeerError as exc:
            if exc.code == "stale":  # the upstream barrier moved on without this site: follow it
                log.warning("upstream dropped the site's step %d (%s); resyncing", agg.step, exc.reason)
                return await self.upstream.client.pull(-1, 0), False
            self.site.refuse_in_flight(agg.workers, f"the upstream PS refused the site's push ({exc.code}: {exc.reason})")
            await self.refused()
            return (await self.upstream.client.pull(-1, 0) if exc.code == "non-finite-update" else None), False

    def _time(self, stepped: bool, taken: float, updated: float) -> None:
        """Record a site step's phases (a resync only restarts the gather clock)."""
        if not stepped:
            self.phases.resync()
            return
        self.phases.record(taken=taken, push_s=self.upstream.last_push_s, updated=updated, installed=time.perf_counter())
        if self.phases.count % LOG_EVERY == 0:
            log.info("relay %s, shard %d: %s", self.relay.site, self.shard, self.phases.summary())

    async def _install(self, params: Params) -> None:
        first = not self.site.initialized
        if not first and params.version < self.site.version:
            self._restart_site(params.version)
        result = self.site.install(params)
        if self.upstream.adaptive is not None:  # the level comes back down too: two compressions (`Policy.passes`)
            policy = self.upstream.adaptive.policy  # a relay's site sum is never forwarded: compressed again
            policy.passes = policy.compressions = 2 if self.site.mirror is not None else 1
        if first:
            for wid in self.sessions:  # every local worker already connected is in the first step
                self.site.join(wid)
        await self.applied(result)
        if result is None:
            await self.wake()

    def _restart_site(self, version: int) -> None:
        """The upstream went back (a restart from an older checkpoint, or empty): the site's pulls
        wait for versions that will not come, so its workers are disconnected and reconnect, resync
        and follow the upstream, as they would after a PS restart."""
        log.warning("upstream went back from version %d to %d; the site's workers resync", self.site.version, version)
        for session in list(self.sessions.values()):
            session.refuse(f"the upstream PS went back to version {version}; reconnect and resync")

    def _fail(self, exc: BaseException) -> None:
        log.error("relay %s: upstream %s:%d lost: %s; stopping", self.relay.site, self.upstream.client.host, self.upstream.client.port, exc)
        self.failed = exc
        self.close()

    async def aclose(self) -> None:
        """Stop serving (the PS's `stop`: every cancelled request finished), finish the forwarding
        tasks, say BYE upstream: nothing is left pending for a loop that stops next (no forward
        starts once closing: a cancelled one used to start the next from its `finally`, which the
        loop then closed on)."""
        self._closing = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await self.stop()
        await asyncio.gather(*tasks, *self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.upstream.close()


class Relay:
    """One site's relay: a `RelayServer` per upstream shard, on one event loop."""

    def __init__(self, settings: RelaySettings, *, secret: bytes | None, limits: Limits = Limits()) -> None:
        self.settings = settings
        # A relay fans out the upstream's own bytes and holds no state: the job's downlink policy,
        # decision log and checkpoints (its PS shards') are not the relay's.
        base = replace(settings.server, policy=None, decision_log=None, checkpoint_dir=None)
        self.shards = [
            RelayServer(
                settings, Upstream(up, settings.worker_id, codec=settings.upstream_codec, rank=settings.rank,
                                   adaptive=_adaptive(settings, i)),
                replace(base, port=base.port + i if base.port else 0), secret=secret, limits=limits, shard=i,
            )
            for i, up in enumerate(settings.upstream)
        ]  # fmt: skip

    async def start(self, configuration: QuicConfiguration, socket_buffer_bytes: int = 8 << 20) -> list[int]:
        """Connect every upstream shard and listen; returns the local ports, in shard order.
        When shards sit both here and at other sites (their WELCOME's site against ``--site``),
        this site's shards are pushed after the others' pushes have left ("WAN pushes first")."""
        ports = [await s.start(configuration, socket_buffer_bytes) for s in self.shards]
        roles = [s.role for s in self.shards]
        if self.settings.server.wan_first and "local" in roles and "remote" in roles:
            pushes = WanPushes()
            for s, role in zip(self.shards, roles):
                s.pushes = pushes
                if role == "remote":
                    pushes.remote(s.shard)
                    s.upstream.wan = (pushes, s.shard)
        return ports

    @property
    def ports(self) -> list[int]:
        return [s.port for s in self.shards]

    @property
    def failed(self) -> BaseException | None:
        return next((s.failed for s in self.shards if s.failed is not None), None)

    @property
    def levels(self) -> dict[str, int]:
        """Upstream pushes at each codec spec, over every shard (adaptive upstream only)."""
        total: dict[str, int] = {}
        for s in self.shards:
            if s.upstream.adaptive is not None:
                for spec, n in s.upstream.adaptive.levels.items():
                    total[spec] = total.get(spec, 0) + n
        return total

    def phases(self) -> list[dict[str, float | int] | None]:
        """Each upstream shard's step phases (`SitePhases.medians`), in shard order."""
        return [s.phases.medians() for s in self.shards]

    def wan_bytes(self) -> tuple[int, int]:
        """(bytes sent, bytes received) on the upstream connections: the site's WAN traffic."""
        return sum(s.upstream.bytes_sent for s in self.shards), sum(s.upstream.bytes_received for s in self.shards)

    async def close(self) -> None:
        for s in self.shards:
            await s.aclose()
            if s.upstream.adaptive is not None:
                s.upstream.adaptive.close()


def _adaptive(settings: RelaySettings, shard: int) -> AdaptiveUpstream | None:
    """Shard `shard`'s policy loop, when the relay runs the job's uplink policy."""
    if settings.upstream_policy is None:
        return None
    log_path = settings.decision_log
    if log_path is not None:
        log_path = shard_file(log_path, shard, len(settings.upstream))
    return AdaptiveUpstream(
        build_policy(settings.upstream_policy, settings.ladder, settings.policy_settings()), decision_log=log_path,
        log_fields={"worker_id": settings.worker_id, "shard": shard},
    )  # fmt: skip
