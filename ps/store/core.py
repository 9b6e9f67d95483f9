"""What every mode of the store shares: parameters, optimizer, live workers and pending pushes.

A push is validated whole before anything changes (`check_push`), so a refused push leaves no
trace; its gradients, cast to the parameters' dtype and checked finite there, then wait in
`pending` until the mode applies them with the real torch.optim (`optimizer_step` for a whole step,
`apply_keys` for keys a pipelined step applies ahead), through the `StepGuard` (guard.py), which
refuses a step that would make parameters or optimizer state NaN/Inf.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field
from typing import Protocol

import torch

from netsense.compression import DTYPES, Codec, Payload, make_codec
from netsense.compression.base import DTYPE_NAMES, empty_dense
from netsense.errors import CompressionError, ProtocolError
from netsense.transport.wire import Params, Push

from ..optim import OptimizerSettings
from .guard import StepGuard


@dataclass
class Pending:
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


class Mode(Protocol):
    """When pending gradients apply: the sync barrier (sync.py) or SSP clocks (ssp.py). The store
    owns one and routes membership, pushes and full pulls to it."""

    max_staleness: int
    """Largest staleness of an applied gradient since start (0 in sync mode)."""

    def join(self, worker_id: str) -> None: ...

    def record(self, worker_id: str, msg: Push, grads: dict[str, torch.Tensor]) -> StepApplied | None:
        """Take a validated push's decoded gradients; apply whatever they complete."""
        ...

    def leave(self, worker_id: str) -> StepApplied | None: ...

    def drop_incomplete(self) -> tuple[list[str], StepApplied | None]: ...

    def may_proceed(self, worker_id: str) -> bool: ...

    @property
    def blocked(self) -> bool: ...

    def pull(self, have_version: int) -> Params: ...

    def reset(self) -> None:
        """Forget any step in progress (a restore)."""
        ...

    def abandon(self, worker_id: str) -> None:
        """An update that `worker_id`'s call triggered was refused (`UpdateRefused`; parameters and
        state are as before it): drop the pushes it would have applied."""
        ...


class StoreCore:
    """The state both modes act on. Plain attributes: the modes, the encoder's caller and the
    checkpoint code (state.py) read and write them directly."""

    def __init__(self) -> None:
        self.version = 0
        self.params: dict[str, torch.Tensor] = {}
        self.optimizer_settings: OptimizerSettings | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.live: set[str] = set()
        self.pending: dict[str, Pending] = {}
        self.clocks: dict[str, int] = {}
        """Worker -> its applied pushes (kept after it leaves, for a rejoin). Only async mode
        counts them (ssp.py), but checkpoints carry them whatever the mode."""
        self.applied_steps = 0
        self.start_quorum = 1
        self._decoders: dict[str, Codec] = {}
        self._grad_buffers: dict[str, torch.Tensor] = {}  # key -> reused gradient sum (`_weighted_grad`)
        self.guard = StepGuard()

    @property
    def initialized(self) -> bool:
        return bool(self.params)

    def initialize(self, tensors: dict[str, Payload], optimizer: dict[str, object], world_size: int) -> None:
        """Take rank 0's initial parameters and build the optimizer over them."""
        self.start_quorum = world_size
        settings = OptimizerSettings.from_dict(dict(optimizer))
        if not tensors:
            raise ProtocolError("malformed", "INIT carries no tensors")
        params = {}
        for key, payload in tensors.items():
            t = self.decode(key, payload).to(torch.float32)  # checked in the dtype it is kept in: 1e300 is Inf there
            if not torch.isfinite(t).all():
                raise ProtocolError("non-finite", f"initial value of {key!r} has NaN/Inf (as float32)")
            params[key] = t.clone()
        self.params = params
        self.guard.forget()
        self.optimizer_settings = settings
        self.optimizer = settings.build(list(self.params.values()))

    @property
    def min_live_clock(self) -> int | None:
        """Async mode: the slowest live worker's clock (None without live workers)."""
        return min((self.clocks.get(w, 0) for w in self.live), default=None)

    # --- a push ---------------------------------------------------------------------------

    def check_push(self, worker_id: str, msg: Push, *, older_ok: bool) -> dict[str, torch.Tensor]:
        """Validate a PUSH whole and return its decoded gradients; changes nothing. `older_ok`:
        a gradient may have been computed on any version up to the current one (async mode)."""
        if not self.initialized:
            raise ProtocolError("not-initialized", "the store has no parameters yet; rank 0 must send INIT first")
        if msg.step > self.version or (msg.step != self.version and not older_ok):
            raise ProtocolError("stale", f"push for step {msg.step} but the store is at version {self.version}; pull first")
        if msg.total_keys != len(self.params):
            raise ProtocolError("keys", f"worker counts {msg.total_keys} keys, the store has {len(self.params)}")
        pending = self.pending.get(worker_id)
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
            param = self.params[key]
            grad = self.decode(key, payload)
            if grad.shape != param.shape:
                raise ProtocolError("shape", f"key {key!r}: shape {tuple(grad.shape)} != {tuple(param.shape)}")
            # Checked in the dtype it is applied in: float64 1e300 is finite, and Inf once cast. A
            # narrower dtype (float16 into float32) cannot overflow there and stays as it came (half
            # the pending memory; `_weighted_grad` casts it).
            if torch.finfo(grad.dtype).max > torch.finfo(param.dtype).max:
                grad = grad.to(param.dtype)
            if not all_finite(grad):
                raise ProtocolError("non-finite", f"gradient of {key!r} has NaN/Inf (as {DTYPE_NAMES[param.dtype]}); rejected")
            decoded[key] = grad
        return decoded

    def record(self, worker_id: str, msg: Push, grads: dict[str, torch.Tensor], skip: Container[str] = ()) -> None:
        """Add a validated push to the worker's pending step; keys in `skip` (applied ahead) are
        dropped: a re-push after a rejoin."""
        pending = self.pending.get(worker_id)
        if pending is None:
            pending = self.pending[worker_id] = Pending(msg.samples, step=msg.step)
        pending.grads.update((k, g) for k, g in grads.items() if k not in skip)

    def complete(self, worker_id: str, ahead: int = 0) -> bool:
        """The worker has pushed every key of its step, but the `ahead` already applied."""
        p = self.pending.get(worker_id)
        return p is not None and len(p.grads) + ahead == len(self.params)

    # --- applying -------------------------------------------------------------------------

    def advance(self) -> None:
        """One more update applied: the version moves."""
        self.version += 1
        self.applied_steps += 1

    def optimizer_step(self, workers: list[str]) -> int:
        """One optimizer step on the sample-weighted mean of `workers`' gradients; their samples.
        Raises `UpdateRefused` (parameters and state unchanged) if the step would poison them."""
        total = sum(self.pending[w].samples for w in workers)
        assert self.optimizer is not None
        for key, param in self.params.items():
            param.grad = self._weighted_grad(key, [(self.pending[w].grads[key], self.pending[w].samples / total) for w in workers])
        try:
            self.guard.step(self.optimizer, self.params, self.params)
        finally:
            for param in self.params.values():
                param.grad = None
        return total

    def apply_keys(self, workers: tuple[str, ...], keys: list[str]) -> None:
        """Optimizer step of `keys` alone: parameters without a grad are skipped by torch.optim,
        and SGD, Adam and AdamW couple no keys, so this equals the keys' share of a whole step."""
        total = sum(self.pending[w].samples for w in workers)
        assert self.optimizer is not None
        for key in keys:
            terms = [(self.pending[w].grads.pop(key), self.pending[w].samples / total) for w in workers]
            self.params[key].grad = self._weighted_grad(key, terms)
        try:  # the step is not whole yet: a refusal of a later key undoes these too (`guard.commit`)
            self.guard.step(self.optimizer, self.params, keys, keep=True)
        finally:
            for key in keys:
                self.params[key].grad = None

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

    # --- decoding -------------------------------------------------------------------------

    def layout(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Key -> (shape, dtype name)."""
        return {k: (tuple(t.shape), DTYPE_NAMES[t.dtype]) for k, t in self.params.items()}

    def decode(self, key: str, payload: Payload) -> torch.Tensor:
        """A peer's payload as a tensor; any fault in it is the peer's (`ProtocolError`)."""
        if payload.dtype not in DTYPES:
            raise ProtocolError("dtype", f"key {key!r}: dtype {payload.dtype!r} not allowed")
        if self.initialized and payload.shape != tuple(self.params[key].shape):
            raise ProtocolError("shape", f"key {key!r}: shape {payload.shape} != {tuple(self.params[key].shape)}")
        try:
            return self._decoder(payload.codec).decode(payload)
        except CompressionError as exc:
            raise ProtocolError("bad-payload", f"key {key!r}: {exc}") from None

    def _decoder(self, spec: str) -> Codec:
        codec = self._decoders.get(spec)
        if codec is None:
            if len(self._decoders) >= 64:
                self._decoders.clear()  # bound the cache against peers cycling through specs
            codec = self._decoders[spec] = make_codec(spec)
        return codec


def all_finite(t: torch.Tensor) -> bool:
    """True if no element is NaN or Inf. A finite sum proves it in one pass without the bool
    temporary of `isfinite` (~55 ms vs ~2 ms on a 32 MB push); only a sum that overflows or is
    NaN takes the exact check."""
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())
