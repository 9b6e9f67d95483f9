"""`SspClocks`: asynchronous training with stale-synchronous-parallel bounds (``staleness=s``).

A worker's gradient is applied alone as soon as that worker has pushed every key of its step
(weighted by nothing but its own batch); each application is one version. Each worker has a
clock, the number of its applied pushes; `may_proceed` says whether it is at most `s` ahead of the
slowest live worker, and the server holds the worker's PULL until it is (docs/ARCHITECTURE.md,
"Async mode (SSP)"). Pulls then return the full fp32 parameters at whatever version is
current: no per-worker shadows, so a worker can pick up any version (the downlink codec and policy
do not apply in this mode).
"""

from __future__ import annotations

import torch

from netsense.transport.wire import Params, Push

from .core import StepApplied, StoreCore
from .encode import UpdateEncoder


class SspClocks:
    """Each complete push is one update; clocks bound how far a worker runs ahead."""

    def __init__(self, core: StoreCore, encoder: UpdateEncoder, staleness: int) -> None:
        self._core = core
        self._encoder = encoder
        self.staleness = staleness
        self.max_staleness = 0
        """Largest staleness of an applied gradient since start."""

    def join(self, worker_id: str) -> None:
        """A rejoining worker redoes its step: a partial push of its old connection is discarded."""
        self._enter(worker_id)
        self._core.pending.pop(worker_id, None)

    def _enter(self, worker_id: str) -> None:
        """Make a worker live; its clock starts at (or is raised to) the slowest live worker's, so
        a newcomer or a returning worker never holds back the others."""
        core = self._core
        if worker_id not in core.live:
            floor = core.min_live_clock
            core.clocks[worker_id] = max(core.clocks.get(worker_id, 0), floor if floor is not None else 0)
        core.live.add(worker_id)

    def record(self, worker_id: str, msg: Push, grads: dict[str, torch.Tensor]) -> StepApplied | None:
        self._enter(worker_id)
        self._core.record(worker_id, msg, grads)
        return self._apply_one(worker_id) if self._core.complete(worker_id) else None

    def _apply_one(self, worker_id: str) -> StepApplied:
        """Apply one worker's complete gradient alone; its clock advances."""
        core = self._core
        staleness = core.version - core.pending[worker_id].step
        samples = core.optimizer_step([worker_id])
        del core.pending[worker_id]
        core.advance()
        core.clocks[worker_id] = core.clocks.get(worker_id, 0) + 1
        self.max_staleness = max(self.max_staleness, staleness)
        self._encoder.last_update = None  # pulls send the full parameters (see `pull`)
        return StepApplied(core.version, (worker_id,), samples, staleness)

    def leave(self, worker_id: str) -> StepApplied | None:
        """Out of the live set and its partial step discarded; nothing waits on it to apply."""
        self._core.live.discard(worker_id)
        self._core.pending.pop(worker_id, None)
        return None

    def drop_incomplete(self) -> tuple[list[str], StepApplied | None]:
        """Timeout: remove the slowest live workers, if they hold back another one (SSP wait)."""
        core = self._core
        if not self.blocked:
            return [], None
        floor = core.min_live_clock
        dropped = [w for w in core.live if core.clocks.get(w, 0) == floor]
        for w in dropped:
            core.live.discard(w)
            core.pending.pop(w, None)
        return dropped, None

    def may_proceed(self, worker_id: str) -> bool:
        """SSP rule: a worker with clock c may start its next step iff ``c - min_live_clock <= s``
        (always true for a worker that is not live: its next push re-enters it)."""
        core = self._core
        if worker_id not in core.live:
            return True
        floor = core.min_live_clock
        return floor is None or core.clocks.get(worker_id, 0) - floor <= self.staleness

    @property
    def blocked(self) -> bool:
        """Some live worker is more than `staleness` ahead of the slowest one."""
        return any(not self.may_proceed(w) for w in self._core.live)

    def pull(self, have_version: int) -> Params:
        # Workers hold different versions: a delta would need a shadow per worker. The full
        # fp32 parameters fit any replica, and are what the SSP analysis assumes.
        return self._encoder.lossless(self._core.version, self._core.params)

    def reset(self) -> None:
        pass  # no step state beyond the pending pushes

    def abandon(self, worker_id: str) -> None:
        """Its gradient alone made the refused update: only its push is dropped, clock unchanged."""
        self._core.pending.pop(worker_id, None)
