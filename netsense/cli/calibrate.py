"""`netsense calibrate`: price each ladder level by level trials of the job's own model, optimizer
and batch size (`netsense.worker.trials`), and write the progress table the ``netsense`` policy
reads with ``--progress-table`` (docs/POLICIES.md, "Calibrated q").

One process, no network: the trials are the job in miniature (the configured workers, K steps from
the model's seeded initialisation), at fp32 and at every lossy level, on the uplink (each worker's
gradient under error feedback) and the downlink (the PS's update), the same batches for all.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

from netsense.cli.flags import add_config_flag, resolve_config
from netsense.compression import DEFAULT_LADDER, Ladder
from netsense.compression.policy.calibration import progress_table_json
from netsense.errors import ConfigError
from netsense.launch.outputs import check_output_file
from netsense.models import load_task, task_optimizer
from netsense.ps.optim import OptimizerSettings
from netsense.worker.trainer import build_model
from netsense.worker.trials import TaskSampler, run_trials

log = logging.getLogger(__name__)

SKIPPED_BY_DEFAULT = ("fp16", "qsgd:8")
"""Levels left out unless named (`--levels`): their error (fp16's rounding, 1/255 of a step's
range at 8 bits) is below what a trial resolves (fp16 reads 0.997-1.002 on wide-mlp: the
trajectories part by chance alone), and the one-step rounds measure them lossless on the run's
first gradient; pinned at 0.99 they would stop being the unknown-bandwidth level."""
HELD_OUT_SEED = 10_000
"""Seed of the batch the trials evaluate the loss on (apart from every worker's training stream)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="measure what each compression level costs in steps on this model (level trials)",
        description="Train the job's model for K steps at fp32 and at each lossy ladder level, in one process, "
        "and write each level's progress efficiency q (fp32 steps per level step to the same loss) as a "
        "progress table for --progress-table. Seconds to minutes: about 2 x (levels + 1) x K x workers "
        "forward and backward passes.",
        epilog="Example: netsense calibrate --model wide-mlp --out q.json && "
        "netsense launch --model wide-mlp --policy netsense --downlink-policy netsense --progress-table q.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_flag(p)
    p.add_argument("--model", help="registered model or package.module:factory (default: the config's)")
    p.add_argument("--workers", type=int, help="workers of the job (default: the config's, 2)")
    p.add_argument("--batch-size", type=int, help="per-worker batch size (default: the model's)")
    p.add_argument("--seed", type=int, help="model initialisation and batch order (default: the config's)")
    p.add_argument("--lr", type=float, help="learning rate (default: the model's)")
    p.add_argument("--ladder", help="the levels to price (default: the config's, else the default ladder)")
    p.add_argument("--levels", help="comma-separated ladder levels to price (default: every lossy one but fp16 and qsgd:8)")
    p.add_argument("--trial-steps", type=int, default=60, metavar="K", help="steps per trial, 10..10000 (default 60; shorter ones read noise: digits-cnn priced qsgd:4 at 0.49-1.10 in 8-20 steps)")
    p.add_argument("--direction", choices=("up", "down", "both"), default="both", help="which direction to price (default both)")
    p.add_argument("--out", required=True, metavar="FILE", help="progress table to write (JSON)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = resolve_config(args)
    if not 10 <= args.trial_steps <= 10_000:
        raise ConfigError(f"--trial-steps must be in 10..10000, got {args.trial_steps}")
    check_output_file("--out", args.out)
    ladder = Ladder.parse(config.train.ladder or DEFAULT_LADDER)
    specs = _levels(ladder, args.levels)
    task = load_task(config.model)
    optimizer = OptimizerSettings.from_dict(task_optimizer(task, config.model, config.optimizer))
    batch_size = config.train.batch_size or task.batch_size
    sampler = TaskSampler(task, config.train.seed, config.workers, batch_size)
    held = TaskSampler(task, HELD_OUT_SEED, 1, batch_size).step()[0]
    batches = [sampler.step() for _ in range(args.trial_steps)]
    model = build_model(task, config.train.seed)
    directions = ("up", "down") if args.direction == "both" else (args.direction,)
    tables: dict[str, dict[str, float]] = {}
    started = time.perf_counter()
    for direction in directions:
        t0 = time.perf_counter()

        def heard(spec: str | None, q: float | None, direction: str = direction, t0: float = t0) -> None:
            what = "fp32 reference" if spec is None else spec
            figure = "" if spec is None else ("  dropped (codec refused the shapes)" if q is None else f"  q {q:.3f}")
            print(f"calibrate {direction}: {what:<18}{figure}  ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)

        result = run_trials(model, task.loss, optimizer.build, batches, held, specs, direction=direction, on_level=heard)
        tables[direction] = result.progress
    about = {
        "model": config.model,
        "workers": config.workers,
        "batch_size": batch_size,
        "seed": config.train.seed,
        "optimizer": optimizer.name,
        "lr": optimizer.lr,
        "trial_steps": args.trial_steps,
        "seconds": round(time.perf_counter() - started, 1),
        "torch_threads": torch.get_num_threads(),
    }
    Path(args.out).write_text(progress_table_json(tables, about))
    print(f"wrote {args.out}: {', '.join(f'{d} {len(t)} levels' for d, t in tables.items())} in {about['seconds']} s", file=sys.stderr)
    return 0


def _levels(ladder: Ladder, text: str | None) -> list[str]:
    """The ladder's levels to price: `text`'s (each must be a lossy level of the ladder), else
    every lossy level but `SKIPPED_BY_DEFAULT`."""
    if text is None:
        return [lv.spec for lv in ladder if not lv.lossless and lv.spec not in SKIPPED_BY_DEFAULT]
    out = []
    for spec in (s.strip() for s in text.split(",")):
        index = ladder.find(spec) if spec else None
        if index is None:
            raise ConfigError(f"--levels: {spec!r} is not a level of the ladder {ladder.spec}")
        if ladder[index].lossless:
            raise ConfigError(f"--levels: {spec!r} is lossless: its q is 1, nothing to calibrate")
        out.append(ladder[index].spec)
    if not out:
        raise ConfigError("--levels names no level")
    return out
