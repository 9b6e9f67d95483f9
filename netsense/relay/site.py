"""`SiteStore`: the relay's state, a pure state machine shaped like the PS's `ParameterStore`.

The PS's sessions (`netsense.ps.server.WorkerSession`) drive it unchanged: they authenticate local
workers and call `push`, `pull`, `join`, `leave` as on a PS. What differs is the end of a step. The
PS's barrier ends in an optimizer step and a version move; the site's barrier ends in one
`Aggregate` (the sample-weighted mean of the site's gradients, weighted by their total samples),
which the relay pushes upstream, and the version moves only when the upstream's update comes back
(`install`). Every check of a local push is the PS's own (`StoreCore.check_push`, reused, not
copied), and the sum is the PS's own `_weighted_grad`, so one relay in front of a PS produces the
very gradient the PS would have summed from the same workers (docs/ARCHITECTURE.md,
"Hierarchical aggregation").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from netsense.compression import Payload, make_codec
from netsense.errors import ProtocolError
from netsense.ps.optim import OptimizerSettings, as_hyper, optimizer_state_payloads
from netsense.ps.store.core import StepApplied, StoreCore, key_hparams
from netsense.transport.wire import Init, Params, Push, TensorInfo
from netsense.worker.mirror import OptimizerMirror

log = logging.getLogger(__name__)


@dataclass
class Aggregate:
    """One site step, ready to go upstream: what one worker would push for the whole site."""

    step: int
    samples: int
    """The contributing local workers' samples, summed: the upstream weights the site by them."""
    grads: dict[str, torch.Tensor]
    """Key -> sum of n_i / samples * g_i over the contributing workers (fp32, the PS's order)."""
    state: dict[str, torch.Tensor]
    """State keys (buffers) -> their sample-weighted mean over the workers that pushed them."""
    hparams: dict[str, dict[str, float]] = field(default_factory=dict)
    """Key -> the hyper-parameters its pushes carried (the local workers agreed on them)."""
    skip: bool = False
    """Every local worker sat the step out (AMP skip): the site pushes one skip PUSH."""
    workers: tuple[str, ...] = ()


class SiteCore(StoreCore):
    """The PS's core with one relaxation: the optimizer's name may be unknown here."""

    def check_step_fields(self, worker_id: str, msg: Push, *, agree: bool) -> None:
        """As the PS's, but a relay that never saw INIT (rank 0 is at another site) does not know
        which hyper-parameter names the optimizer takes: the upstream PS checks those (their bounds
        were checked when the message was decoded); the skip rule and the agreement between this
        site's workers are checked here as on the PS."""
        if self.optimizer_settings is not None:
            super().check_step_fields(worker_id, msg, agree=agree)
            return
        self.optimizer_settings = _ANY_OPTIMIZER
        try:
            super().check_step_fields(worker_id, replace(msg, hparams=()), agree=False)
        finally:
            self.optimizer_settings = None
        for key, hyper in key_hparams(msg).items():
            for other, p in self.pending.items():
                theirs = p.hparams.get(key)
                if agree and other != worker_id and theirs is not None and theirs != hyper:
                    raise ProtocolError(
                        "hparams", f"key {key!r}: hyper-parameters {dict(hyper)} differ from {other!r}'s in step {msg.step}"
                    )


_ANY_OPTIMIZER = OptimizerSettings.from_dict({"name": "sgd", "lr": 0.1})
"""Stands in while the skip rule is checked on a push stripped of hyper-parameters."""


class SiteStore:
    """The site's barrier, its replica of the upstream parameters and the update that fans out."""

    staleness = None
    """The relay is synchronous: an asynchronous PS needs no barrier to aggregate at."""
    asynchronous = False
    max_staleness = 0
    blocked = False
    applied_keys = 0
    """Nothing is applied ahead: keyed pulls are answered once the upstream update is here."""
    last_encode = None
    min_live_clock = None

    def __init__(self, *, local_quorum: int = 1, job_id: str = "") -> None:
        self._core = SiteCore()
        self._local_quorum = max(1, local_quorum)
        self._core.start_quorum = self._local_quorum
        self._core.job_id = job_id
        self._fp32 = make_codec("fp32")
        self.update: Params | None = None
        """The upstream's newest update: the same bytes answer every local pull that can use them."""
        self.outgoing: Aggregate | None = None
        """A completed site step not yet taken by the relay (`take`)."""
        self.in_flight: int | None = None
        """Step whose aggregate is upstream; pushes for it are checked and then ignored."""
        self.pending_init: Init | None = None
        """A local rank 0's INIT, checked, not yet forwarded (`take_init`)."""
        self.model: dict[str, TensorInfo] = {}
        self.refused_updates = 0
        self.rejected_messages = 0
        self.applied_steps = 0
        self._refused: tuple[int, set[str], str] | None = None
        self._step_fields: dict[str, dict[str, float]] = {}
        self._unsplit = False
        self._flying: Aggregate | None = None  # the step upstream now (`take`)
        self.mirror: OptimizerMirror | None = None
        """The upstream's optimizer, run here when its downlink is in the gradient domain
        (docs/ARCHITECTURE.md, "Gradient-domain downlink"): the replica steps as the PS does, and
        a local worker's full pull gets its settings and state."""

    # --- what the PS's sessions read ------------------------------------------------------

    @property
    def version(self) -> int:
        return self._core.version

    @property
    def initialized(self) -> bool:
        return self._core.initialized

    @property
    def params(self) -> dict[str, torch.Tensor]:
        return self._core.params

    @property
    def state_keys(self) -> dict[str, torch.Tensor]:
        return self._core.state

    @property
    def shadow(self) -> dict[str, torch.Tensor]:
        return self._core.params  # the replica is what every local worker holds

    @property
    def live(self) -> set[str]:
        return self._core.live

    @property
    def job_id(self) -> str:
        return self._core.job_id

    def adopt_job(self, job_id: str) -> None:
        self._core.job_id = job_id

    @property
    def numel(self) -> int:
        return sum(t.numel() for t in self.params.values())

    @property
    def step_started(self) -> bool:
        return bool(self._core.pending)

    def may_proceed(self, worker_id: str) -> bool:
        return True

    # --- set-up ---------------------------------------------------------------------------

    def initialize(
        self, tensors: dict[str, Payload], optimizer: dict[str, object], world_size: int = 1,
        model: dict[str, TensorInfo] | None = None, job_id: str = "",
    ) -> None:  # fmt: skip
        """A local rank 0's INIT: checked as the PS checks it (on a scratch core), then held for the
        relay to pass upstream; the site is initialized by the upstream's answer (`install`)."""
        if self.initialized or self.pending_init is not None:
            return
        StoreCore().initialize(tensors, optimizer, world_size, model, job_id)  # raises what the PS would
        self._core.optimizer_settings = OptimizerSettings.from_dict(dict(optimizer))
        self.model = dict(model or {})
        if job_id and not self._core.job_id:
            self._core.job_id = job_id
        self.pending_init = Init(tensors, dict(optimizer), world_size, dict(model or {}))

    def take_init(self) -> Init | None:
        init, self.pending_init = self.pending_init, None
        return init

    def install(self, params: Params) -> StepApplied | None:
        """The upstream's PARAMS: checked, written into the replica, kept for the local pulls.
        Returns the step it completes (None when the version did not move)."""
        core = self._core
        if not core.initialized:
            if not params.full:
                raise ProtocolError("version", "the upstream's first PARAMS must be full")
            self._first(params)
        elif not params.full and params.base_version != core.version:
            raise ProtocolError("version", f"upstream delta for version {params.base_version}, the relay is at {core.version}")
        elif params.gradient:
            self._step_mirror(params)
        else:
            decoded = {k: core.decode(k, p) for k, p in params.tensors.items()}
            unknown = [k for k in decoded if k not in core.params and k not in core.state]
            if unknown or (params.full and len(decoded) < len(core.params)):
                raise ProtocolError("keys", f"upstream PARAMS keys do not match the relay's ({unknown[:3]!r})")
            for key, value in decoded.items():
                if key in core.state:
                    core.state[key].copy_(value.to(core.state[key].dtype))
                elif params.full:
                    core.params[key].copy_(value)
                else:
                    core.params[key].add_(value.to(core.params[key].dtype))
        if params.full:
            self._take_optimizer(params)
        moved = params.version != core.version
        agg = self._flying
        self.update, self.in_flight, self.outgoing, self._flying = params, None, None, None
        core.version = params.version
        if moved:
            core.pending.clear()  # pushes of an older step: their workers resync on the new version
            self._step_fields.clear()
            core.applied_steps += 1
            self.applied_steps += 1
            return StepApplied(core.version, agg.workers if agg else (), agg.samples if agg else 0)
        return None

    def _take_optimizer(self, params: Params) -> None:
        """A full PARAMS: with a gradient-domain upstream, its optimizer over the replica's keys."""
        if not params.optimizer:
            self.mirror = None
            return
        core = self._core
        mirror = OptimizerMirror(params.optimizer)
        mirror.load(core.params, params.optim_state)
        self.mirror = mirror

    def _step_mirror(self, params: Params) -> None:
        """A gradient-domain update: the upstream's optimizer steps here on it, with the
        hyper-parameters the site's push carried (checked whole before anything changes)."""
        core, mirror, agg = self._core, self.mirror, self._flying
        if mirror is None:
            raise ProtocolError("version", "a gradient-domain update before the upstream's optimizer (a full PARAMS)")
        if params.sums:  # a relay does not keep its pushes (`Push.keeps`): a PS never forwards it any
            raise ProtocolError("malformed", "forwarded pushes sent to a relay, which keeps none of its own")
        grads = {k: core.decode(k, p) for k, p in params.tensors.items() if k in core.params}
        unknown = [k for k in params.tensors if k not in core.params and k not in core.state]
        if unknown:
            raise ProtocolError("keys", f"upstream PARAMS keys do not match the relay's ({unknown[:3]!r})")
        hparams = agg.hparams if agg is not None else {}
        for key, value in mirror.step(grads, {k: as_hyper(hparams[k]) if k in hparams else None for k in grads}).items():
            core.params[key].copy_(value)
        for key, payload in params.tensors.items():
            if key in core.state:
                core.state[key].copy_(core.decode(key, payload).to(core.state[key].dtype))

    def _first(self, params: Params) -> None:
        """Become the upstream's replica. Which keys are state keys (buffers) is told by INIT's
        model map when rank 0 is at this site; otherwise `split_state` settles it at the first push."""
        core = self._core
        tensors = {k: core.decode(k, p) for k, p in params.tensors.items()}
        state = {k for k, info in self.model.items() if info.buffer}
        core.params = {k: t.clone() for k, t in tensors.items() if k not in state}  # as the PS keeps them
        core.state = {k: t.clone() for k, t in tensors.items() if k in state}
        self._unsplit = not self.model
        log.info("relay replica: %d keys, version %d", len(tensors), params.version)

    def split_state(self, total_keys: int) -> None:
        """Without the model map, the first push tells how many keys are trainable: the PS lists the
        parameters first and the state keys after them in a full PARAMS (ps/store/encode.py,
        `lossless`), so the keys past `total_keys` are the state keys. Decided once: a local worker
        that lies in that first push cannot poison the model (the upstream checks the site's push
        again and refuses it, `keys`), but it stalls its site until the relay restarts; a relay
        that passes rank 0's INIT through knows the map and never guesses."""
        core = self._core
        if not self._unsplit or not 0 < total_keys < len(core.params):
            return
        for k in list(core.params)[total_keys:]:
            core.state[k] = core.params.pop(k)
        self._unsplit = False

    # --- membership -----------------------------------------------------------------------

    def join(self, worker_id: str) -> None:
        """A (re)joining worker redoes its step from the start."""
        self._core.live.add(worker_id)
        self._core.pending.pop(worker_id, None)

    def leave(self, worker_id: str) -> StepApplied | None:
        self._discard(worker_id)
        self._maybe_aggregate()
        return None

    def drop_incomplete(self) -> tuple[list[str], StepApplied | None]:
        """Barrier timeout: local workers that have not finished the step are dropped from it, as
        the PS drops them (ps/store/sync.py)."""
        core = self._core
        if not any(core.complete(w) for w in core.pending):
            return [], None
        dropped = [w for w in core.live if not core.complete(w)]
        core.start_quorum = 1
        for w in dropped:
            self._discard(w)
        self._maybe_aggregate()
        return dropped, None

    def _discard(self, worker_id: str) -> None:
        self._core.live.discard(worker_id)
        self._core.pending.pop(worker_id, None)

    # --- the step -------------------------------------------------------------------------

    def push(self, worker_id: str, msg: Push) -> StepApplied | None:
        """Check and record one local PUSH; the site step completes into `outgoing`."""
        if self.initialized:
            self.split_state(msg.total_keys)
        grads = self._core.check_push(worker_id, msg, older_ok=False)
        if self._refused is not None:
            self._refused[1].discard(worker_id)
        if self.in_flight == msg.step:
            # Its step is upstream already (a worker that reconnected re-pushes it, or one that
            # joined late): checked and ignored, as a PS ignores a late joiner of a pipelined step.
            return None
        self._core.live.add(worker_id)
        self._core.record(worker_id, msg, grads)
        for key, hyper in key_hparams(msg).items():
            self._step_fields.setdefault(key, dict(hyper))
        self._maybe_aggregate()
        return None

    def _maybe_aggregate(self) -> None:
        core = self._core
        if self.in_flight is not None or self.outgoing is not None:
            return
        ready = [w for w in core.pending if core.complete(w)]
        if not ready or any(not core.complete(w) for w in core.live):
            return
        if core.version == 0 and len(ready) < core.start_quorum:
            return  # the first step waits for the site's workers (or the barrier timeout)
        self.outgoing = self._aggregate(ready)
        self.in_flight = core.version
        core.pending.clear()
        self._step_fields = {}

    def _aggregate(self, ready: list[str]) -> Aggregate:
        core = self._core
        workers = core.contributing(ready)
        if not workers:
            return Aggregate(core.version, core.pending[ready[0]].samples, {}, {}, skip=True, workers=tuple(sorted(ready)))
        total = sum(core.pending[w].samples for w in workers)
        grads = {
            key: core._weighted_grad(key, [(core.pending[w].grads[key], core.pending[w].samples / total) for w in workers]).clone()
            for key in core.params
        }  # the PS's own sum, in its order (push order): one relay before a PS changes no bit
        pushed = {k for w in workers for k in core.pending[w].state}
        core.merge_state(workers)
        state = {k: v.clone() for k, v in core.state.items() if k in pushed}
        fields = {k: v for k, v in self._step_fields.items() if k in grads}
        return Aggregate(core.version, total, grads, state, fields, workers=tuple(sorted(ready)))

    def take(self) -> Aggregate | None:
        """The completed site step, once (the relay pushes it upstream)."""
        agg, self.outgoing = self.outgoing, None
        if agg is not None:
            self._flying = agg
        return agg

    def refuse_in_flight(self, workers: Iterable[str], reason: str) -> None:
        """The upstream refused the site's push: each local worker of it resyncs and pushes again
        (their pulls are answered `non-finite-update`, as the PS answers a refused update)."""
        self.in_flight = self.outgoing = self._flying = None
        self.refused_updates += 1
        self._refused = (self.version, set(workers), reason)
        log.warning("upstream refused the site's step %d: %s", self.version, reason)

    def refused(self, worker_id: str, step: int) -> str | None:
        r = self._refused
        if r is None or r[0] != step or self.version != step or worker_id not in r[1]:
            return None
        return r[2]

    # --- pulls ----------------------------------------------------------------------------

    def pull(self, have_version: int) -> Params:
        """The upstream's update when the worker holds its base (the same bytes, so every local
        replica equals the upstream's shadow), else the replica whole."""
        if not self.initialized:
            raise ProtocolError("not-initialized", "nothing to pull yet")
        last = self.update
        if last is not None and last.version == self.version and (last.full or last.base_version == have_version):
            return last
        return self.full_params()

    def full_params(self) -> Params:
        tensors = {k: self._fp32.encode(v) for k, v in {**self._core.params, **self._core.state}.items()}
        mirror = self.mirror
        if mirror is None or mirror.optimizer is None:
            return Params(self.version, True, tensors)
        keys = {k: mirror.params[k] for k in self._core.params if k in mirror.params}
        state = optimizer_state_payloads(mirror.optimizer, keys)
        return Params(self.version, True, tensors, optimizer=mirror.settings.to_dict(), optim_state=state)

    def want(self, keys: Iterable[str], step: int) -> int:
        """A keyed PULL: checked as the PS checks it; nothing runs ahead at a relay."""
        if not self.initialized:
            raise ProtocolError("not-initialized", "nothing to pull yet")
        unknown = [k for k in keys if k not in self.params]
        if unknown:
            raise ProtocolError("key", f"unknown keys {unknown[:3]!r} in a keyed PULL")
        return 0

    def keys_ready(self, keys: Iterable[str], version: int) -> bool:
        return self.initialized and self.version >= version

    def pull_keys(self, have_version: int, keys: Iterable[str]) -> Params:
        """`keys` of the upstream's update when it starts at `have_version`, else the replica whole."""
        last, keys = self.update, list(keys)
        if last is not None and last.version == self.version == have_version + 1 and (last.full or last.base_version == have_version):
            if all(k in last.tensors for k in keys):
                return replace(last, tensors={k: last.tensors[k] for k in keys})  # the same update, those keys
        return self.full_params()

    def state(self) -> dict[str, Any]:
        raise ProtocolError("relay", "a relay keeps no checkpoint: the upstream PS holds the job")
