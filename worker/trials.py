"""Level trials: what a ladder level costs in steps, measured by training with it (docs/POLICIES.md,
"Level trials").

A codec's error statistics do not say what it costs the run (docs/history/BENCHMARKS-2026.md, "Estimators
against the steps they predict"): powersgd:2 keeps more of each step on a small transformer than on
a tanh MLP (one-step contraction 0.63 against 0.46) yet runs at 0.72 of fp32's speed per step there
and 0.93 here, and top-k 1 % costs wide-mlp 2.8x the steps with momentum SGD and nothing without
it. What the optimizer and the model make of delayed, compressed updates is a property of the job.
So a trial runs it: from one starting point, K steps of the job's own model, loss and optimizer on the same
batches, once at full precision and once per level (error feedback per worker around the level's
codec on the uplink, or around the update on the downlink), and reads off how many full-precision
steps reach the loss each level reached. Its q is that count over the level's steps: 1 = no
slower than fp32 per step. Sans I/O: plain torch in the calling thread (tested on CPU).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from netsense.compression import make_codec
from netsense.compression.base import Codec
from netsense.errors import CompressionError

from .task import TrainTask

log = logging.getLogger(__name__)

Batch = tuple[torch.Tensor, torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


def _envelope(curve: Sequence[float]) -> list[float]:
    """The running minimum: the best loss reached by each step (an eval batch's noise aside)."""
    out, best = [], float("inf")
    for x in curve:
        best = min(best, x)
        out.append(best)
    return out


def steps_equivalent(reference: Sequence[float], loss: float, near: float) -> float:
    """Reference steps (interpolated) to reach `loss`, on the reference's running minimum; where
    that minimum sits at `loss` for a while (no progress), the step of that stretch nearest
    `near`; its length - 1 when it never gets there, 0 when it starts there."""
    env = _envelope(reference)
    if loss >= env[0]:
        return 0.0
    for t in range(1, len(env)):
        if env[t] == loss:
            end = t
            while end + 1 < len(env) and env[end + 1] == loss:
                end += 1
            return float(min(max(near, t), end))
        if env[t] < loss:
            return t - 1 + (env[t - 1] - loss) / (env[t - 1] - env[t])
    return float(len(env) - 1)


def trial_progress(reference: Sequence[float], losses: Sequence[float]) -> float:
    """q of a level from its losses after 0..K steps against the reference's: the mean, over the
    second half of the horizon (every level's first updates are nearly the same), of reference
    steps to the level's best loss by step t, over t. Identical curves give 1; a level that beats
    the reference reads at most K / t."""
    k = len(losses) - 1
    if k < 2 or len(reference) != len(losses):
        raise ValueError(f"a trial needs two curves of the same length >= 3, got {len(reference)} and {len(losses)}")
    best = _envelope(losses)
    ts = range(max(1, k // 2), k + 1)
    return sum(steps_equivalent(reference, best[t], t) / t for t in ts) / len(ts)


@dataclass(frozen=True)
class TrialResult:
    """What one set of trials measured."""

    progress: dict[str, float]
    """q per level spec (levels whose codec failed are left out)."""
    reference: list[float]
    """Full-precision losses after 0..K steps."""
    losses: dict[str, list[float]]
    """Each measured level's losses after 0..K steps."""


class TaskSampler:
    """Seeded training batches of `task`, one stream per worker: the same batches for every level
    of a trial (tensors indexed, or a `Dataset`'s samples collated as a `DataLoader` would)."""

    def __init__(self, task: TrainTask, seed: int, workers: int, batch_size: int | None = None) -> None:
        # A TrainTask holds exactly one of the two forms, not empty (checked when it is made).
        data = task.train_inputs if task.train_inputs is not None else task.train_data
        self._size = len(data)  # type: ignore[arg-type]
        self.task = task
        self.batch_size = batch_size or task.batch_size
        self.gens = [torch.Generator().manual_seed(seed * 100 + w) for w in range(workers)]

    def step(self) -> list[Batch]:
        """One batch per worker."""
        return [self._batch(torch.randint(0, self._size, (self.batch_size,), generator=gen)) for gen in self.gens]

    def _batch(self, idx: torch.Tensor) -> Batch:
        t = self.task
        if t.train_inputs is not None and t.train_targets is not None:
            return t.train_inputs[idx], t.train_targets[idx]
        x, y = torch.utils.data.default_collate([t.train_data[int(i)] for i in idx])  # type: ignore[index]
        return x, y


def run_trials(
    model: nn.Module,
    loss_fn: LossFn,
    make_optimizer: OptimizerFactory,
    batches: Sequence[Sequence[Batch]],
    eval_batch: Batch,
    specs: Sequence[str],
    *,
    direction: str = "up",
    on_level: Callable[[str | None, float | None], None] | None = None,
) -> TrialResult:
    """Train a copy of `model` through `batches` (K steps, each a list of one batch per worker) at
    fp32 and at each of `specs`, and price each level against fp32 (`trial_progress`). `model`
    itself is left as it was. `direction` "up" compresses each worker's gradient (one error
    feedback per worker and key), "down" the optimizer's update (one per key), as the system does.
    `on_level(spec, q)` hears of each trajectory as it ends (None: fp32's; q None: dropped)."""
    reference = _trajectory(model, loss_fn, make_optimizer, batches, eval_batch, None, direction)
    if on_level is not None:
        on_level(None, 1.0)
    progress, losses = {}, {}
    for spec in specs:
        try:
            curve = _trajectory(model, loss_fn, make_optimizer, batches, eval_batch, spec, direction)
        except (CompressionError, ValueError, RuntimeError) as exc:  # a codec that cannot take these shapes
            log.warning("level trial of %s dropped: %s", spec, exc)
            if on_level is not None:
                on_level(spec, None)
            continue
        losses[spec] = curve
        progress[spec] = trial_progress(reference, curve)
        if on_level is not None:
            on_level(spec, progress[spec])
    return TrialResult(progress, reference, losses)


def _trajectory(
    model: nn.Module,
    loss_fn: LossFn,
    make_optimizer: OptimizerFactory,
    batches: Sequence[Sequence[Batch]],
    eval_batch: Batch,
    spec: str | None,
    direction: str,
) -> list[float]:
    run = TrialRun(model, loss_fn, make_optimizer, spec, direction=direction)
    curve = [run.loss(eval_batch)]
    for step in batches:
        run.step(step)
        curve.append(run.loss(eval_batch))
    return curve


class TrialRun:
    """Synchronous data-parallel training of a copy of `model` in one process, with `spec` (None:
    fp32) on the uplink or the downlink under error feedback: one trial's trajectory, and the
    steps-to-target runs that `scripts/level_cost.py` checks the trials against."""

    def __init__(
        self, model: nn.Module, loss_fn: LossFn, make_optimizer: OptimizerFactory, spec: str | None, *, direction: str = "up"
    ) -> None:
        if direction not in ("up", "down"):
            raise ValueError(f"direction must be 'up' or 'down', got {direction!r}")
        self.net = copy.deepcopy(model)
        self.net.train()
        self.loss_fn = loss_fn
        self.params = [p for p in self.net.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(self.params)
        self.spec = spec
        self.direction = direction
        self._up: dict[int, _Feedback] = {}  # per worker
        self._down = _Feedback(spec, len(self.params), keep=False) if spec is not None and direction == "down" else None
        self._master: list[torch.Tensor] | None = None  # the PS's own parameters (downlink)

    def step(self, batches: Sequence[Batch]) -> None:
        """One synchronous step: each of `batches` is one worker's; their gradients are averaged."""
        grads = [torch.zeros_like(p) for p in self.params]
        for w, (x, y) in enumerate(batches):
            self.net.zero_grad(set_to_none=True)
            self.loss_fn(self.net(x), y).backward()
            up = self._uplink(w)
            for i, p in enumerate(self.params):
                g = torch.zeros_like(p) if p.grad is None else p.grad.detach()
                grads[i] += (up.send(i, g) if up else g) / len(batches)
        if self._down is None:
            self._apply(grads)
            return
        # The workers computed at the replica (the parameters they were sent); the PS steps its own
        # copy and sends its difference from the replica (error feedback by construction).
        replica = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for p, master in zip(self.params, self._master or replica):
                p.copy_(master)
        self._apply(grads)
        self._master = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for i, (p, r) in enumerate(zip(self.params, replica)):
                p.copy_(r + self._down.send(i, p.detach() - r))

    def loss(self, batch: Batch) -> float:
        """The loss on `batch` in eval mode (no dropout, BatchNorm's running statistics left alone)."""
        return self.evaluate(self.loss_fn, batch)

    def evaluate(self, metric: Callable[[torch.Tensor, torch.Tensor], torch.Tensor | float], batch: Batch) -> float:
        """`metric(model(x), y)` on `batch` in eval mode, at the parameters the workers hold."""
        self.net.eval()
        try:
            with torch.no_grad():
                return float(metric(self.net(batch[0]), batch[1]))
        finally:
            self.net.train()

    def _uplink(self, worker: int) -> _Feedback | None:
        if self.spec is None or self.direction != "up":
            return None
        if worker not in self._up:
            self._up[worker] = _Feedback(self.spec, len(self.params))
        return self._up[worker]

    def _apply(self, grads: list[torch.Tensor]) -> None:
        for p, g in zip(self.params, grads):
            p.grad = g
        self.optimizer.step()


class _Feedback:
    """One codec per key, and (`keep`) error feedback around it as a worker keeps it. The downlink
    keeps none here: what it sends is the PS's parameters less the replica, which already holds
    everything not yet sent (the PS's shadow)."""

    def __init__(self, spec: str, keys: int, *, keep: bool = True) -> None:
        self.codecs: list[Codec] = [make_codec(spec) for _ in range(keys)]
        self.residual: list[torch.Tensor | None] = [None] * keys
        self.keep = keep

    def send(self, key: int, x: torch.Tensor) -> torch.Tensor:
        r = self.residual[key]
        v = x.float() if r is None else x.float() + r
        codec = self.codecs[key]
        sent = codec.roundtrip(v.contiguous()).float().reshape(v.shape)
        if self.keep:
            self.residual[key] = v - sent
        return sent.to(x.dtype)
