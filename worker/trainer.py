"""The training loop the CLI runs: deterministic data split, BSP steps, periodic evaluation.

Every worker draws the same global batch for a step (seeded by seed and step) and takes its own
slice, so the union over workers is one large batch: NetSense training then follows the same
trajectory as single-process training on that batch (tested). Which samples and how they are
loaded (tensors or a `Dataset` through a `DataLoader`): `netsense.worker.data`.

Events: a ``step`` event per step, numbered by the job's step it produced, and that number never
goes back. When the PS goes back (restored from a checkpoint, or restarted empty), the worker
follows it: one ``resync`` event says from which version to which, and the steps redone up to
the highest step already reported are ``redo`` events (same fields), so consumers keyed on the
step number see each step once (docs/RELIABILITY.md, "Step events after a resync").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .data import TrainBatches, eval_batches, global_batch, worker_batch  # noqa: F401 (global_batch: re-exported)
from .device import model_device, parse_device
from .optimizer import NetSenseOptimizer
from .task import TrainTask

log = logging.getLogger(__name__)
Emit = Callable[[dict[str, Any]], None]
BREAKDOWN = ("compute_s", "encode_s", "push_s", "wait_s", "decode_s", "apply_s")
"""StepStats fields each step event carries (wire = push + wait)."""


@dataclass(frozen=True)
class TrainSettings:
    """How long and how to train; None means the task's default."""

    steps: int | None = None
    """Synchronous steps (every worker runs the same number)."""
    batch_size: int | None = None
    """Samples per worker per step."""
    seed: int = 0
    """Seeds the model initialisation and the batch order."""
    eval_every: int = 50
    """Rank 0 evaluates the test set every this many steps (0: only at the end)."""
    codec: str = "fp32"
    """Uplink codec (a spec of `netsense.compression.make_codec`); the same as policy ``fixed:<codec>``."""
    policy: str | None = None
    """Uplink policy spec (``none``, ``fp16``, ``fixed:<codec>``, ``dc2``, ``netsenseml-paper``,
    ``accordion``, ``gravac``, ``netsense``); overrides `codec` when set."""
    ladder: str | None = None
    """Comma-separated codec specs the policy picks from, least lossy first (None: DEFAULT_LADDER;
    ``gravac`` picks from its own compression factors and takes only the ladder's calibration)."""
    progress_table: str | None = None
    """File from `netsense calibrate`: the ``netsense`` policy prices the uplink's levels at its
    ``up`` table's q (docs/POLICIES.md, "Calibrated q"; None: estimated during the run)."""
    decision_log: str | None = None
    """JSONL file for one decision record per step (None: no log)."""
    overlap: bool | None = None
    """Full-duplex step: push keys from gradient hooks during backward and, against a sync PS, pull
    each bucket's keys once applied, so up- and downlink run at once (bit for bit the same result).
    Unset: on wherever that is exact and the policy needs no mid-flight redecide (not against an
    async PS, not with the adaptive ``netsense`` policy, and not after the
    first step if a step fits in one hook bucket per shard: worker/duplex.py);
    true (``--overlap``): always; false (``--no-overlap``): the plain push-barrier-pull step."""
    device: str = "cpu"
    """Where a worker trains: ``cpu``, ``cuda`` (local rank r on GPU r mod count) or ``cuda:N``. The
    model, gradients, residuals and codecs stay there; only encoded bytes cross to the host."""
    job_id: str = ""
    """Names the job to the PS, which refuses a worker of another job than the one it holds
    (empty: $NETSENSE_JOB_ID, else ``<model>-s<seed>`` plus Slurm's or torchrun's run id, and for
    `netsense launch` a random part; docs/ARCHITECTURE.md, "Job identity")."""
    resume: bool = False
    """Continue the job whose state the PS holds, even under another job id."""

    def __post_init__(self) -> None:
        parse_device(self.device)  # syntax only: CUDA is checked where the worker starts


@torch.no_grad()
def evaluate(task: TrainTask, model: torch.nn.Module, batch: int = 1024) -> tuple[float, float]:
    """(test accuracy, test loss) of `model` on the held-out split."""
    model.eval()
    device = model_device(model)
    acc = loss = 0.0
    n = task.test_size
    for x, y in _test_batches(task, batch):
        x, y = x.to(device), y.to(device)
        out = model(x)
        acc += task.accuracy(out, y) * len(x)
        loss += task.loss(out, y).item() * len(x)
    model.train()
    return acc / n, loss / n


def _test_batches(task: TrainTask, batch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    if task.test_data is not None:
        yield from eval_batches(task.test_data, task.loader, batch)
        return
    assert task.test_inputs is not None and task.test_targets is not None
    for start in range(0, task.test_size, batch):
        yield task.test_inputs[start : start + batch], task.test_targets[start : start + batch]


def build_model(task: TrainTask, seed: int) -> torch.nn.Module:
    """The task's model, seeded so every worker starts identical."""
    torch.manual_seed(seed)
    return task.build_model()


def train(
    task: TrainTask,
    model: torch.nn.Module,
    opt: NetSenseOptimizer,
    *,
    rank: int,
    world_size: int,
    settings: TrainSettings,
    emit: Emit = lambda e: None,
) -> dict[str, Any]:
    """Run the loop; returns the summary (test accuracy from rank 0's replica, which equals the PS's)."""
    steps = settings.steps if settings.steps is not None else task.steps
    b = settings.batch_size or task.batch_size
    n = task.train_size
    device = model_device(model)  # the data stays on the host; each batch moves to the model
    loaded = None  # the Dataset form's loader; the tensor form indexes its tensors below
    if task.train_data is not None:
        loaded = TrainBatches(
            task.train_data, task.loader, rank=rank, world_size=world_size, batch_size=b, seed=settings.seed, steps=steps
        )
    t_start = time.perf_counter()
    # Training starts now (the connection is up): `netsense launch` restarts a time-varying link
    # here, so every run meets its trace from the first push (docs/EMULATOR.md, "Steps").
    emit({"event": "start", "step": opt.version, "steps": steps})
    loss_value = float("nan")
    samples = 0
    reported = 0  # the highest step number a `step` event carried
    while opt.version < steps:
        # The step follows the PS's version: a worker that rejoined, or a PS restarted from a
        # checkpoint, continues where the job is rather than where this process was.
        step = opt.version
        if loaded is not None:
            x, y = loaded.batch(step)
            idx = y  # below, only its length counts: the step's sample count
        else:
            assert task.train_inputs is not None and task.train_targets is not None
            idx = worker_batch(step, rank=rank, world_size=world_size, batch_size=b, seed=settings.seed, n=n)
            x, y = task.train_inputs[idx], task.train_targets[idx]
        out = model(x.to(device))
        loss = task.loss(out, y.to(device))
        opt.zero_grad(samples=len(idx))  # with overlap, the pushes sent during backward carry it
        loss.backward()
        stats = opt.step(samples=len(idx))
        loss_value = loss.item()
        samples += len(idx)
        elapsed = time.perf_counter() - t_start
        if stats.version <= step:  # the PS went back (or did not move): follow it, say so
            log.warning("PS went back from version %d to %d; redoing steps up to %d", step, stats.version, reported)
            emit({"event": "resync", "from_version": step, "to_version": stats.version, "step": reported, "wall_s": elapsed})
            continue
        redo = step + 1 <= reported
        reported = max(reported, step + 1)
        emit(
            {
                "event": "redo" if redo else "step",
                "step": step + 1,
                "steps": steps,
                "loss": loss_value,
                "samples_per_s": samples * world_size / elapsed,
                "bytes_up": opt.bytes_up,
                "bytes_down": opt.bytes_down,
                "codec": stats.codec,
                "wall_s": elapsed,
                # the step-time breakdown (StepStats): where this step's time went
                **{f: round(getattr(stats, f), 6) for f in BREAKDOWN},
            }
        )
        if rank == 0 and settings.eval_every and (step + 1) % settings.eval_every == 0 and step + 1 < steps:
            acc, _ = evaluate(task, model)
            emit({"event": "eval", "step": step + 1, "test_accuracy": acc, "wall_s": time.perf_counter() - t_start})
    wall = time.perf_counter() - t_start
    summary: dict[str, Any] = {
        "final_loss": loss_value,
        "wall_s": wall,
        "steps": steps,
        "samples_per_s": samples * world_size / wall if wall > 0 else 0.0,
        "bytes_up": opt.bytes_up,
        "bytes_down": opt.bytes_down,
        "workers": world_size,
        "levels": dict(opt.uplink.levels),
        "device": str(device),
    }
    if rank == 0:
        acc, test_loss = evaluate(task, model)
        summary["test_accuracy"] = acc
        summary["test_loss"] = test_loss
        emit({"event": "eval", "step": steps, "test_accuracy": acc, "wall_s": wall})
    return summary
