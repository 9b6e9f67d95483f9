"""`ParameterStore`: the PS's authoritative state as a pure, synchronous state machine.

Inputs are plain calls (`initialize`, `join`, `push`, `leave`, `drop_incomplete`, `pull`); no
sockets, no event loop, no clock. The store is the one public face of this package: it owns the
shared core (core.py), one mode that decides when pending gradients apply (sync.py or ssp.py), the
pipelined part of a sync step (pipeline.py) and the downlink encoder (encode.py), and routes each
call to them; its checkpoint state is state.py's.

An update that would make parameters or optimizer state NaN/Inf is refused whole (guard.py): the
call that triggered it raises `UpdateRefused` (code ``non-finite-update``) if it came from a
push or a keyed pull, the step's pushes are dropped, and `refused` tells each of their workers'
pulls to resync (docs/RELIABILITY.md, "Poisoned updates").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch

from netsense.compression import Payload
from netsense.errors import ConfigError, ProtocolError
from netsense.transport.wire import Params, Push, TensorInfo

from ..optim import OptimizerSettings, adam_metric, optimizer_state_payloads
from . import state as checkpoint_state
from .core import Mode, StepApplied, StoreCore
from .encode import Chooser, UpdateEncoder
from .gradient import GradientDownlink
from .guard import UpdateRefused
from .pipeline import PipelinedStep
from .ssp import SspClocks
from .sync import SyncBarrier

log = logging.getLogger(__name__)

DOWNLINK_DOMAINS = ("params", "gradient")
"""What a lossy downlink compresses: the parameters' change, or the step's aggregated gradient."""


class ParameterStore:
    """Authoritative parameters, optimizer state, versions and the synchronous barrier."""

    def __init__(self, *, downlink_codec: str = "fp32", staleness: int | None = None, downlink_domain: str = "params") -> None:
        if staleness is not None and staleness < 0:
            raise ValueError(f"staleness must be >= 0 (or None for synchronous), got {staleness}")
        if downlink_domain not in DOWNLINK_DOMAINS:
            raise ConfigError(f"downlink_domain must be one of {', '.join(DOWNLINK_DOMAINS)}, got {downlink_domain!r}")
        if downlink_domain == "gradient" and staleness is not None:
            raise ConfigError("downlink_domain 'gradient' needs the synchronous barrier: async mode sends whole parameters")
        self.staleness = staleness
        """None: synchronous barrier (BSP); s: asynchronous, at most s versions ahead (SSP)."""
        self.downlink_domain = downlink_domain
        """``params``: updates are the compressed change of the parameters (encode.py);
        ``gradient``: the step's compressed gradient, which every replica's optimizer applies
        (gradient.py)."""
        self._core = StoreCore()
        self._encoder = UpdateEncoder(downlink_codec)
        if downlink_domain == "gradient":
            self._core.gradient = self._encoder.gradient = GradientDownlink()
            self._encoder.optimizer_view = self._optimizer_view
        self._pipeline: PipelinedStep | None = None
        """Keyed pulls: sync mode only."""
        self._mode: Mode
        if staleness is None:
            self._pipeline = PipelinedStep(self._core, self._encoder)
            self._mode = SyncBarrier(self._core, self._encoder, self._pipeline)
        else:
            self._mode = SspClocks(self._core, self._encoder, staleness)
        self.rejected_messages = 0
        self.refused_updates = 0
        """Updates refused because they would have poisoned the model (`UpdateRefused`)."""
        self._refused: tuple[int, set[str], str] | None = None
        """(version, workers whose pushes it dropped and that have not pushed since, reason) of the
        last refused update, while the store is still at that version."""

    # --- the state, read-only (the parts own it) ------------------------------------------

    @property
    def version(self) -> int:
        return self._core.version

    @property
    def params(self) -> dict[str, torch.Tensor]:
        return self._core.params

    @property
    def shadow(self) -> dict[str, torch.Tensor]:
        """What every replica holds (sync mode)."""
        return self._encoder.shadow

    @property
    def state_keys(self) -> dict[str, torch.Tensor]:
        """State keys (buffers, frozen parameters) -> value: averaged from pushes, never optimized."""
        return self._core.state

    @property
    def model(self) -> dict[str, TensorInfo]:
        """Key -> its place in the model's state_dict (empty when rank 0 did not send the map)."""
        return self._core.model

    @property
    def job_id(self) -> str:
        """The job whose state this is (empty: unknown)."""
        return self._core.job_id

    def adopt_job(self, job_id: str) -> None:
        """Name the job of a state that had none (a checkpoint or a worker from before job ids)."""
        self._core.job_id = job_id

    @property
    def optimizer_settings(self) -> OptimizerSettings | None:
        return self._core.optimizer_settings

    def _optimizer_view(self) -> tuple[dict[str, object], dict[str, Payload]]:
        """The optimizer's settings and state, as a gradient-domain full PARAMS carries them."""
        settings, optimizer = self._core.optimizer_settings, self._core.optimizer
        if settings is None or optimizer is None:
            return {}, {}
        # Keys a pipelined step applied ahead: the shadow (what is sent) is still the previous
        # version, so is their state (the guard kept it for a refusal).
        return settings.to_dict(), optimizer_state_payloads(optimizer, self._core.params, self._core.guard.kept())

    def update_metric(self) -> dict[str, torch.Tensor] | None:
        """Per key, the optimizer's diagonal metric of a parameter change (`adam_metric`: Adam's
        sqrt(v_hat) + eps; None for SGD, whose metric is the plain one): the downlink's candidate
        rounds weigh a level's error by it (ps/downlink.py). New tensors."""
        optimizer = self._core.optimizer
        return None if optimizer is None else adam_metric(optimizer, self._core.params)

    @property
    def live(self) -> set[str]:
        return self._core.live

    @property
    def clocks(self) -> dict[str, int]:
        """Async mode: worker -> its applied pushes (kept after it leaves, for a rejoin)."""
        return self._core.clocks

    @property
    def max_staleness(self) -> int:
        """Largest staleness of an applied gradient since start (async mode)."""
        return self._mode.max_staleness

    @property
    def applied_steps(self) -> int:
        return self._core.applied_steps

    @property
    def start_quorum(self) -> int:
        return self._core.start_quorum

    @property
    def last_encode(self) -> tuple[int, str, float] | None:
        """(version, codec spec, seconds) of the last whole-step update encode: the downlink
        policy's measured encode cost of the level it chose (ps/downlink.py)."""
        return self._encoder.last_encode

    # --- set-up ---------------------------------------------------------------------------

    @property
    def initialized(self) -> bool:
        return self._core.initialized

    def initialize(
        self, tensors: dict[str, Payload], optimizer: dict[str, object], world_size: int = 1,
        model: dict[str, TensorInfo] | None = None, job_id: str = "",
    ) -> None:  # fmt: skip
        """Take rank 0's initial parameters; ignored (not an error) if already initialized.

        The first update waits for `world_size` workers (or the barrier timeout): otherwise a
        worker that connects a moment after rank 0 would silently miss step 0. `model` names the
        keys in the model's state_dict and marks the state keys (buffers); `job_id` is the job.
        """
        if self.initialized:
            return
        self._core.initialize(tensors, optimizer, world_size, model, job_id)
        self._encoder.reset(self._core.params)
        self._encoder.state = self._core.state
        if self._core.gradient is not None:
            self._core.gradient.reset()
        assert self.optimizer_settings is not None
        log.info("store initialized: %d keys, %d elements, optimizer %s", len(self.params), self.numel, self.optimizer_settings.name)

    @property
    def numel(self) -> int:
        return sum(t.numel() for t in self.params.values())

    def layout(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Key -> (shape, dtype name)."""
        return self._core.layout()

    # --- membership -----------------------------------------------------------------------

    def join(self, worker_id: str) -> None:
        """Add a worker to the barrier (a rejoin after a crash is a join)."""
        self._mode.join(worker_id)

    @property
    def asynchronous(self) -> bool:
        return self.staleness is not None

    @property
    def min_live_clock(self) -> int | None:
        """Async mode: the slowest live worker's clock (None without live workers)."""
        return self._core.min_live_clock

    def may_proceed(self, worker_id: str) -> bool:
        """SSP rule: a worker with clock c may start its next step iff ``c - min_live_clock <= s``
        (always true in sync mode, and for a worker that is not live: its next push re-enters it)."""
        return self._mode.may_proceed(worker_id)

    @property
    def blocked(self) -> bool:
        """Async mode: some live worker is more than `staleness` ahead of the slowest one."""
        return self._mode.blocked

    def leave(self, worker_id: str) -> StepApplied | None:
        """Remove a worker and discard its partial step; may complete the barrier for the rest
        (a refused update is then logged and counted, not raised: no push of this caller made it)."""
        try:
            return self._mode.leave(worker_id)
        except UpdateRefused as exc:
            self._refuse(worker_id, exc)
            return None

    def drop_incomplete(self) -> tuple[list[str], StepApplied | None]:
        """Barrier timeout: remove live workers that have not finished the current step.

        Async mode: remove the slowest live workers, if they hold back another one (SSP wait)."""
        before = set(self.live)
        try:
            return self._mode.drop_incomplete()
        except UpdateRefused as exc:
            self._refuse("", exc)
            return sorted(before - self.live), None

    @property
    def step_started(self) -> bool:
        """True once any worker pushed for the current version."""
        return bool(self._core.pending)

    # --- the step -------------------------------------------------------------------------

    def push(self, worker_id: str, msg: Push) -> StepApplied | None:
        """Validate and record one PUSH; apply the update if it completes the barrier."""
        grads = self._core.check_push(worker_id, msg, older_ok=self.asynchronous)
        # Validation passed for every key: only now does anything change.
        if self._refused is not None:
            self._refused[1].discard(worker_id)  # it pushes again: it has resynced
        try:
            return self._mode.record(worker_id, msg, grads)
        except UpdateRefused as exc:
            self._refuse(worker_id, exc)
            raise

    def refused(self, worker_id: str, step: int) -> str | None:
        """Why the update from version `step` was refused, if it dropped `worker_id`'s pushes and
        the worker has not pushed since: its pull for ``step + 1`` must not wait for an update that
        will not come (answer ``non-finite-update``; the worker resyncs with a full pull)."""
        r = self._refused
        if r is None or r[0] != step or self.version != step or worker_id not in r[1]:
            return None
        return r[2]

    def _refuse(self, worker_id: str, exc: UpdateRefused) -> None:
        """A refused update: drop what it would have applied and remember whose pushes those were."""
        before = set(self._core.pending)
        self._mode.abandon(worker_id)
        dropped = (before - set(self._core.pending) | {worker_id}) - {""}
        self.refused_updates += 1
        self._refused = (self.version, dropped, exc.reason)
        log.warning("update from version %d refused (pushes of %s dropped): %s", self.version, ", ".join(sorted(dropped)), exc.reason)

    # --- pipelined steps (keyed pulls) ----------------------------------------------------

    @property
    def applied_keys(self) -> int:
        """Keys of the current step applied ahead of the version (pipelined steps)."""
        return len(self._pipeline.applied) if self._pipeline is not None else 0

    def want(self, keys: Iterable[str], step: int) -> int:
        """A keyed PULL waits for `keys` of the update from version `step`: apply those that every
        worker of the step has pushed; returns how many were applied now."""
        if not self.initialized:
            raise ProtocolError("not-initialized", "nothing to pull yet")
        keys = list(keys)
        unknown = [k for k in keys if k not in self.params and k not in self.state_keys]  # state keys: once the step is whole
        if unknown:
            raise ProtocolError("key", f"unknown keys {unknown[:3]!r} in a keyed PULL")
        if self._pipeline is None:
            raise ProtocolError("keys", "a keyed PULL needs a synchronous PS; this one is asynchronous (staleness set)")
        try:
            return self._pipeline.want(keys, step)
        except UpdateRefused as exc:
            self._refuse("", exc)
            raise

    def keys_ready(self, keys: Iterable[str], version: int) -> bool:
        """True once a keyed pull for `keys` at `version` can be answered."""
        if self._pipeline is None:
            return self.version >= version  # nothing is applied ahead in async mode
        return self._pipeline.keys_ready(keys, version)

    def pull_keys(self, have_version: int, keys: Iterable[str]) -> Params:
        """The update of `keys` from `have_version` to the next version, as soon as they are
        applied; the full parameters (every key) when no such update exists."""
        if self._pipeline is None:
            raise ProtocolError("keys", "a keyed PULL needs a synchronous PS; this one is asynchronous (staleness set)")
        return self._pipeline.pull(have_version, keys)

    # --- downlink -------------------------------------------------------------------------

    def set_downlink(self, spec: str | None) -> None:
        """Codec of the next updates (a downlink policy's choice, per update); None: back to the
        configured `downlink_codec`. Replicas still equal the shadow bit for bit: the shadow
        follows whatever was sent, and a lossless choice sends the parameters themselves."""
        self._encoder.choose(spec)

    def defer_downlink(self, chooser: Chooser) -> None:
        """The next update's codec is chosen on the update itself, just before it is encoded
        (`UpdateEncoder.defer_choice`): that step is applied whole, not key by key ahead."""
        self._encoder.defer_choice(chooser)

    def full_params(self) -> Params:
        """The replica every worker must hold (the shadow), lossless."""
        return self._encoder.full_params(self.version)

    def pull(self, have_version: int) -> Params:
        """What a worker at `have_version` needs to reach the current version."""
        if not self.initialized:
            raise ProtocolError("not-initialized", "nothing to pull yet")
        return self._mode.pull(have_version)

    # --- checkpoints (ps/checkpoint.py writes them) ----------------------------------------

    def state(self) -> dict[str, object]:
        """A snapshot of everything a restart needs, as plain containers of copied tensors.

        Taken between steps it never holds a partial step (pending pushes are not part of it:
        workers re-push after they reconnect). Safe to serialise on another thread.
        """
        if not self.initialized:
            raise ProtocolError("not-initialized", "nothing to checkpoint before INIT")
        if self.applied_keys:
            raise ProtocolError("mid-step", f"{self.applied_keys} keys of step {self.version} are applied ahead; checkpoint between steps")
        return checkpoint_state.snapshot(self._core, self._encoder)

    def restore(self, state: dict[str, object]) -> None:
        """Become the store that `state()` described (fresh store only).

        Stateful downlink encoders restart empty; workers pull the full shadow after a restart.
        """
        if self.initialized:
            raise ProtocolError("initialized", "restore needs a fresh store")
        owed = checkpoint_state.residuals(state)
        checkpoint_state.restore(self._core, self._encoder, state)
        self._encoder.state = self._core.state
        if self._core.gradient is not None:
            # The replicas are the parameters (a checkpoint of the parameter domain kept its shadow
            # apart); what error feedback still owed goes on being owed.
            self._core.gradient.reset()
            self._core.gradient.residual.update(owed)
            self._encoder.shadow = {k: v.clone() for k, v in self._core.params.items()}
        self._mode.reset()
        log.info(
            "store restored at version %d (%d keys, %d state keys, %d live workers, job %r)",
            self.version, len(self.params), len(self.state_keys), len(self.live), self.job_id,
        )  # fmt: skip
