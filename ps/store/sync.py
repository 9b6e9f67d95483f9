"""`SyncBarrier`: synchronous training (BSP), the store's default mode.

A step is applied only when every live worker has pushed every key, so nothing is ever
half-applied: partial pushes of a worker that leaves are discarded whole. The first step waits for
the whole job (`start_quorum`) or the barrier timeout; the first after every worker left (a
whole-job restart against a running PS) waits so for the last step's workers. Keyed pulls may
apply keys of the step ahead of the version (pipeline.py); the barrier then completes the step
through it.
"""

from __future__ import annotations

import torch

from netsense.transport.wire import Params, Push

from .core import StepApplied, StoreCore
from .encode import UpdateEncoder
from .pipeline import PipelinedStep


class SyncBarrier:
    """Every live worker's gradients, sample-weighted, make one update per version."""

    max_staleness = 0
    """Every gradient is computed on the current version."""

    def __init__(self, core: StoreCore, encoder: UpdateEncoder, pipeline: PipelinedStep) -> None:
        self._core = core
        self._encoder = encoder
        self._pipeline = pipeline

    def join(self, worker_id: str) -> None:
        """A rejoining worker redoes its step from the start, so a partial push of its old
        connection is discarded (its re-push would otherwise be refused as a duplicate)."""
        core = self._core
        core.live.add(worker_id)
        pending = core.pending.get(worker_id)
        members = self._pipeline.members
        if pending is not None and members is not None and worker_id in members:
            pending.grads.clear()  # its re-push fills the keys not yet applied; applied ones keep its share
        else:
            core.pending.pop(worker_id, None)

    def record(self, worker_id: str, msg: Push, grads: dict[str, torch.Tensor]) -> StepApplied | None:
        pipeline = self._pipeline
        if pipeline.members is not None and worker_id not in pipeline.members:
            return None  # joined after this pipelined step's first key: it sits the step out
        self._core.live.add(worker_id)
        self._core.record(worker_id, msg, grads, skip=pipeline.applied)
        if pipeline.wanted:
            pipeline.apply_ready(grads)
        return self._maybe_apply()

    def leave(self, worker_id: str) -> StepApplied | None:
        """Remove a worker and discard its partial step; may complete the barrier for the rest. The
        last to leave makes the next step wait for the last step's workers (`StoreCore.regather`)."""
        self._discard(worker_id)
        if not self._core.live and self._core.initialized:
            self._core.regather()
        self._pipeline.apply_wanted()
        return self._maybe_apply()

    def drop_incomplete(self) -> tuple[list[str], StepApplied | None]:
        """Barrier timeout: remove live workers that have not finished the current step."""
        core, pipeline = self._core, self._pipeline
        if not any(pipeline.complete(w) for w in core.pending):
            return [], None
        step_workers = pipeline.members if pipeline.members is not None else core.live  # a late joiner sits a pipelined step out
        dropped = [w for w in step_workers if not pipeline.complete(w)]
        core.start_quorum = 1  # the timeout also ends the wait for workers that never came
        for w in dropped:
            self._discard(w)
        pipeline.apply_wanted()
        return dropped, self._maybe_apply()

    def may_proceed(self, worker_id: str) -> bool:
        return True  # the barrier itself holds workers back: a PULL waits for the next version

    @property
    def blocked(self) -> bool:
        return False

    def pull(self, have_version: int) -> Params:
        return self._encoder.pull(self._core.version, have_version)

    def reset(self) -> None:
        self._pipeline.reset()

    def abandon(self, worker_id: str) -> None:
        """The step was refused whole: every push of it is dropped (the workers re-push after a
        full pull); the live set stays, so the barrier waits for all of them again."""
        self._core.pending.clear()
        self._pipeline.reset()
        if self._core.gradient is not None:
            self._core.gradient.discard()  # what the refused step compressed was never sent

    def _discard(self, worker_id: str) -> None:
        """Out of the live set and out of the current step."""
        self._core.live.discard(worker_id)
        self._core.pending.pop(worker_id, None)
        self._pipeline.drop(worker_id)

    def _maybe_apply(self) -> StepApplied | None:
        result = self._apply()
        if result is not None:
            self._core.last_quorum = len(result.workers)
        return result

    def _apply(self) -> StepApplied | None:
        core, pipeline = self._core, self._pipeline
        if pipeline.applied:
            return pipeline.finish()
        ready = [w for w in core.pending if pipeline.complete(w)]
        if not ready or any(not pipeline.complete(w) for w in core.live):
            return None
        if core.gathering and len(ready) < core.start_quorum:
            return None  # the first step (and the first after all left) waits for the job's workers
        total = core.optimizer_step(ready)
        base = core.version
        core.advance()
        core.pending.clear()
        pipeline.reset()  # `wanted` too: keys wanted but never applied ahead
        self._encoder.encode_update(core.params, core.version, base)
        return StepApplied(core.version, tuple(sorted(ready)), total)
