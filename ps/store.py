"""`ParameterStore`: the PS's authoritative state as a pure, synchronous state machine.

Inputs are plain calls (`initialize`, `join`, `push`, `leave`, `drop_incomplete`, `pull`); no
sockets, no event loop, no clock. A step is applied only when every live worker has pushed every
key, so nothing is ever half-applied: partial pushes of a worker that leaves are discarded whole.

Downlink (DESIGN.md §2): after each update the store encodes ``delta = params - shadow`` once,
adds the decoded delta to `shadow`, and hands the same payloads to every worker, so every replica
equals `shadow` bit for bit. With a lossless downlink codec it sends the parameters themselves.

Asynchronous mode (``staleness=s``, DESIGN.md §2, SSP): a worker's gradient is applied alone as
soon as that worker has pushed every key of its step (weighted by nothing but its own batch), each
application is one version. Each worker has a clock, the number of its applied pushes; `may_proceed`
says whether it is at most `s` ahead of the slowest live worker, and the server holds the worker's
PULL until it is. Pulls then return the full fp32 parameters at whatever version is current: no
per-worker shadows, so a worker can pick up any version (the downlink codec and policy do not
apply in this mode).

Pipelined steps (sync mode, workers with overlap): a worker that sends a keyed PULL for the
current step marks those keys wanted; a wanted key is applied as soon as every worker of the step
has pushed it (the optimizers are per parameter: SGD, Adam and AdamW couple no keys), and its
downlink payload is encoded at once, so the PS streams a step's first keys down while the last are
still coming up. The version still advances only when every key is applied. The step's workers are
fixed at its first applied key: one that joins later sits the step out (its pushes are ignored, its
pull gets the step's update); one that leaves (or is dropped at the barrier timeout) is left out of
the keys not yet applied, which are averaged over the workers that pushed them. Until the version
advances the new shadow values of applied keys are kept apart, so a full pull still returns the
previous version whole. Without keyed pulls nothing here runs and a step applies as described above.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from netsense.compression import DTYPES, Codec, Payload, make_codec
from netsense.compression.base import DTYPE_NAMES, empty_dense
from netsense.errors import CompressionError, ProtocolError
from netsense.transport.wire import Params, Push

from .optim import OptimizerSettings

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    """One worker's contribution to the current step, kept apart until the step applies."""

    samples: int
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    step: int = 0
    """Version the gradients were computed on (async mode: any version up to the current one)."""


@dataclass(frozen=True)
class StepApplied:
    """Returned by `push` when the push completed the barrier and an update was applied."""

    version: int
    """New version."""
    workers: tuple[str, ...]
    """Workers whose gradients made up the update."""
    samples: int
    """Samples in the update."""
    staleness: int = 0
    """Updates applied between the version the gradient was computed on and this one (async mode)."""


class ParameterStore:
    """Authoritative parameters, optimizer state, versions and the synchronous barrier."""

    def __init__(self, *, downlink_codec: str = "fp32", staleness: int | None = None) -> None:
        if staleness is not None and staleness < 0:
            raise ValueError(f"staleness must be >= 0 (or None for synchronous), got {staleness}")
        self.staleness = staleness
        """None: synchronous barrier (BSP); s: asynchronous, at most s versions ahead (SSP)."""
        self.clocks: dict[str, int] = {}
        """Async mode: worker -> its applied pushes (kept after it leaves, for a rejoin)."""
        self.max_staleness = 0
        """Largest staleness of an applied gradient since start (async mode)."""
        self.version = 0
        self.params: dict[str, torch.Tensor] = {}
        self.shadow: dict[str, torch.Tensor] = {}
        self.optimizer_settings: OptimizerSettings | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self.live: set[str] = set()
        self._pending: dict[str, _Pending] = {}
        self._decoders: dict[str, Codec] = {}
        self._grad_buffers: dict[str, torch.Tensor] = {}  # key -> reused gradient sum (`_weighted_grad`)
        self._downlink_spec = downlink_codec
        self._downlink = {}  # key -> encoder instance (stateful codecs keep per-key state)
        self._update_spec: str | None = None  # a downlink policy's choice, overrides the codec
        self._downlink_chosen: dict[tuple[str, str], Codec] = {}  # (key, spec) -> encoder
        self._last_update: Params | None = None
        self.last_encode: tuple[int, str, float] | None = None
        """(version, codec spec, seconds) of the last whole-step update encode: the downlink
        policy's measured encode cost of the level it chose (ps/downlink.py)."""
        self._applied: dict[str, Payload] = {}  # pipelined step: key -> downlink payload, ahead of the version
        self._next_shadow: dict[str, torch.Tensor] = {}  # pipelined step: shadow values once it completes
        self._members: tuple[str, ...] | None = None  # pipelined step: its workers, fixed at its first key
        self._wanted: set[str] = set()  # keys a keyed PULL waits for in the current step
        self._step_spec: str | None = None  # downlink codec of the pipelined step (fixed at its first key)
        self.applied_steps = 0
        self.start_quorum = 1
        self.rejected_messages = 0

    # --- set-up ---------------------------------------------------------------------------

    @property
    def initialized(self) -> bool:
        return bool(self.params)

    def initialize(self, tensors: dict[str, Payload], optimizer: dict[str, object], world_size: int = 1) -> None:
        """Take rank 0's initial parameters; ignored (not an error) if already initialized.

        The first update waits for `world_size` workers (or the barrier timeout): otherwise a
        worker that connects a moment after rank 0 would silently miss step 0.
        """
        if self.initialized:
            return
        self.start_quorum = world_size
        settings = OptimizerSettings.from_dict(dict(optimizer))
        if not tensors:
            raise ProtocolError("malformed", "INIT carries no tensors")
        params = {}
        for key, payload in tensors.items():
            t = self._decode(key, payload)
            if not torch.isfinite(t).all():
                raise ProtocolError("non-finite", f"initial value of {key!r} has NaN/Inf")
            params[key] = t.to(torch.float32).clone()
        self.params = params
        self.shadow = {k: v.clone() for k, v in params.items()}
        self.optimizer_settings = settings
        self._optimizer = settings.build(list(self.params.values()))
        self._downlink = {k: make_codec(self._downlink_spec) for k in params}
        log.info("store initialized: %d keys, %d elements, optimizer %s", len(params), self.numel, settings.name)

    @property
    def numel(self) -> int:
        return sum(t.numel() for t in self.params.values())

    def layout(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Key -> (shape, dtype name)."""
        return {k: (tuple(t.shape), DTYPE_NAMES[t.dtype]) for k, t in self.params.items()}

    # --- membership -----------------------------------------------------------------------

    def join(self, worker_id: str) -> None:
        """Add a worker to the barrier (a rejoin after a crash is a join).

        A rejoining worker redoes its step from the start, so a partial push of its old
        connection is discarded (its re-push would otherwise be refused as a duplicate)."""
        self._enter(worker_id)
        pending = self._pending.get(worker_id)
        if pending is not None and self._members is not None and worker_id in self._members:
            pending.grads.clear()  # its re-push fills the keys not yet applied; applied ones keep its share
        else:
            self._pending.pop(worker_id, None)

    def _enter(self, worker_id: str) -> None:
        """Make a worker live; in async mode its clock starts at (or is raised to) the slowest live
        worker's, so a newcomer or a returning worker never holds back the others."""
        if self.asynchronous and worker_id not in self.live:
            floor = self.min_live_clock
            self.clocks[worker_id] = max(self.clocks.get(worker_id, 0), floor if floor is not None else 0)
        self.live.add(worker_id)

    @property
    def asynchronous(self) -> bool:
        return self.staleness is not None

    @property
    def min_live_clock(self) -> int | None:
        """Async mode: the slowest live worker's clock (None without live workers)."""
        return min((self.clocks.get(w, 0) for w in self.live), default=None)

    def may_proceed(self, worker_id: str) -> bool:
        """SSP rule: a worker with clock c may start its next step iff ``c - min_live_clock <= s``
        (always true in sync mode, and for a worker that is not live: its next push re-enters it)."""
        if self.staleness is None or worker_id not in self.live:
            return True
        floor = self.min_live_clock
        return floor is None or self.clocks.get(worker_id, 0) - floor <= self.staleness

    @property
    def blocked(self) -> bool:
        """Async mode: some live worker is more than `staleness` ahead of the slowest one."""
        return self.staleness is not None and any(not self.may_proceed(w) for w in self.live)

    def leave(self, worker_id: str) -> StepApplied | None:
        """Remove a worker and discard its partial step; may complete the barrier for the rest."""
        self._discard(worker_id)
        self._apply_wanted()
        return self._maybe_apply()

    def _apply_wanted(self) -> None:
        """After the step lost a worker: wanted keys that everyone left has pushed can go now."""
        if self._wanted and not self.asynchronous:
            self._apply_ready(sorted(self._wanted))

    def _discard(self, worker_id: str) -> None:
        """Out of the live set and out of the current step."""
        self.live.discard(worker_id)
        self._pending.pop(worker_id, None)
        if self._members is not None and worker_id in self._members:
            self._members = tuple(w for w in self._members if w != worker_id) or None

    def drop_incomplete(self) -> tuple[list[str], StepApplied | None]:
        """Barrier timeout: remove live workers that have not finished the current step.

        Async mode: remove the slowest live workers, if they hold back another one (SSP wait)."""
        if self.asynchronous:
            if not self.blocked:
                return [], None
            floor = self.min_live_clock
            dropped = [w for w in self.live if self.clocks.get(w, 0) == floor]
            for w in dropped:
                self.live.discard(w)
                self._pending.pop(w, None)
            return dropped, None
        if not any(self._complete(w) for w in self._pending):
            return [], None
        step_workers = self._members if self._members is not None else self.live  # a late joiner sits a pipelined step out
        dropped = [w for w in step_workers if not self._complete(w)]
        self.start_quorum = 1  # the timeout also ends the wait for workers that never came
        for w in dropped:
            self._discard(w)
        self._apply_wanted()
        return dropped, self._maybe_apply()

    @property
    def step_started(self) -> bool:
        """True once any worker pushed for the current version."""
        return bool(self._pending)

    # --- the step -------------------------------------------------------------------------

    def push(self, worker_id: str, msg: Push) -> StepApplied | None:
        """Validate and record one PUSH; apply the update if it completes the barrier."""
        if not self.initialized:
            raise ProtocolError("not-initialized", "the store has no parameters yet; rank 0 must send INIT first")
        if msg.step > self.version or (msg.step != self.version and not self.asynchronous):
            raise ProtocolError("stale", f"push for step {msg.step} but the store is at version {self.version}; pull first")
        if msg.total_keys != len(self.params):
            raise ProtocolError("keys", f"worker counts {msg.total_keys} keys, the store has {len(self.params)}")
        pending = self._pending.get(worker_id)
        if pending is not None and (pending.samples, pending.step) != (msg.samples, msg.step):
            raise ProtocolError(
                "malformed",
                f"samples/step changed within a step: ({pending.samples}, {pending.step}) -> ({msg.samples}, {msg.step})",
            )
        decoded = {}
        for key, payload in msg.grads.items():
            if key not in self.params:
                raise ProtocolError("key", f"unknown key {key!r}")
            if pending is not None and key in pending.grads:
                raise ProtocolError("duplicate", f"key {key!r} already pushed for step {msg.step}")
            grad = self._decode(key, payload)
            if grad.shape != self.params[key].shape:
                raise ProtocolError("shape", f"key {key!r}: shape {tuple(grad.shape)} != {tuple(self.params[key].shape)}")
            if not all_finite(grad):
                raise ProtocolError("non-finite", f"gradient of {key!r} has NaN/Inf; rejected")
            decoded[key] = grad
        # Validation passed for every key: only now does anything change.
        if self._members is not None and worker_id not in self._members:
            return None  # joined after this pipelined step's first key: it sits the step out
        self._enter(worker_id)
        if pending is None:
            pending = self._pending[worker_id] = _Pending(msg.samples, step=msg.step)
        pending.grads.update((k, g) for k, g in decoded.items() if k not in self._applied)  # a re-push after a rejoin
        if self.asynchronous:
            return self._apply_one(worker_id) if self._complete(worker_id) else None
        if self._wanted:
            self._apply_ready(decoded)
        return self._maybe_apply()

    def _complete(self, worker_id: str) -> bool:
        p = self._pending.get(worker_id)
        return p is not None and len(p.grads) + len(self._applied) == len(self.params)

    def _maybe_apply(self) -> StepApplied | None:
        if self.asynchronous:
            return None  # each push applies on its own (`_apply_one`); nothing waits for a barrier
        if self._applied:
            return self._finish_pipelined()
        ready = [w for w in self._pending if self._complete(w)]
        if not ready or any(not self._complete(w) for w in self.live):
            return None
        if self.version == 0 and len(ready) < self.start_quorum:
            return None  # the first step waits for the whole job (see `initialize`)
        total = self._optimizer_step(ready)
        base = self.version
        self.version += 1
        self.applied_steps += 1
        self._reset_step()  # `_wanted` too: keys wanted but never applied ahead
        t0 = time.perf_counter()
        self._last_update = self._encode_update(base)
        self.last_encode = (self.version, self._update_spec or self._downlink_spec, time.perf_counter() - t0)
        return StepApplied(self.version, tuple(sorted(ready)), total)

    def _apply_one(self, worker_id: str) -> StepApplied:
        """Async mode: apply one worker's complete gradient alone; its clock advances."""
        staleness = self.version - self._pending[worker_id].step
        samples = self._optimizer_step([worker_id])
        del self._pending[worker_id]
        self.version += 1
        self.applied_steps += 1
        self.clocks[worker_id] = self.clocks.get(worker_id, 0) + 1
        self.max_staleness = max(self.max_staleness, staleness)
        self._last_update = None  # pulls send the full parameters (see `pull`)
        return StepApplied(self.version, (worker_id,), samples, staleness)

    def _optimizer_step(self, workers: list[str]) -> int:
        """One optimizer step on the sample-weighted mean of `workers`' gradients; their samples."""
        total = sum(self._pending[w].samples for w in workers)
        assert self._optimizer is not None
        for key, param in self.params.items():
            param.grad = self._weighted_grad(key, [(self._pending[w].grads[key], self._pending[w].samples / total) for w in workers])
        self._optimizer.step()
        for param in self.params.values():
            param.grad = None
        return total

    # --- pipelined steps (keyed pulls) ------------------------------------------------------

    @property
    def applied_keys(self) -> int:
        """Keys of the current step applied ahead of the version (pipelined steps)."""
        return len(self._applied)

    def want(self, keys: Iterable[str], step: int) -> int:
        """A keyed PULL waits for `keys` of the update from version `step`: apply those that every
        worker of the step has pushed; returns how many were applied now."""
        if not self.initialized:
            raise ProtocolError("not-initialized", "nothing to pull yet")
        keys = list(keys)
        unknown = [k for k in keys if k not in self.params]
        if unknown:
            raise ProtocolError("key", f"unknown keys {unknown[:3]!r} in a keyed PULL")
        if self.asynchronous:
            raise ProtocolError("keys", "a keyed PULL needs a synchronous PS; this one is asynchronous (staleness set)")
        if step != self.version:
            return 0  # an old step (its update is whole by now) or a future one (the push is refused as stale)
        self._wanted.update(keys)
        return self._apply_ready(keys)

    def keys_ready(self, keys: Iterable[str], version: int) -> bool:
        """True once a keyed pull for `keys` at `version` can be answered."""
        return self.version >= version or (self.version == version - 1 and all(k in self._applied for k in keys))

    def pull_keys(self, have_version: int, keys: Iterable[str]) -> Params:
        """The update of `keys` from `have_version` to the next version, as soon as they are
        applied; the full parameters (every key) when no such update exists."""
        keys = list(keys)
        if self.version == have_version and all(k in self._applied for k in keys):
            full = self._step_spec in ("fp32", "none")
            base = -1 if full else self.version
            return Params(self.version + 1, full, {k: self._applied[k] for k in keys}, base_version=base)
        last = self._last_update
        if last is not None and last.version == self.version == have_version + 1 and (last.full or last.base_version == have_version):
            return Params(last.version, last.full, {k: last.tensors[k] for k in keys}, base_version=last.base_version)
        return self.full_params()

    def _step_workers(self) -> tuple[str, ...]:
        """Whose gradients make up the current step: its fixed workers, or (before its first key)
        every live worker once each has pushed something; () while one has not."""
        if self._members is not None:
            return self._members
        if not self.live or any(w not in self._pending for w in self.live):
            return ()
        return tuple(self._pending)  # push order, as the plain step sums them

    def _apply_ready(self, keys: Iterable[str]) -> int:
        """Apply the wanted keys among `keys` that every worker of the step has pushed."""
        workers = self._step_workers()
        if not workers or (self.version == 0 and self._members is None and len(workers) < self.start_quorum):
            return 0
        ready = [
            k for k in dict.fromkeys(keys)
            if k in self._wanted and k not in self._applied and all(k in self._pending[w].grads for w in workers)
        ]  # fmt: skip
        if ready:
            self._members = workers
            if self._step_spec is None:
                self._step_spec = self._update_spec or self._downlink_spec
            self._apply_keys(workers, ready)
        return len(ready)

    def _apply_keys(self, workers: tuple[str, ...], keys: list[str]) -> None:
        """Optimizer step of `keys` alone (parameters without a grad are skipped by torch.optim),
        then their downlink payloads; the new shadow values wait for the version."""
        total = sum(self._pending[w].samples for w in workers)
        assert self._optimizer is not None and self._step_spec is not None
        for key in keys:
            terms = [(self._pending[w].grads.pop(key), self._pending[w].samples / total) for w in workers]
            self.params[key].grad = self._weighted_grad(key, terms)
        self._optimizer.step()
        for key in keys:
            self.params[key].grad = None
            self._applied[key], self._next_shadow[key] = self._encode_key(key, self._step_spec)

    def _weighted_grad(self, key: str, terms: list[tuple[torch.Tensor, float]]) -> torch.Tensor:
        """sum(weight * grad) in this key's gradient buffer, kept from step to step: the first term
        writes it (no zero-fill) and its pages are touched once per job, not per step (a fresh
        32 MB `zeros_like` took 8-89 ms here, mostly page faults, on a ~0.5 s PUSH)."""
        param = self.params[key]
        buf = self._grad_buffers.get(key)
        if buf is None or buf.shape != param.shape or buf.dtype != param.dtype:
            buf = self._grad_buffers[key] = empty_dense(param.numel(), param.dtype, param.device).view(param.shape)
        (first, weight), rest = terms[0], terms[1:]
        torch.mul(first.to(param.dtype), weight, out=buf)
        for grad, weight in rest:
            buf.add_(grad.to(param.dtype), alpha=weight)
        return buf

    def _encode_key(self, key: str, spec: str) -> tuple[Payload, torch.Tensor]:
        """One key's downlink payload and the shadow value it leaves (as `_encode_update`)."""
        param = self.params[key]
        if spec in ("fp32", "none"):
            value = param.detach().clone()
            return self._decoder("fp32").encode(value), value
        codec = self._downlink[key] if spec == self._downlink_spec else self._chosen_codec(key, spec)
        payload = codec.encode(param - self.shadow[key])
        return payload, self.shadow[key] + codec.decode(payload).to(param.dtype)

    def _finish_pipelined(self) -> StepApplied | None:
        """Apply the keys no pull wanted and advance the version, once every worker of the step has
        pushed every key."""
        workers = self._step_workers()
        if not workers or any(not self._complete(w) for w in workers):
            return None
        self._members = workers
        rest = [k for k in self.params if k not in self._applied]
        if rest:
            self._apply_keys(workers, rest)
        total = sum(self._pending[w].samples for w in workers)
        full = self._step_spec in ("fp32", "none")
        base = self.version
        self.version += 1
        self.applied_steps += 1
        self.shadow.update(self._next_shadow)
        tensors = {k: self._applied[k] for k in self.params}
        self._last_update = Params(self.version, full, tensors, base_version=-1 if full else base)
        self._reset_step()
        return StepApplied(self.version, tuple(sorted(workers)), total)

    def _reset_step(self) -> None:
        self._pending.clear()
        self._applied, self._next_shadow, self._wanted = {}, {}, set()
        self._members = self._step_spec = None

    # --- downlink -------------------------------------------------------------------------

    def set_downlink(self, spec: str | None) -> None:
        """Codec of the next updates (a downlink policy's choice, per update); None: back to the
        configured `downlink_codec`. Replicas still equal the shadow bit for bit: the shadow
        follows whatever was sent, and a lossless choice sends the parameters themselves."""
        if spec is not None:
            make_codec(spec)  # a bad spec fails here, not half way through an update
        self._update_spec = spec

    def _encode_update(self, base: int) -> Params:
        spec = self._update_spec or self._downlink_spec
        if spec in ("fp32", "none"):
            for key, param in self.params.items():  # in place: a fresh 32 MB clone cost 8-13 ms per step here
                old = self.shadow.get(key)
                if old is not None and old.shape == param.shape and old.dtype == param.dtype:
                    old.copy_(param)
                else:
                    self.shadow[key] = param.detach().clone()
            return self.full_params()
        tensors = {}
        for key, param in self.params.items():
            codec = self._downlink[key] if spec == self._downlink_spec else self._chosen_codec(key, spec)
            payload = codec.encode(param - self.shadow[key])
            self.shadow[key] += codec.decode(payload).to(param.dtype)
            tensors[key] = payload
        return Params(self.version, False, tensors, base_version=base)

    def full_params(self) -> Params:
        """The replica every worker must hold (the shadow), lossless."""
        fp32 = self._decoder("fp32")
        return Params(self.version, True, {k: fp32.encode(v) for k, v in self.shadow.items()})

    def pull(self, have_version: int) -> Params:
        """What a worker at `have_version` needs to reach the current version."""
        if not self.initialized:
            raise ProtocolError("not-initialized", "nothing to pull yet")
        if self.asynchronous:
            # Workers hold different versions: a delta would need a shadow per worker. The full
            # fp32 parameters fit any replica, and are what the SSP analysis assumes.
            fp32 = self._decoder("fp32")
            return Params(self.version, True, {k: fp32.encode(v) for k, v in self.params.items()})
        last = self._last_update
        if last is not None and last.version == self.version and have_version == last.base_version and not last.full:
            return last
        if last is not None and last.version == self.version and last.full:
            return last
        return self.full_params()

    # --- checkpoints (ps/checkpoint.py writes them) ----------------------------------------

    def state(self) -> dict[str, object]:
        """A snapshot of everything a restart needs, as plain containers of copied tensors.

        Taken between steps it never holds a partial step (pending pushes are not part of it:
        workers re-push after they reconnect). Safe to serialise on another thread.
        """
        if not self.initialized:
            raise ProtocolError("not-initialized", "nothing to checkpoint before INIT")
        if self._applied:
            raise ProtocolError("mid-step", f"{len(self._applied)} keys of step {self.version} are applied ahead; checkpoint between steps")
        assert self._optimizer is not None and self.optimizer_settings is not None
        return {
            "format": 1,
            "version": self.version,
            "applied_steps": self.applied_steps,
            "params": {k: v.detach().clone() for k, v in self.params.items()},
            "shadow": {k: v.clone() for k, v in self.shadow.items()},
            "optimizer_settings": self.optimizer_settings.to_dict(),
            "optimizer_state": _clone_tree(self._optimizer.state_dict()),
            "live": sorted(self.live),
            "clocks": dict(self.clocks),
            "downlink_codec": self._downlink_spec,
        }

    def restore(self, state: dict[str, object]) -> None:
        """Become the store that `state()` described (fresh store only).

        Stateful downlink encoders restart empty; workers pull the full shadow after a restart.
        """
        if self.initialized:
            raise ProtocolError("initialized", "restore needs a fresh store")
        if state.get("format") != 1:
            raise ProtocolError("checkpoint", f"unknown checkpoint format {state.get('format')!r}")
        params = {str(k): v.to(torch.float32).clone() for k, v in dict(state["params"]).items()}  # type: ignore[call-overload]
        settings = OptimizerSettings.from_dict(dict(state["optimizer_settings"]))  # type: ignore[call-overload]
        self.params = params
        self.shadow = {str(k): v.clone() for k, v in dict(state["shadow"]).items()}  # type: ignore[call-overload]
        self.optimizer_settings = settings
        self._optimizer = settings.build(list(params.values()))
        self._optimizer.load_state_dict(state["optimizer_state"])  # type: ignore[arg-type]
        self.version = int(state["version"])  # type: ignore[call-overload]
        self.applied_steps = int(state["applied_steps"])  # type: ignore[call-overload]
        self.live = set(state["live"])  # type: ignore[call-overload]
        self.clocks = {str(k): int(v) for k, v in dict(state.get("clocks", {})).items()}  # type: ignore[call-overload]
        self._downlink_spec = str(state.get("downlink_codec", self._downlink_spec))
        self._downlink = {k: make_codec(self._downlink_spec) for k in params}
        self._reset_step()
        self._last_update = None
        log.info("store restored at version %d (%d keys, %d live workers)", self.version, len(params), len(self.live))

    # --- helpers --------------------------------------------------------------------------

    def _chosen_codec(self, key: str, spec: str) -> Codec:
        """Per-key encoder of a policy-chosen downlink spec (stateful codecs keep per-key state)."""
        codec = self._downlink_chosen.get((key, spec))
        if codec is None:
            codec = self._downlink_chosen[(key, spec)] = make_codec(spec)
        return codec

    def _decoder(self, spec: str) -> Codec:
        codec = self._decoders.get(spec)
        if codec is None:
            if len(self._decoders) >= 64:
                self._decoders.clear()  # bound the cache against peers cycling through specs
            codec = self._decoders[spec] = make_codec(spec)
        return codec

    def _decode(self, key: str, payload: Payload) -> torch.Tensor:
        if payload.dtype not in DTYPES:
            raise ProtocolError("dtype", f"key {key!r}: dtype {payload.dtype!r} not allowed")
        if self.initialized and payload.shape != tuple(self.params[key].shape):
            raise ProtocolError("shape", f"key {key!r}: shape {payload.shape} != {tuple(self.params[key].shape)}")
        try:
            return self._decoder(payload.codec).decode(payload)
        except CompressionError as exc:
            raise ProtocolError("bad-payload", f"key {key!r}: {exc}") from None


def all_finite(t: torch.Tensor) -> bool:
    """True if no element is NaN or Inf. A finite sum proves it in one pass without the bool
    temporary of `isfinite` (~55 ms vs ~2 ms on a 32 MB push); only a sum that overflows or is
    NaN takes the exact check."""
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def _clone_tree(value: object) -> object:
    """Deep-copy the tensors of a (nested) state dict, so a snapshot does not alias live state."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _clone_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_clone_tree(v) for v in value)
    return value
