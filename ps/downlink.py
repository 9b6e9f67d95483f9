"""The PS's downlink policy loop (DESIGN.md §5, sync mode).

The PS sends the same update bytes to every worker (one shadow), so it picks one level per update
for the slowest live worker's connection: the link state with the least bandwidth among the
sessions' signals. What the send cost is measured per connection as the time from writing the
PARAMS reply until the peer has acknowledged that many bytes (the sensing controller's delivered
counter); the slowest connection's time is the update's comm time. One decision-log line per update,
written when the next update is chosen (by then every worker has its copy).

The policy learns the downlink's own progress efficiency q and codec costs as the uplink's does
(docs/POLICIES.md): when it asks for candidates (every `progress_every` updates), the controller
keeps a copy of the shadow, and at the next update measures every candidate level, q and encode /
decode time, on exactly what that update encoded, v = params - old shadow (update + residual).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from netsense.compression.base import Codec, make_codec
from netsense.compression.ladder import DEFAULT_LADDER, Ladder
from netsense.compression.link import LinkState
from netsense.compression.policy import Decision, Policy, make_policy
from netsense.compression.progress import WARM_UP_NUMEL, measure_into, measure_level
from netsense.transport.decisions import DecisionLog
from netsense.transport.sensing.signal import SignalReader

log = logging.getLogger(__name__)

COMPUTE_EWMA_ALPHA = 0.3
"""Weight of the newest sample of the time workers spend between receiving an update and the next."""
WATCH_TIMEOUT_S = 60.0
"""Give up timing one delivery after this long (a worker that vanished)."""


class DownlinkController:
    """One PS's adaptive downlink: `choose` before an update is encoded, `sent` per PARAMS reply."""

    def __init__(self, policy: str, *, ladder: str | None = None, decision_log: str | Path | None = None) -> None:
        self.policy: Policy = make_policy(policy, Ladder.parse(ladder or DEFAULT_LADDER))
        self.log = DecisionLog(decision_log, direction="down") if decision_log else None
        self.levels: dict[str, int] = {}
        """Updates sent at each codec spec."""
        self.compute_s: float | None = None
        self._readers: weakref.WeakKeyDictionary[Any, SignalReader] = weakref.WeakKeyDictionary()
        self._chosen_for: int | None = None
        self._pending: tuple[Decision, LinkState, float] | None = None  # decision, link, chosen at
        self._sent: dict[int, list[float]] = {}  # version -> comm times of finished deliveries
        self._bytes: dict[int, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._snapshot: tuple[int, list[int], dict[str, torch.Tensor]] | None = None  # version, levels, shadow
        self._sample_codecs: dict[int, Codec] = {}  # own instances: stateful codecs keep their state
        self._warm: set[int] = set()  # levels whose update was encoded once (set-up paid)

    def _reader(self, quic: Any) -> SignalReader:
        reader = self._readers.get(quic)
        if reader is None:
            reader = self._readers[quic] = SignalReader(quic)
        return reader

    def link_of(self, quic: Any) -> LinkState:
        """Snapshot of one connection's path (on the loop thread)."""
        return self._reader(quic).read().to_link_state()

    def slowest(self, quics: list[Any]) -> LinkState:
        """The link state with the least known bandwidth (unknown counts as slowest)."""
        links = [self.link_of(q) for q in quics]
        if not links:
            return LinkState(time_s=time.monotonic(), bandwidth_Bps=None, min_rtt_s=None, srtt_s=None)
        return min(links, key=lambda s: s.bandwidth_Bps if s.bandwidth_Bps is not None else -1.0)

    def before_step(self, store: Any, sessions: dict[str, Any]) -> None:
        """At a push: choose the level of the update this step will produce (once per version)
        for the live workers' connections, and set it on the store."""
        if not store.initialized or self._chosen_for == store.version:
            return
        self._observe_encode(store.last_encode, 4 * store.numel)
        self.measure(store.version, store.params, store.shadow)
        quics = [s.conn.quic for wid, s in sessions.items() if wid in store.live]
        spec = self.choose(store.version, quics, 4 * store.numel)
        if spec is not None:
            store.set_downlink(spec)

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
        if decision.level not in self._warm:
            self._warm.add(decision.level)
            return
        self.policy.observe_costs(level=decision.level, dense_bytes=dense_bytes, encode_s=seconds)

    def measure(self, version: int, params: dict[str, torch.Tensor], shadow: dict[str, torch.Tensor]) -> dict[int, float]:
        """At the start of `version`'s step: measure the candidates of the last snapshot if it was
        taken one update ago, then snapshot the shadow when the policy asks for candidates now.
        Returns the q measured per level (fed to the policy with the timings)."""
        measured: dict[int, float] = {}
        snap, self._snapshot = self._snapshot, None
        if snap is not None and snap[0] + 1 == version and snap[2].keys() == params.keys():
            update = [params[k] - snap[2][k] for k in params]
            measured = self._measure_levels(snap[1], update)
        levels = self.policy.progress_candidates(version)
        # Not at version 0: a round blocks the PS's loop (0.1-0.2 s with six levels' first calls on
        # loaded cores) and the srtt it inflates slows the pacer for the next pushes too, which at
        # steps 0-2 are the uplink's first bandwidth samples (a 100 Mbit/s path measured 1 MB/s and
        # sent qsgd:4). From `progress_every` on the estimates have a window of samples to absorb it.
        if levels and shadow and version > 0:
            self._warm_up(levels, list(params.values()))
            self._snapshot = (version, levels, {k: v.clone() for k, v in shadow.items()})
        return measured

    def _warm_up(self, levels: list[int], tensors: list[torch.Tensor]) -> None:
        """Build the levels' codecs and call each once on a small sample: a first call pays lazy
        set-up (2-10x), which must not count as the level's cost."""
        for level in levels:
            if level not in self._sample_codecs:
                self._sample_codecs[level] = make_codec(self.policy.ladder[level].spec)
                measure_level(self._sample_codecs[level], tensors, max_numel=WARM_UP_NUMEL)

    def _measure_levels(self, levels: list[int], update: list[torch.Tensor]) -> dict[int, float]:
        measured = {}
        for level in levels:
            q = measure_into(self.policy, level, self._sample_codecs[level], update)  # warmed up at the snapshot
            if q is not None:
                measured[level] = q
        return measured

    def choose(self, version: int, quics: list[Any], payload_bytes: int) -> str | None:
        """The codec spec for the update that will take the store to `version` + 1; None when
        already chosen for this version."""
        if self._chosen_for == version:
            return None
        self._chosen_for = version
        now = time.perf_counter()
        self._finish()
        if self._pending is not None:
            interval = now - self._pending[2]
            comm = max(self._sent.get(self._pending[0].step + 1, [0.0]) or [0.0])
            sample = max(0.0, interval - comm)
            a = COMPUTE_EWMA_ALPHA
            self.compute_s = sample if self.compute_s is None else a * sample + (1 - a) * self.compute_s
        link = self.slowest(quics)
        if self.compute_s is None:  # nothing timed yet: no basis to trade bytes for time
            link = replace(link, bandwidth_Bps=None)
        decision = self.policy.choose(
            link=link, payload_bytes=payload_bytes, compute_s=self.compute_s or 0.0, overlap=False, step=version
        )
        self._pending = (decision, link, now)
        self.levels[decision.spec] = self.levels.get(decision.spec, 0) + 1
        return decision.spec

    def sent(self, quic: Any, version: int, nbytes: int) -> None:
        """A PARAMS reply of `nbytes` for `version` is being written on `quic` now (call before
        the write, on the loop thread); times its delivery in the background."""
        state = self._reader(quic).state
        self._bytes[version] = nbytes
        task = asyncio.get_event_loop().create_task(self._watch(state, state.delivered, nbytes, version))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self, state: Any, base: int, nbytes: int, version: int) -> None:
        t0 = time.perf_counter()
        while state.delivered - base < nbytes:
            if time.perf_counter() - t0 > WATCH_TIMEOUT_S:
                return
            await asyncio.sleep(0.002)
        self._sent.setdefault(version, []).append(time.perf_counter() - t0)

    def _finish(self) -> None:
        """Log and feed back the previous update (its deliveries are done by now)."""
        if self._pending is None:
            return
        decision, link, _ = self._pending
        version = decision.step + 1
        times = self._sent.pop(version, [])
        nbytes = self._bytes.pop(version, None)
        comm = max(times) if times else None
        if nbytes is not None and comm is not None:
            self.policy.observe(step=decision.step, level=decision.level, bytes_sent=nbytes, comm_s=comm)
        if self.log is not None:
            self.log.write(decision, link, bytes_sent=nbytes, comm_s=comm, version=version, receivers=len(times))
        for old in [v for v in self._sent if v < version]:
            self._sent.pop(old, None)
            self._bytes.pop(old, None)

    def close(self) -> None:
        self._finish()
        self._pending = None
        for task in list(self._tasks):
            task.cancel()
        if self.log is not None:
            self.log.close()
