"""What the downlink's candidate rounds price a level at on one update, in the plain metric and in
an Adam job's own (`netsense.ps.optim.adam_metric`: sqrt(v_hat) + eps per coordinate;
docs/POLICIES.md, "The downlink's metric"). Not a test: one process runs the task's own optimizer
uncompressed (the level trials' `TrialRun`, the task's batch) and at each of `--updates` measures
every candidate on that update alone, as a start round does (`measure_level`: whole keys for
PowerSGD, fresh basis).

    .venv/bin/python scripts/downlink_metric.py --models MODEL[,MODEL...] [--updates 10,30,80] [--seed 0]
"""

from __future__ import annotations

import argparse

import torch

from netsense.compression import make_codec
from netsense.compression.progress import measure_level
from netsense.models import load_task
from netsense.ps.optim import OptimizerSettings, adam_metric
from netsense.worker.trials import TaskSampler, TrialRun

CANDIDATES = ("powersgd:4", "powersgd:2", "powersgd:1", "qsgd:4")


def q(spec: str, update: list[torch.Tensor], weights: list[torch.Tensor] | None) -> float:
    sample = measure_level(make_codec(spec), update, weights=weights)
    return float("nan") if sample is None or sample.progress is None else sample.progress


def run(model: str, updates: list[int], seed: int) -> None:
    task = load_task(model)
    torch.manual_seed(seed)
    settings = OptimizerSettings.from_dict(dict(task.optimizer))
    trial = TrialRun(task.build_model(), task.loss, settings.build, None, direction="down")
    sampler = TaskSampler(task, seed, 2)
    for step in range(1, max(updates) + 1):
        before = [p.detach().clone() for p in trial.params]
        trial.step(sampler.step())
        if step not in updates:
            continue
        update = [p.detach() - b for p, b in zip(trial.params, before)]
        metric = adam_metric(trial.optimizer, {str(i): p for i, p in enumerate(trial.params)})
        weights = list(metric.values()) if metric is not None else None
        cells = [f"{spec} {q(spec, update, None):.2f}" + (f" / {q(spec, update, weights):.2f}" if weights else "") for spec in CANDIDATES]
        print(f"{model} update {step} ({settings.name}; plain / metric): " + " | ".join(cells), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="digits-cnn")
    p.add_argument("--updates", default="10,30,80")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    updates = [int(u) for u in args.updates.split(",")]
    for model in args.models.split(","):
        run(model, updates, args.seed)


if __name__ == "__main__":
    main()
