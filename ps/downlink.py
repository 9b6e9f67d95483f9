"""The PS's downlink policy loop (docs/POLICIES.md, "Wiring: where policies run"; sync mode).

The PS sends the same update bytes to every worker (one shadow), so it picks one level per update
for the slowest live worker's connection: the link state with the least bandwidth among the
connections the caller hands in. What the send cost is measured per connection as the time from
writing the PARAMS reply until the peer has acknowledged that many bytes (the sensing controller's
delivered counter); the slowest connection's time is the update's comm time. One decision-log line
per update, written when the next update is chosen (by then every worker has its copy).

The policy learns the downlink's own progress efficiency q and codec costs as the uplink's does
(docs/POLICIES.md): when it asks for candidates (every `progress_every` updates), the controller
keeps a copy of the shadow, and at the next update measures every candidate level, q and encode /
decode time, on exactly what that update encoded, v = params - old shadow (update + residual).

The store and the sessions stay the server's: it hands in their values (version, tensors, the
last encode's timing, the live connections' link states). The policy bookkeeping is the shared
`PolicyLoop`; what is the downlink's own is timing deliveries on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, TypeVar

import torch

from netsense.compression.policy import Decision, Policy, build_policy
from netsense.compression.policy.link import LinkState
from netsense.compression.policy.loop import PolicyLoop, RoundObserver, RoundRecord
from netsense.compression.window import WindowProbe, WindowResult
from netsense.transport.sensing.signal import SignalReader

log = logging.getLogger(__name__)
T = TypeVar("T")

PROGRESS_START_VERSION = 0
"""First update of the candidate rounds: its snapshot is the shadow update 0 is encoded against.
The start rounds (`START_ROUNDS`) follow it on consecutive updates, the later rounds every
`progress_every` from it. The codecs' first calls (the warm-up) run on the window thread."""
START_ROUNDS = 2
"""Candidate rounds on updates 0 and 1, each measured on the loop before the next update is chosen
(`DownlinkController.measure`): without them, with no progress table, the priors (PowerSGD's worst
case 0.05) priced wide-mlp's first updates at qsgd:8, 0.30 s each at 20 Mbit/s where powersgd:4
takes 0.05. The first round's figures are interim (they stand only until the second's): a fresh
model's first update is of low rank, and priced on it alone (an EWMA's start, held for 50 updates)
digits-cnn's downlink sent powersgd:1 and needed 95 steps where it needed 80 (docs/history/BENCHMARKS-2026.md,
"The downlink's first round"; "The downlink's start rounds")."""
WINDOW_QUEUE = 4
"""Window steps that may wait for the window thread; beyond that the loop waits for the newest one
(the thread fell behind: better a slow loop than unbounded copies of the parameters)."""


class DownlinkController:
    """One PS's adaptive downlink: `choose` before an update is encoded, `sent` per PARAMS reply."""

    def __init__(
        self,
        policy: str,
        *,
        ladder: str | None = None,
        decision_log: str | Path | None = None,
        windows: bool | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        # pads: the session pads a whole PULL's reply by the decision's filler (`pad_for`).
        self.loop = PolicyLoop(build_policy(policy, ladder, settings), direction="down", decision_log=decision_log, pads=True)
        """The policy and the bookkeeping the uplink shares (compute EWMA, histogram, log)."""
        self.windows = windows
        """Whether progress windows price the levels (False: the candidate rounds' one-update q;
        None, the default: windows unless the job's optimizer is per-coordinate, `per_coordinate`).
        The downlink's windows charge the residual at every step (`WindowProbe`, cumulative): it is
        how far every replica lags the PS's parameters, the point each gradient is taken at, for
        as long as it stays. Charged once at the window's end, as an uplink's, the downlink chose
        powersgd:2 and 1 on two models and needed 1.5-2.5x the updates; charged per step they
        price the levels near the steps each costs, where one update's q priced an unbiased
        qsgd:4 at 0.87-0.94 (worth 1.0) and so held qsgd:8 at twice its bytes (docs/POLICIES.md,
        "The downlink's windows"). Not for Adam: priced in the plain metric, its PowerSGD levels
        read 0.4-0.6 where they are worth 0.8; its rounds take Adam's metric (`metric`)."""
        self.per_coordinate: Callable[[], bool] = lambda: False
        """Whether the job's optimizer is Adam or AdamW (the server's store, once INIT named it)."""
        self._readers: weakref.WeakKeyDictionary[Any, SignalReader] = weakref.WeakKeyDictionary()
        self._chosen_for: int | None = None
        self._pending: tuple[Decision, LinkState, float] | None = None  # decision, link, chosen at
        self._closing: tuple[Decision, LinkState, float | None] | None = None  # decision, link, interval
        self._sent: dict[int, list[float]] = {}  # version -> comm times of finished deliveries
        self._expected: dict[int, int] = {}  # version -> PARAMS replies written
        self._intervals = 0  # update intervals timed (Tc samples)
        self._bytes: dict[int, int] = {}
        self._snapshot: tuple[int, list[int], dict[str, torch.Tensor]] | None = None  # version, levels, shadow
        self._window_pool: ThreadPoolExecutor | None = None  # feeds the progress windows off the loop
        self._window_queued = 0
        self._window_last: Future[Any] | None = None  # the newest work handed to the window thread
        self._unfinished: dict[Future[Any], tuple[Any, ...]] = {}  # handed over, not yet reported (`_finished`)
        self._first_params_at: float | None = None  # loop time the last version-0 PARAMS (the workers' first pull) was acked
        self._first_written_at: float | None = None  # ...and written: its stand-in while that ack is not in (`defer`)
        self._first_compute_s: float | None = None  # from then to the first push: update 0's compute time (`defer`)
        self.metric: Callable[[], dict[str, torch.Tensor] | None] | None = None
        """Per key, the PS optimizer's diagonal metric of a parameter change, read when a round
        measures (the server's store: `ParameterStore.update_metric`; None: the plain metric).
        An Adam job's rounds weigh a level's error by sqrt(v_hat) + eps, the curvature Adam
        assumes: in the plain metric one update priced powersgd:4 at 0.55-0.58 on a row
        transformer whose level trials say 0.77 (0.62-0.65 in the metric), and an Adam MLP's
        downlink sent qsgd:4 on 123-161 of 200 updates where 54-95 in the metric took 0.59-1.0x
        the time to its target (docs/POLICIES.md, "The downlink's metric")."""

    @property
    def policy(self) -> Policy:
        """The downlink's policy (the loop's)."""
        return self.loop.policy

    @property
    def windowed(self) -> bool:
        """Whether progress windows price the levels now (`windows`)."""
        return self.windows if self.windows is not None else not self.per_coordinate()

    @property
    def levels(self) -> dict[str, int]:
        """Updates sent at each codec spec."""
        return self.loop.levels

    @property
    def compute_s(self) -> float | None:
        """EWMA of the time workers spend between receiving an update and their next push."""
        return self.loop.compute_s

    def _reader(self, quic: Any) -> SignalReader:
        reader = self._readers.get(quic)
        if reader is None:
            reader = self._readers[quic] = SignalReader(quic)
        return reader

    def link_of(self, quic: Any) -> LinkState:
        """Snapshot of one connection's path (on the loop thread)."""
        return self._reader(quic).read().to_link_state()

    @staticmethod
    def slowest(links: list[LinkState]) -> LinkState:
        """The link state with the least known bandwidth (unknown counts as slowest)."""
        if not links:
            return LinkState(time_s=time.monotonic(), bandwidth_Bps=None, min_rtt_s=None, srtt_s=None)
        return min(links, key=lambda s: s.bandwidth_Bps if s.bandwidth_Bps is not None else -1.0)

    def due(self, version: int) -> bool:
        """Whether the level of the update that will take the store to `version` + 1 is yet to be
        chosen (once per version: every push of a step asks)."""
        return self._chosen_for != version

    def before_step(
        self,
        version: int,
        *,
        params: dict[str, torch.Tensor],
        shadow: dict[str, torch.Tensor],
        last_encode: tuple[int, str, float] | None,
        payload_bytes: int,
    ) -> None:
        """At the first push of `version`'s step, before `choose`: feed back the encode time of the
        previous update (the store's `last_encode`) and run the candidate rounds on its tensors."""
        self._observe_encode(last_encode, payload_bytes)
        self.measure(version, params, shadow)

    def _observe_encode(self, last: tuple[int, str, float] | None, dense_bytes: int) -> None:
        """Feed the policy the encode time of the update it chose the level of (the store's
        `last_encode`), as the uplink feeds its sends': without it a level's cost came only from
        candidate rounds, and with rounds rare on fast paths a near-tie (fp32 vs fp16) stayed on
        stale timings. The first encode at a level pays lazy set-up and is skipped."""
        if last is None or self._pending is None:
            return
        decision = self._pending[0]
        version, spec, seconds = last
        if version != decision.step + 1 or spec != decision.spec or decision.level is None:
            return
        self.loop.observe_encode(decision.level, dense_bytes, seconds)

    def measure(self, version: int, params: dict[str, torch.Tensor], shadow: dict[str, torch.Tensor]) -> dict[int, float]:
        """At the start of `version`'s step: measure the candidates of the last snapshot if it was
        taken one update ago, then snapshot the shadow when the policy asks for candidates now; and
        feed the parameters to a progress window under way (its steps are their changes). On a
        running loop the rounds run on the window thread, as the window steps do, and reach the
        policy on the loop when done, except the start rounds' measurements (`START_ROUNDS`), here;
        without a loop they all run here. Returns the q measured here per level (fed to the policy
        with the timings; empty when the thread measures)."""
        if self.windowed and version > 0 and self.loop.window_due(version):  # the window diffs parameters into updates
            self._feed_window(list(params.values()))
        measured = self._measure_snapshot(version, params)
        # The warm-up (the codecs' first calls: 0.1-0.2 s with six levels on loaded cores) runs on
        # the window thread: on the loop at version 0 it competed with the first pushes, the
        # uplink's first bandwidth samples (a 100 Mbit/s path measured 1 MB/s and sent qsgd:4).
        # The start rounds ask for the policy's first round again (it answers the same).
        start = PROGRESS_START_VERSION
        if version < start:
            levels = []
        else:
            levels = self.policy.progress_candidates(0 if version < start + START_ROUNDS else version - start)
        if levels and shadow:
            # A start round prices the update alone (the snapshot is the parameters, not the
            # shadow): on update + residual, update 1's round charged the level update 0 went at
            # (a lossy one since it is chosen on itself) with that update's residual, and credited
            # the others with flushing it (the transformer's powersgd:4 0.52 where it was 0.66 on
            # update 1 alone; its downlink left for qsgd:4 at update 6). Version 0: they are equal.
            base = params if start <= version < start + START_ROUNDS and params.keys() == shadow.keys() else shadow
            kept = {k: v.clone() for k, v in base.items()}
            self.prepare(kept, levels)
            self._snapshot = (version, levels, kept)
        return measured

    def _measure_snapshot(self, version: int, params: dict[str, torch.Tensor]) -> dict[int, float]:
        """The candidate round of the snapshot taken one update before `version`, on that update
        (`params` less the shadow it was encoded against); the snapshot is used up either way."""
        snap, self._snapshot = self._snapshot, None
        if snap is None or snap[0] + 1 != version or snap[2].keys() != params.keys():
            return {}
        update = [params[k] - snap[2][k] for k in params]  # new tensors: the thread may keep them
        weights = self._weights(params)
        was = snap[1]
        if snap[0] >= PROGRESS_START_VERSION + START_ROUNDS:
            return self._round(lambda observer: self.loop.measure(was, update, observer, weights)) or {}
        # The start rounds: here, so that the choice of this update has them (on the thread a round
        # reached the policy an update later). The warm-up made the codecs' first calls on the
        # thread; its work is waited for, never two threads on one codec. Two blocks of the loop per
        # run, each a round on a subsample (~30 ms on wide-mlp, 8 levels). The first's q figures
        # are interim (`START_ROUNDS`).
        self._drain()
        interim = snap[0] == PROGRESS_START_VERSION and START_ROUNDS > 1
        return self.loop.measure(was, update, InterimRound(self.policy) if interim else None, weights)

    def _weights(self, params: dict[str, torch.Tensor]) -> list[torch.Tensor] | None:
        """The metric's weights of `params`' keys, in their order (`metric`; new tensors, which the
        window thread may keep); None for the plain metric or when they do not fit the keys."""
        metric = self.metric() if self.metric is not None else None
        if metric is None or metric.keys() != params.keys():
            return None
        weights = [metric[k] for k in params]
        return weights if all(w.shape == params[k].shape for w, k in zip(weights, params)) else None

    def prepare(self, shadow: dict[str, torch.Tensor], levels: list[int] | None = None) -> None:
        """Warm up the candidate codecs of the first round (`levels`, default the policy's round at
        version 0) on the window thread: the codecs' first calls and their wire ratios on the
        model's shapes. Called at INIT too, so that the wait between INIT and the first push (the
        workers' first forward and backward) does it, not the choice of update 0 (`defers`)."""
        if levels is None:
            levels = self.policy.progress_candidates(0)
            shadow = {k: v.detach().clone() for k, v in shadow.items()} if levels else {}  # the thread reads them
        if not levels or not shadow:
            return
        tensors = list(shadow.values())
        self._round(lambda observer: self.loop.warm_up(levels, tensors, observer))

    def defers(self, version: int) -> bool:
        """Whether the level of the update that will take the store to `version` + 1 waits for the
        update itself (`choose_on_update`): the first update, when its round was snapshotted (a
        netsense policy at a fresh start). Chosen at the first push, it had only the levels'
        priors (PowerSGD's worst case, 0.05) and went out at qsgd:8 on every run of the matrix's
        two models (0.14-0.37 s where the next updates took 0.03-0.10 s; docs/history/BENCHMARKS-2026.md,
        "Start-up: update 0 chosen on itself, the probe while connecting")."""
        snap = self._snapshot
        return version == PROGRESS_START_VERSION and snap is not None and snap[0] == version

    def defer(self, version: int) -> None:
        """The choice of `version`'s update is deferred (`defers`): `due` is False until the next.
        Called at the first push, which also times the workers' first step: from the last ack of
        their first pull to now (`_first_compute_s`), or from its write where that ack is not in
        yet: a worker that has its update can compute and push before its (delayed) ACK frame
        reaches the PS, and timed from nothing, or from an ack after the push, the step was 0.
        The write is earlier by the delivery, so the fallback errs toward a longer step."""
        self._chosen_for = version
        loop = _running_loop()
        if loop is None:
            return
        now = loop.time()
        start = self._first_params_at
        if start is None or start >= now:
            start = self._first_written_at
        if start is not None:
            self._first_compute_s = max(0.0, now - start)

    def choose_on_update(
        self, version: int, params: dict[str, torch.Tensor], links: list[LinkState], payload_bytes: int
    ) -> str | None:
        """The codec of the update taking the store to `version` + 1, chosen on that update (the new
        `params`, before it is encoded): its start round first, here (interim, as at the first push
        of the next version it would have been), then the choice for the slowest of `links`.
        Its compute time is the workers' first step as the PS saw it (`defer`): with none (0 until
        an update interval is timed) and q from that first, low-rank update (0.89), digits-cnn's
        update 0 went out at powersgd:1 on loopback to save 8 ms of a 0.2 s step. The choice is
        provisional (`Policy.provisional`): without it that level was held for five more updates."""
        self._measure_snapshot(version + 1, params)
        first = self._first_compute_s if self.loop.compute_s is None else None  # this choice only
        spec = self._decide(version, links, payload_bytes, compute_s=first)
        self.policy.provisional()
        return spec

    def _round(self, work: Callable[[RoundObserver], T]) -> T | None:
        """A candidate round's `work` (a warm-up or a measurement; its argument is what it reports
        to). On a running loop it runs on the window thread, reporting to a `RoundRecord` that is
        replayed into the policy on the loop when it is done, and None is returned: on the loop a
        round held every worker's push for 0.05-0.1 s at versions 2 and 3, and two such pushes in
        a row read as a *slowed* path (deepmlp's uplink estimate fell 13x and it sent top-k 0.1 %
        for ~20 steps: docs/history/BENCHMARKS-2026.md, "Rounds before the choice, and off the PS's loop"). Its
        codec timings are read on `codec_clock` (thread CPU time), which leaves out the GIL waits
        the busy loop imposes there (2-4x a codec's work in wall time: docs/POLICIES.md, "Measured
        costs"). Without a running loop it runs here, reporting to the policy."""
        loop = _running_loop()
        if loop is None:
            return work(self.policy)
        record = RoundRecord()
        self._submit(loop, lambda: work(record), lambda _: record.replay(self.policy), what="candidate round")
        return None

    def _feed_window(self, tensors: list[torch.Tensor]) -> None:
        """One step of the window under way, on the window thread when the loop runs: a window step
        on every lossy level held the PS's loop for ~50 ms per update on wide-mlp (2 loaded cores),
        which workers' pushes waited out and read as a slow path (the bandwidth estimate fell 13x,
        docs/BENCHMARKS.md). On the thread the loop gets the GIL back every switch interval (torch's
        kernels release it). In order, one at a time, only ever on that thread; without a running
        loop, here and now."""
        probe = self.loop.window
        loop = _running_loop()
        if probe is None or loop is None:
            self.loop.feed_window(tensors)
            return
        copies = [t.detach().clone() for t in tensors]  # the store updates its tensors in place

        def dropped() -> None:
            if self.loop.window is probe:
                self.loop.window = None

        self._submit(
            loop,
            lambda: _feed_probe(probe, copies),
            lambda result: self.loop.window_result(probe, result),
            what="progress window",
            failed=dropped,
        )

    def _submit(
        self,
        loop: asyncio.AbstractEventLoop,
        work: Callable[[], Any],
        done: Callable[[Any], None],
        *,
        what: str,
        failed: Callable[[], None] | None = None,
    ) -> None:
        """Run `work` on the window thread (in order, one at a time) and `done(result)` on the loop
        after it; an exception is logged and `failed()` called instead. Beyond `WINDOW_QUEUE`
        waiting, the loop waits for this one: never the policy or a probe from two threads."""
        if self._window_pool is None:
            self._window_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="netsense-window")
        self._window_queued += 1
        future = self._window_last = self._window_pool.submit(work)
        self._unfinished[future] = (done, what, failed)
        future.add_done_callback(lambda f: _call_soon(loop, self._finished, f, done, what, failed))
        if self._window_queued > WINDOW_QUEUE:
            # The thread fell behind: wait for it here, never feed the probe from two threads.
            wait([future])

    def _drain(self) -> None:
        """Wait until the window thread has run everything handed to it (in order, one worker:
        the newest future is the last), and hand its results over now, not at the loop's next
        turn: what the warm-up learnt (wire ratios on the model's shapes) is in the policy for the
        choice that drains."""
        if self._window_last is not None:
            wait([self._window_last])
        for future, then in list(self._unfinished.items()):
            self._finished(future, *then)

    def _finished(
        self, future: Future[Any], done: Callable[[Any], None], what: str, failed: Callable[[], None] | None
    ) -> None:
        """On the loop: work of the window thread finished; its result goes to `done` (once: a
        drain may have handed it over already)."""
        if self._unfinished.pop(future, None) is None:
            return
        self._window_queued -= 1
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            log.warning("downlink %s dropped: %s", what, exc)
            if failed is not None:
                failed()
            return
        done(future.result())

    def choose(self, version: int, links: list[LinkState], payload_bytes: int) -> str | None:
        """The codec spec for the update that will take the store to `version` + 1, for the slowest
        of `links` (the live workers' connections); None when already chosen for this version.

        The update before it is fed back now if every worker has its copy; else when the last
        delivery is acked (`_finish`). The choice comes at the *first* push of a step, and a near
        worker pushes while the far one is still receiving: fed back at once, the update was
        timed on the near worker alone (one shard of wide-mlp across 2 sites: 3 in 4 updates, and
        an estimate of 10-40 MB/s on a 2.5 MB/s path)."""
        if self._chosen_for == version:
            return None
        return self._decide(version, links, payload_bytes)

    def _decide(self, version: int, links: list[LinkState], payload_bytes: int, compute_s: float | None = None) -> str:
        self._chosen_for = version
        now = time.perf_counter()
        self._finish(force=True)  # the update before last: with the deliveries it had
        if self._pending is not None:
            decision, link, chosen_at = self._pending
            self._closing, self._pending = (decision, link, now - chosen_at), None
            self._finish()
        # Before the first interval is timed the compute time counts as 0 (`PolicyLoop.choose`), and
        # the bandwidth the workers' INIT pulls measured decides: blanked until 2026-12-03, it sent
        # update 0 at the unknown-bandwidth level (fp16 on wide-mlp at 20 Mbit/s: 0.56 s where
        # qsgd:8 took 0.28; docs/history/BENCHMARKS-2026.md, "Start-up of the downlink").
        link = self.slowest(links)
        decision = self.loop.choose(link, payload_bytes=payload_bytes, step=version, compute_s=compute_s)
        self._pending = (decision, link, now)
        self.loop.count(decision.spec)
        return decision.spec

    def pad_for(self, version: int) -> int:
        """Filler bytes to send with the update that made `version` (the decision's padded probe,
        `Decision.pad_bytes`), 0 when it was not padded or is no longer the latest chosen."""
        pending = self._pending
        return pending[0].pad_bytes if pending is not None and pending[0].step + 1 == version else 0

    def sent(self, quic: Any, version: int, nbytes: int) -> None:
        """A PARAMS reply of `nbytes` for `version` is being written on `quic` now (call before
        the write, on the loop thread); its delivery is timed by the ack that completes it
        (`SensingState.when_delivered`, on the connection's clock: the loop's)."""
        self._bytes[version] = nbytes
        self._expected[version] = self._expected.get(version, 0) + 1
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        if version == 0:
            self._first_written_at = max(t0, self._first_written_at or t0)

        def delivered(at: float) -> None:  # inside the connection's ack handling: record, no more
            self._sent.setdefault(version, []).append(max(0.0, at - t0))
            if version == 0:
                self._first_params_at = max(at, self._first_params_at or at)
            _call_soon(loop, self._finish)

        self._reader(quic).state.when_delivered(nbytes, delivered)

    def _finish(self, *, force: bool = False) -> None:
        """Log and feed back the update whose cycle ended (`_closing`) once every PARAMS reply
        written for it was acked, or with the deliveries it had when `force`d (the next choice, a
        worker that left): its Tc sample is the update interval less the slowest delivery, its
        comm time that delivery."""
        if self._closing is None:
            return
        decision, link, interval = self._closing
        version = decision.step + 1
        times = self._sent.get(version, [])
        if not force and len(times) < self._expected.get(version, 0):
            return
        self._closing = None
        self._sent.pop(version, None)
        nbytes = self._bytes.pop(version, None)
        comm = max(times) if times else None
        if interval is not None:
            if self._intervals == 1:
                # The first interval held the workers' first step (set-up, first encodes, a push at
                # an unknown bandwidth): folded in, it kept Tc at 4-5x its steady value for ~8
                # updates, and wide-mlp's downlink on 8- and 4-bit levels while PowerSGD already
                # cost less (docs/history/BENCHMARKS-2026.md, "The first updates"). The second replaces it.
                self.loop.restart_compute()
            self._intervals += 1
            # Not the whole interval: with the delivery in it, every level's predicted step carried
            # the update's own send twice (wide-mlp: 66-71 ms of "compute" in a 60 ms cycle).
            self.loop.time_compute(max(0.0, interval - (comm or 0.0)))
        if nbytes is not None and comm is not None:
            self.loop.observe(decision, bytes_sent=nbytes, comm_s=comm, pad_bytes=decision.pad_bytes)
        self.loop.write(decision, link, bytes_sent=nbytes, comm_s=comm, version=version, receivers=len(times))
        for old in [v for v in (*self._sent, *self._expected) if v <= version]:
            self._sent.pop(old, None)
            self._bytes.pop(old, None)
            self._expected.pop(old, None)

    def close(self) -> None:
        """Log the last updates and close the decision log (a delivery still unacked is not timed)."""
        self._finish(force=True)
        if self._pending is not None:
            self._closing, self._pending = (*self._pending[:2], None), None
            self._finish(force=True)
        if self._window_pool is not None:
            self._window_pool.shutdown(wait=False, cancel_futures=True)
        self.loop.close()


class InterimRound:
    """Reports a candidate round to `policy` with its q figures marked interim
    (`Policy.observe_progress`): they replace a level's prior and are replaced by its next figure."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def observe_costs(self, **kwargs: Any) -> None:
        self.policy.observe_costs(**kwargs)

    def observe_ratio(self, **kwargs: Any) -> None:
        self.policy.observe_ratio(**kwargs)

    def observe_progress(self, *, level: int, progress: float) -> None:
        self.policy.observe_progress(level=level, progress=progress, interim=True)


def _feed_probe(probe: WindowProbe, tensors: list[torch.Tensor]) -> WindowResult | None:
    """One window step, on the window thread (a probe that finished takes no more steps)."""
    return None if probe.done else probe.feed(tensors)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, None outside one."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Any, *args: Any) -> None:
    """`call_soon_threadsafe`, quiet once the loop has closed (the PS stopped: nothing to feed)."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        pass
