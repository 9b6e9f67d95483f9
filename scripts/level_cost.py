"""What each ladder level costs in steps on a model, and what the estimators say it costs
(docs/history/BENCHMARKS-2026.md, "What a level costs in steps"). Not a test, and no network: one process
plays the PS and `--workers` workers (`netsense.worker.trials.TrialRun`), the task's own model,
loss, batch size and optimizer.

    steps   steps to the first evaluation (every `--every` steps) at or above `--target`, per
            seed, fp32 first; q_true = fp32's mean steps over the level's
    trial   the level trial's q (`run_trials`, `--trial-steps` K from initialisation, seed 0)
    window  the progress window's q_W on the fp32 run's gradients (uplink) or updates (downlink:
            the lag charged at every step, as the PS's windows since 2026-12-05), W = 16 after
            W/2 warm steps
    adam    the same window weighed in Adam's metric (`WindowProbe`'s `precondition`), as the
            policy prices an uplink whose PS runs Adam or AdamW (since 2026-12-04); uplink only
    curv    downlink, SGD-family: the same window with the lag weighed by the loss's curvature
            (`window_sweep.curvature_lag`, offline only: docs/history/BENCHMARKS-2026.md, "The downlink's lag
            weighed by curvature")

    .venv/bin/python scripts/level_cost.py --model wide-mlp --target 0.9 [--direction down]
        [--levels qsgd:4,powersgd:4,powersgd:2,powersgd:1,topk:0.01+fp16] [--seeds 3]

`--model` takes `package.module:factory` too (run from the folder that holds it), so a model that
is not in the repo can be checked the same way.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from netsense.models import load_task
from netsense.ps.optim import OptimizerSettings
from netsense.transport.hparams import scales_per_coordinate
from netsense.worker.task import TrainTask
from netsense.worker.trials import OptimizerFactory, TaskSampler, TrialRun, run_trials
from window_sweep import window_q  # this folder's: one window of the fp32 run (curvature: its weighed lag)

LEVELS = "qsgd:4,powersgd:4,powersgd:2,powersgd:1,topk:0.01+fp16"


def optimizer_of(task: TrainTask) -> OptimizerFactory:
    """The PS's optimizer of `task`, as the trials build it."""
    return OptimizerSettings.from_dict(dict(task.optimizer)).build


def steps_to_target(task: TrainTask, spec: str | None, args: argparse.Namespace, seed: int) -> int | None:
    torch.manual_seed(seed)
    run = TrialRun(task.build_model(), task.loss, optimizer_of(task), spec, direction=args.direction)
    sampler = TaskSampler(task, seed, args.workers)
    assert task.test_inputs is not None and task.test_targets is not None
    test = (task.test_inputs, task.test_targets)
    for t in range(args.max_steps + 1):
        if t % args.every == 0 and run.evaluate(task.accuracy, test) >= args.target:
            return t
        run.step(sampler.step())
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="wide-mlp")
    p.add_argument("--levels", default=LEVELS)
    p.add_argument("--direction", choices=("up", "down"), default="up")
    p.add_argument("--target", type=float, required=True)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--max-steps", type=int, default=900)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--trial-steps", type=int, default=40)
    args = p.parse_args()
    torch.set_num_threads(1)
    task = load_task(args.model)
    specs = [s for s in args.levels.split(",") if s]
    t0 = time.perf_counter()
    torch.manual_seed(0)
    sampler = TaskSampler(task, 0, args.workers)
    batches = [sampler.step() for _ in range(args.trial_steps)]
    held = TaskSampler(task, 10_000, 1).step()[0]
    trial = run_trials(task.build_model(), task.loss, optimizer_of(task), batches, held, specs, direction=args.direction)
    trial_s = time.perf_counter() - t0
    window = window_q(args.model, specs, 16, 0, args.direction, workers=args.workers, precondition=False)
    per_coordinate = scales_per_coordinate(str(task.optimizer.get("name", "sgd")))
    adam = args.direction == "up" and per_coordinate
    weighed = window_q(args.model, specs, 16, 0, args.direction, workers=args.workers, precondition=True) if adam else {}
    sgd_down = args.direction == "down" and not per_coordinate
    curved = window_q(args.model, specs, 16, 0, args.direction, workers=args.workers, curvature=True) if sgd_down else {}
    base = [steps_to_target(task, None, args, s) for s in range(args.seeds)]
    print(f"{args.model} {args.direction}link, target {args.target}, {args.workers} workers; trial {trial_s:.1f} s")
    print(f"fp32: steps {base}")
    print("| level | steps per seed | q_true | trial | window q_W | adam q_W | curv q_W |")
    print("|---|---|---|---|---|---|---|")
    ref = statistics.mean(b for b in base if b is not None) if any(b is not None for b in base) else None
    for spec in specs:
        steps = [steps_to_target(task, spec, args, s) for s in range(args.seeds)]
        done = [s for s in steps if s is not None]
        q_true = f"{ref / statistics.mean(done):.2f}" if ref and len(done) == len(steps) else "n/r"
        figures = [trial.progress.get(spec), window.get(spec), weighed.get(spec), curved.get(spec)]
        print(
            f"| {spec} | {', '.join('n/r' if s is None else str(s) for s in steps)} | {q_true} | "
            + " | ".join("-" if q is None else f"{q:.2f}" for q in figures) + " |",
            flush=True,
        )


if __name__ == "__main__":
    main()
