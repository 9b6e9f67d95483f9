"""`PipelinedStep`: keys of a sync step applied ahead of the version, for keyed pulls.

A worker that sends a keyed PULL for the current step marks those keys wanted; a wanted key is
applied as soon as every worker of the step has pushed it (the optimizers are per parameter: SGD,
Adam and AdamW couple no keys), and its downlink payload is encoded at once, so the PS streams a
step's first keys down while the last are still coming up. The version still advances only when
every key is applied. The step's workers are fixed at its first applied key: one that joins later
sits the step out (its pushes are ignored, its pull gets the step's update); one that leaves (or is
dropped at the barrier timeout) is left out of the keys not yet applied, which are averaged over
the workers that pushed them. State keys (buffers) ride with a bucket's push but are averaged
only when the step is whole: a keyed pull of them is answered once the version advances, from the
step's update, which carries them as a whole step's does. Until the version advances the new shadow values of applied keys are
kept apart, so a full pull still returns the previous version whole. Without keyed pulls nothing
here runs and the sync barrier (sync.py) applies a step whole; so does a PS that clips the
gradient norm (``clip_grad_norm``), since the norm needs every key of the step before any applies,
and a step whose downlink codec is chosen on its whole update (`UpdateEncoder.defer_choice`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import torch

from netsense.compression import Payload
from netsense.transport.wire import Params, Sum

from .core import StepApplied, StoreCore
from .encode import UpdateEncoder, gradient_params
from .gradient import LOSSLESS


class PipelinedStep:
    """The part of the current sync step that runs ahead of the version."""

    def __init__(self, core: StoreCore, encoder: UpdateEncoder) -> None:
        self._core = core
        self._encoder = encoder
        self.applied: dict[str, Payload | Sum] = {}
        """Key -> downlink payload, ahead of the version."""
        self.members: tuple[str, ...] | None = None
        """The step's workers, fixed at its first applied key."""
        self.wanted: set[str] = set()
        """Keys a keyed PULL waits for in the current step."""
        self._next_shadow: dict[str, torch.Tensor] = {}  # shadow values once the step completes
        self._spec: str | None = None  # downlink codec of the step (fixed at its first key)

    def complete(self, worker_id: str) -> bool:
        """The worker has pushed every key not applied ahead."""
        return self._core.complete(worker_id, len(self.applied))

    def want(self, keys: list[str], step: int) -> int:
        """Mark `keys` wanted for the update from version `step`; apply those every worker of the
        step has pushed; returns how many were applied now."""
        if step != self._core.version:
            return 0  # an old step (its update is whole by now) or a future one (the push is refused as stale)
        self.wanted.update(k for k in keys if k in self._core.params)  # state keys are never applied ahead
        return self.apply_ready(keys)

    def apply_wanted(self) -> None:
        """After the step lost a worker: wanted keys that everyone left has pushed can go now."""
        if self.wanted:
            self.apply_ready(sorted(self.wanted))

    def keys_ready(self, keys: Iterable[str], version: int) -> bool:
        """True once a keyed pull for `keys` at `version` can be answered."""
        v = self._core.version
        return v >= version or (v == version - 1 and all(k in self.applied for k in keys))

    def pull(self, have_version: int, keys: Iterable[str]) -> Params:
        """The update of `keys` from `have_version` to the next version, as soon as they are
        applied; the full parameters (every key) when no such update exists."""
        keys = list(keys)
        version = self._core.version
        if version == have_version and all(k in self.applied for k in keys):
            if self._gradient:
                return gradient_params(version + 1, version, {k: self.applied[k] for k in keys}, {})
            full = self._full
            base = -1 if full else version
            return Params(version + 1, full, _payloads({k: self.applied[k] for k in keys}), base_version=base)
        last = self._encoder.last_update
        if (
            last is not None and last.version == version == have_version + 1 and (last.full or last.base_version == have_version)
            and all(k in last.tensors or k in last.sums for k in keys)
        ):  # fmt: skip
            tensors = {k: last.tensors[k] for k in keys if k in last.tensors}
            return replace(last, tensors=tensors, sums={k: last.sums[k] for k in keys if k in last.sums})  # the same update, those keys
        return self._encoder.full_params(version)

    def step_workers(self) -> tuple[str, ...]:
        """Whose gradients make up the current step: its fixed workers, or (before its first key)
        every live worker once each has pushed something; () while one has not."""
        if self.members is not None:
            return self.members
        core = self._core
        if not core.live or any(w not in core.pending for w in core.live):
            return ()
        return tuple(core.pending)  # summed in worker-id order (`StoreCore.contributing`), as the plain step

    def apply_ready(self, keys: Iterable[str]) -> int:
        """Apply the wanted keys among `keys` that every worker of the step has pushed."""
        core = self._core
        settings = core.optimizer_settings
        if settings is not None and settings.clip_grad_norm > 0:
            return 0  # the step's norm needs all its keys: the barrier applies it whole
        if self._encoder.deferred:
            return 0  # its codec is chosen on the whole update (`UpdateEncoder.defer_choice`)
        workers = self.step_workers()
        if not workers or (core.gathering and self.members is None and len(workers) < core.start_quorum):
            return 0
        ready = [
            k for k in dict.fromkeys(keys)
            if k in self.wanted and k not in self.applied and all(core.pending[w].skipped or k in core.pending[w].grads for w in workers)
        ]  # fmt: skip
        if ready:
            self.members = workers
            if self._spec is None:
                self._spec = self._encoder.current_spec
            self._apply(workers, ready)
        return len(ready)

    @property
    def _gradient(self) -> bool:
        """The step's payloads are its compressed gradient (gradient.py)."""
        return self._core.gradient is not None

    @property
    def _full(self) -> bool:
        """The step's payloads are the parameters themselves (a lossless parameter-domain codec)."""
        return self._spec in LOSSLESS and not self._gradient

    def _apply(self, workers: tuple[str, ...], keys: list[str]) -> None:
        """Optimizer step of `keys`, then their downlink payloads; the new shadow values wait."""
        assert self._spec is not None
        self._core.apply_keys(workers, keys)
        for key in keys:
            self.applied[key], self._next_shadow[key] = self._encoder.encode_key(key, self._core.params[key], self._spec)

    def finish(self) -> StepApplied | None:
        """Apply the keys no pull wanted and advance the version, once every worker of the step has
        pushed every key."""
        core = self._core
        workers = self.step_workers()
        if not workers or any(not self.complete(w) for w in workers):
            return None
        self.members = workers
        rest = [k for k in core.params if k not in self.applied]
        if rest:
            self._apply(workers, rest)
        total = sum(core.pending[w].samples for w in core.contributing(workers))
        full = self._full
        base = core.version
        core.merge_state(workers)
        core.advance()
        core.guard.commit()  # whole now: the copies kept for a refusal go
        if core.gradient is not None:
            core.gradient.commit(base)  # the step's residuals replace the old ones
        self._encoder.shadow.update(self._next_shadow)
        entries = {k: self.applied[k] for k in core.params}
        state = self._encoder.state_payloads()  # the averaged buffers, as in a whole step's update
        if self._gradient:
            self._encoder.last_update = gradient_params(core.version, base, entries, state, core.gradient.intents if core.gradient else ())
        else:
            self._encoder.last_update = Params(core.version, full, {**_payloads(entries), **state}, base_version=-1 if full else base)
        core.pending.clear()
        self.reset()
        return StepApplied(core.version, tuple(sorted(workers)), total)

    def drop(self, worker_id: str) -> None:
        """A member left: the keys not yet applied are averaged over the rest."""
        if self.members is not None and worker_id in self.members:
            self.members = tuple(w for w in self.members if w != worker_id) or None

    def reset(self) -> None:
        """The step ended (or was abandoned): nothing runs ahead any more. (After a refusal the
        guard has already put the keys applied ahead back.)"""
        self._core.guard.commit()
        self.applied, self._next_shadow, self.wanted = {}, {}, set()
        self.members = self._spec = None


def _payloads(entries: dict[str, Payload | Sum]) -> dict[str, Payload]:
    """A parameter-domain step's entries, every one a payload (only a gradient-domain step forwards)."""
    out = {k: v for k, v in entries.items() if isinstance(v, Payload)}
    assert len(out) == len(entries), "a parameter-domain step forwarded pushes"
    return out
