"""What every mode of the store shares: parameters, optimizer, live workers and pending pushes.

A push is validated whole before anything changes (`check_push`), so a refused push leaves no
trace; its gradients, cast to the parameters' dtype and checked finite there, then wait in
`pending` until the mode applies them with the real torch.optim (`optimizer_step` for a whole step,
`apply_keys` for keys a pipelined step applies ahead), through the `StepGuard` (guard.py), which
refuses a step that would make parameters or optimizer state NaN/Inf,
with the step's hyper-parameters from the pushes (`check_step_fields`) and, if set, global-norm clipping.
State keys (the model's buffers, named in INIT's `model` map) are kept apart in `state`: a push
carries their values, and each applied step sets them to the sample-weighted mean of its workers'
values (integers: the largest), never through the optimizer (docs/ARCHITECTURE.md, "Model buffers").
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field
from typing import Protocol

import torch

from netsense.compression import DTYPES, Codec, Payload, make_codec
from netsense.compression.base import DTYPE_NAMES, empty_dense
from netsense.compression.limits import all_finite
from netsense.errors import CompressionError, ProtocolError
from netsense.transport.hparams import check_allowed
from netsense.transport.aggregate import weighted_sum
from netsense.transport.wire import MAX_INTENTS, MAX_SUM_TERMS, Params, Push, TensorInfo

from ..optim import Hyper, OptimizerSettings, as_hyper
from .gradient import GradientDownlink
from .guard import StepGuard


@dataclass
class Pending:
    """One worker's contribution to the current step, kept apart until the step applies."""

    samples: int
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    """State keys' values (buffers) the worker pushed with this step."""
    step: int = 0
    """Version the gradients were computed on (async mode: any version up to the current one)."""
    skipped: bool = False
    """The worker sits the step out (a skip PUSH: its AMP scaler found Inf/NaN): done, no gradient."""
    hparams: dict[str, Hyper] = field(default_factory=dict)
    """Key -> the hyper-parameters its pushes carried for this step (none: the PS's settings)."""
    specs: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Key -> (wire bytes, codec) its gradient came in (a gradient-domain downlink sends the key's
    update at the smallest of its workers': gradient.py)."""
    keeps: bool = False
    """The worker keeps its pushes until the update (`Push.keeps`): it may be sent the others'."""
    payloads: dict[str, Payload] = field(default_factory=dict)
    """Key -> the payload it came in, kept where the step may forward it (gradient domain, `keeps`)."""
    intent: str = ""
    """The level its policy is heading for (`Push.intent`; empty: none said), handed to the others."""


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
        """Workers a step waits for while `gathering`: the job's world size (INIT), 1 once a barrier
        timeout gave up on the rest."""
        self.world_size = 1
        """The job's world size, from INIT (1 for a PS restored from a checkpoint)."""
        self.gathering = True
        """The next step waits for `start_quorum` workers: the job's first step, and the first after
        every worker left (a whole-job restart against a running PS, `regather`)."""
        self.last_quorum = 0
        """Workers in the last applied synchronous step (0: none yet)."""
        self.state: dict[str, torch.Tensor] = {}
        """State keys (buffers, frozen parameters) -> value, in its wire dtype."""
        self.model: dict[str, TensorInfo] = {}
        """Key -> its place in the model's state_dict (INIT's `model`; empty from an older worker)."""
        self.job_id = ""
        """The job this state belongs to (rank 0's HELLO at INIT; empty: unknown)."""
        self._decoders: dict[str, Codec] = {}
        self._grad_buffers: dict[str, torch.Tensor] = {}  # key -> reused gradient sum (`_weighted_grad`)
        self.guard = StepGuard()
        self.gradient: GradientDownlink | None = None
        """Set: the downlink is in the gradient domain (gradient.py): each step's aggregated
        gradient is compressed before the optimizer steps on it."""

    @property
    def initialized(self) -> bool:
        return bool(self.params)

    def initialize(
        self, tensors: dict[str, Payload], optimizer: dict[str, object], world_size: int,
        model: dict[str, TensorInfo] | None = None, job_id: str = "",
    ) -> None:  # fmt: skip
        """Take rank 0's initial parameters (and state keys) and build the optimizer over them."""
        self.start_quorum = self.world_size = world_size
        settings = OptimizerSettings.from_dict(dict(optimizer))
        model = dict(model or {})
        if not tensors:
            raise ProtocolError("malformed", "INIT carries no tensors")
        params, state = {}, {}
        for key, payload in tensors.items():
            info = model.get(key)
            buffer = info is not None and info.buffer
            # Checked in the dtype it is kept in (1e300 is Inf in float32): parameters are float32,
            # state keys keep their own dtype (integer buffers travel as float64).
            t = self.decode(key, payload)
            t = t if buffer else t.to(torch.float32)
            if not torch.isfinite(t).all():
                raise ProtocolError("non-finite", f"initial value of {key!r} has NaN/Inf (as {t.dtype})")
            if buffer:
                if payload.codec != "fp32":
                    raise ProtocolError("bad-payload", f"state key {key!r} must be sent lossless (fp32), got {payload.codec!r}")
                state[key] = t.clone()
            else:
                params[key] = t.clone()
        if not params:
            raise ProtocolError("malformed", "INIT carries no trainable parameters")
        self.params, self.state, self.model, self.job_id = params, state, model, job_id
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
            if key in self.state:
                decoded[key] = self._check_state(key, payload, pending)
                continue
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
        self.check_step_fields(worker_id, msg, agree=not older_ok)
        return decoded

    def check_step_fields(self, worker_id: str, msg: Push, *, agree: bool) -> None:
        """A push's skip flag and hyper-parameters, validated against the optimizer (and, with
        `agree`, the sync step's other workers: a step has one set per key, so two workers whose
        schedules differ are a misconfiguration, refused with code ``hparams``)."""
        pending = self.pending.get(worker_id)
        if pending is not None and (msg.skip or pending.skipped) and (msg.grads or pending.grads or msg.skip != pending.skipped):
            raise ProtocolError("malformed", f"step {msg.step}: a skip PUSH must be the worker's only push of the step")
        assert self.optimizer_settings is not None
        for group in msg.hparams:
            check_allowed(self.optimizer_settings.name, group)
        if not agree:
            return
        for key, hyper in key_hparams(msg).items():
            for other, p in self.pending.items():
                theirs = p.hparams.get(key)
                if other != worker_id and theirs is not None and theirs != hyper:
                    raise ProtocolError(
                        "hparams", f"key {key!r}: hyper-parameters {dict(hyper)} differ from {other!r}'s {dict(theirs)} in step {msg.step}"
                    )

    def _check_state(self, key: str, payload: Payload, pending: Pending | None) -> torch.Tensor:
        """A pushed state key's value: lossless, the stored dtype, finite, once per step."""
        if pending is not None and key in pending.state:
            raise ProtocolError("duplicate", f"state key {key!r} already pushed for this step")
        if payload.codec != "fp32":
            raise ProtocolError("bad-payload", f"state key {key!r} must be pushed lossless (fp32), got {payload.codec!r}")
        value = self.decode(key, payload)
        if value.dtype != self.state[key].dtype:
            raise ProtocolError("dtype", f"state key {key!r}: dtype {payload.dtype} != {self.state[key].dtype}")
        if not all_finite(value):
            raise ProtocolError("non-finite", f"state key {key!r} has NaN/Inf; rejected")
        return value

    def record(self, worker_id: str, msg: Push, grads: dict[str, torch.Tensor], skip: Container[str] = ()) -> None:
        """Add a validated push to the worker's pending step; keys in `skip` (applied ahead) are
        dropped: a re-push after a rejoin."""
        pending = self.pending.get(worker_id)
        if pending is None:
            pending = self.pending[worker_id] = Pending(msg.samples, step=msg.step, skipped=msg.skip)
        pending.grads.update((k, g) for k, g in grads.items() if k not in skip and k not in self.state)
        pending.specs.update((k, (p.wire_size, p.codec)) for k, p in msg.grads.items() if k not in skip and k not in self.state)
        pending.keeps = msg.keeps
        pending.intent = msg.intent or pending.intent
        if msg.keeps and self.gradient is not None:
            pending.payloads.update((k, p) for k, p in msg.grads.items() if k not in skip and k not in self.state)
        pending.state.update((k, g) for k, g in grads.items() if k in self.state)
        pending.hparams.update(key_hparams(msg))

    def complete(self, worker_id: str, ahead: int = 0) -> bool:
        """The worker has pushed every key of its step, but the `ahead` already applied."""
        p = self.pending.get(worker_id)
        return p is not None and (p.skipped or len(p.grads) + ahead == len(self.params))

    def contributing(self, workers: tuple[str, ...] | list[str]) -> list[str]:
        """The `workers` whose gradients make up the step (not those that sent a skip PUSH), in
        worker-id order: the weighted sum is not commutative bit for bit (fused multiply-add), so
        summing in arrival order made two runs of one job, or a pipelined and a plain step, differ."""
        return [w for w in sorted(workers) if not self.pending[w].skipped]

    # --- applying -------------------------------------------------------------------------

    def advance(self) -> None:
        """One more update applied: the version moves."""
        self.version += 1
        self.applied_steps += 1
        self.gathering = False

    def regather(self) -> None:
        """Every worker left: the next step waits for as many workers as the last step had (the
        world size before any step), or the barrier timeout, as the first step does. Without it the
        first worker of a restarted job to reconnect stepped alone, and the others' first pushes,
        one version late with the learning rate of the step before, were refused (seen under load:
        tests/e2e/test_gradient_downlink.py). The last step's count, not the world size: a job that
        lost a worker for good and whose survivor reconnects goes on at once."""
        self.gathering = True
        self.start_quorum = self.last_quorum or self.world_size

    def optimizer_step(self, workers: list[str]) -> int:
        """One optimizer step on the sample-weighted mean of `workers`' gradients (those that sent
        one), clipped if the settings say so; their samples. Nobody's gradient: no step at all.
        Raises `UpdateRefused` (parameters and state unchanged) if the step would poison them."""
        workers = self.contributing(workers)
        total = sum(self.pending[w].samples for w in workers)
        assert self.optimizer is not None and self.optimizer_settings is not None
        if not workers:
            return 0
        weights = self.weights(workers)
        for key, param in self.params.items():
            param.grad = self._weighted_grad(key, [(self.pending[w].grads[key], c) for w, c in zip(workers, weights)])
        self.optimizer_settings.clip(list(self.params.values()))
        self._compress(list(self.params), workers)
        self._step(list(self.params), workers)
        self.merge_state(workers)
        return total

    def merge_state(self, workers: list[str] | tuple[str, ...]) -> None:
        """Set each state key to the sample-weighted mean of what `workers` pushed (integer and bool
        keys: the largest, so counters stay whole); a key nobody pushed keeps its value."""
        for key, value in self.state.items():
            terms = [(self.pending[w].state[key], self.pending[w].samples) for w in sorted(workers) if key in self.pending[w].state]
            if not terms:
                continue
            info = self.model.get(key)
            if info is not None and not info.dtype.startswith(("float", "bfloat")):
                value.copy_(torch.stack([t for t, _ in terms]).amax(dim=0))
                continue
            total = sum(n for _, n in terms)
            mean = sum(t.to(torch.float64) * (n / total) for t, n in terms)
            value.copy_(mean)

    def apply_keys(self, workers: tuple[str, ...], keys: list[str]) -> None:
        """Optimizer step of `keys` alone: parameters without a grad are skipped by torch.optim,
        and SGD, Adam and AdamW couple no keys, so this equals the keys' share of a whole step.
        (Clipping couples every key, so a clipping PS never applies keys ahead: pipeline.py.)"""
        contributing = self.contributing(workers)
        weights = self.weights(contributing)
        assert self.optimizer is not None
        for key in keys:
            terms = [(self.pending[w].grads.pop(key), c) for w, c in zip(contributing, weights)]
            if terms:
                self.params[key].grad = self._weighted_grad(key, terms)
        if contributing:
            self._compress([k for k in keys if self.params[k].grad is not None], contributing)
            # the step is not whole yet: a refusal of a later key undoes these too (`guard.commit`)
            self._step(keys, contributing, keep=True)

    def weights(self, workers: list[str]) -> list[float]:
        """Each of the contributing `workers`' weight in the step's mean, its samples over theirs:
        one computation for the PS's sum and the weights a forwarded update carries, which every
        worker's sum must match bit for bit."""
        total = sum(self.pending[w].samples for w in workers)
        return [self.pending[w].samples / total for w in workers]

    def _compress(self, keys: list[str], workers: list[str]) -> None:
        """Gradient-domain downlink: each key's gradient becomes what the downlink sends of it
        (`GradientDownlink.compress`), at the codec of the smallest push of it (the first such
        worker in id order): the update goes to every worker, so at the level the slowest path's
        sender chose. (The first worker's codec sent a relay's LAN-sized choice for its own site's
        shard back over the WAN to the other site: docs/history/BENCHMARKS-2026.md, "A gradient-domain downlink".)"""
        if self.gradient is None:
            return
        forward, weights = self._forwards(workers), self.weights(workers)
        intents = [self.pending[w].intent for w in workers]
        if len(workers) <= MAX_INTENTS and all(intents):  # one worker without: none, so nobody joins a part of the step
            self.gradient.note_intents(self.version, tuple(zip(workers, intents)))
        for key in keys:
            param = self.params[key]
            payloads = [self.pending[w].payloads.pop(key, None) for w in workers]
            if forward and _alike(payloads):
                terms = [(w, c, p) for w, c, p in zip(workers, weights, payloads) if p is not None]  # all there (`_alike`)
                self.gradient.forward(self.version, key, terms)  # the exact mean: `param.grad` as it is
                continue
            pushed = [self.pending[w].specs[key] for w in workers if key in self.pending[w].specs]
            spec = min(pushed, key=lambda s: s[0])[1] if pushed else "fp32"  # min keeps the first of equals
            param.grad = self.gradient.compress(self.version, key, param.grad, spec, len(pushed))

    def _forwards(self, workers: list[str]) -> bool:
        """Whether the step's keys may go down as the pushes that make them up (`Params.sums`;
        docs/ARCHITECTURE.md, "Forwarded pushes"; each key's pushes must be `_alike` too): at most
        `MAX_SUM_TERMS` contributing `workers`
        (each is sent the other's push, no more bytes than their compressed mean, and no second
        compression), each keeping its pushes (`Pending.keeps`: not a relay), and no clipping (it
        couples every key, and each worker would have to clip as the PS does)."""
        settings = self.optimizer_settings
        return (
            0 < len(workers) <= MAX_SUM_TERMS
            and all(self.pending[w].keeps for w in workers)
            and (settings is None or settings.clip_grad_norm <= 0)
        )

    def _step(self, keys: list[str], workers: list[str], *, keep: bool = False) -> None:
        """torch.optim's step over `keys` (their grads set), with each key's hyper-parameters for
        this step: keys that share them step together (one call in the usual one-group case), and
        per-parameter optimizers make the split exact. Each call goes through the `StepGuard`; with
        several groups their copies are kept until all have stepped, so a refusal of a later group
        undoes the earlier ones (`keep`: a pipelined step, committed when whole). Clears the grads."""
        assert self.optimizer is not None and self.optimizer_settings is not None
        by_hyper: dict[Hyper | None, list[str]] = {}
        for key in keys:
            hyper = next((self.pending[w].hparams[key] for w in workers if key in self.pending[w].hparams), None)
            by_hyper.setdefault(hyper, []).append(key)
        grads = {key: self.params[key].grad for key in keys}
        hold = keep or len(by_hyper) > 1
        try:
            for hyper, group in by_hyper.items():
                if len(by_hyper) > 1:
                    members = set(group)
                    for key in keys:
                        self.params[key].grad = grads[key] if key in members else None
                with self.optimizer_settings.step_with(self.optimizer, hyper):
                    self.guard.step(self.optimizer, self.params, group, keep=hold)
            if hold and not keep:
                self.guard.commit()
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
        return weighted_sum(terms, param.dtype, out=buf)

    # --- decoding -------------------------------------------------------------------------

    def layout(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Key -> (shape, dtype name)."""
        return {k: (tuple(t.shape), DTYPE_NAMES[t.dtype]) for k, t in self.params.items()}

    def decode(self, key: str, payload: Payload) -> torch.Tensor:
        """A peer's payload as a tensor; any fault in it is the peer's (`ProtocolError`)."""
        if payload.dtype not in DTYPES:
            raise ProtocolError("dtype", f"key {key!r}: dtype {payload.dtype!r} not allowed")
        known = self.params.get(key, self.state.get(key))
        if self.initialized and known is not None and payload.shape != tuple(known.shape):
            raise ProtocolError("shape", f"key {key!r}: shape {payload.shape} != {tuple(known.shape)}")
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


FORWARD_SPREAD = 1.25
"""Largest push of a key, over its smallest, that is still forwarded (`StoreCore._forwards`)."""


def _alike(payloads: list[Payload | None]) -> bool:
    """Whether a key's pushes may go down as they are: every pusher's is there, and none is more
    than `FORWARD_SPREAD` times the smallest's bytes. Each worker's policy chose its level for its
    own path, and a push sized for a fast path must not cross a slow one: seen when relays kept
    their pushes (since reverted), a relay's LAN-level push to its own site's shard crossed the WAN
    to the other site (digits-cnn, 2 sites x 2 workers: 38-63 kB a step into a site where the mean
    compressed at the smaller push took 26). Unlike levels go as before: the mean at the smallest
    push's codec (netsense's workers join the step's level where they can: docs/POLICIES.md)."""
    sizes = [p.wire_size for p in payloads if p is not None]
    return len(sizes) == len(payloads) and max(sizes) <= FORWARD_SPREAD * max(1, min(sizes))


def key_hparams(msg: Push) -> dict[str, Hyper]:
    """Key -> the hyper-parameters `msg` carries for it (none when it carries none)."""
    hypers = [as_hyper(group) for group in msg.hparams]
    return {key: hypers[msg.groups.get(key, 0)] for key in msg.grads} if hypers else {}
