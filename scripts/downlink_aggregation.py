"""Steps to a target when W workers each push a lossy level under error feedback and the update
is formed three ways (docs/history/BENCHMARKS-2026.md, "What the PS's second compression costs"). Not a test:
one process, the task's own model, optimizer and batches, no network.

- ``recompress``: the PS averages the decoded pushes and compresses the mean again under error
  feedback of its own, at the same level: the gradient-domain downlink as built (ps/store/gradient.py).
- ``exact``: the update is the exact mean of the decoded pushes, what sending every worker's
  payload back would give (for PowerSGD: every push's factors, rank W x r at W x the bytes).
- ``ddp``: one compression of the mean of the workers' error-fed gradients, each worker keeping
  its own residual against it: what DDP's PowerSGD hook computes with its two all-reduces.

    .venv/bin/python scripts/downlink_aggregation.py --model digits-cnn --target 0.9 \\
        --spec powersgd:2 [--seeds 0,1,2] [--workers 2] [--ways recompress,exact,ddp]
"""

from __future__ import annotations

import argparse

import torch

from netsense.compression import make_codec
from netsense.models import load_task
from netsense.ps.optim import OptimizerSettings
from netsense.worker.task import TrainTask
from netsense.worker.trainer import evaluate
from netsense.worker.trials import TaskSampler

WAYS = ("recompress", "exact", "ddp")


def steps_to_target(task: TrainTask, spec: str, way: str, seed: int, *, workers: int, target: float, every: int, max_steps: int) -> int | None:
    """The first step (a multiple of `every`) whose test accuracy reaches `target`; None if none does."""
    torch.manual_seed(seed)
    net = task.build_model()
    params = list(net.parameters())
    optimizer = OptimizerSettings.from_dict(dict(task.optimizer)).build(params)
    sampler = TaskSampler(task, seed, workers)
    pushers = [[make_codec(spec) for _ in params] for _ in range(workers)]  # each keeps its own PowerSGD basis
    server = [make_codec(spec) for _ in params]
    residual: list[list[torch.Tensor | None]] = [[None] * len(params) for _ in range(workers)]
    server_residual: list[torch.Tensor | None] = [None] * len(params)
    for step in range(max_steps + 1):
        if step % every == 0 and evaluate(task, net)[0] >= target:
            return step
        grads = []
        for batch in sampler.step():
            net.zero_grad()
            task.loss(net(batch[0]), batch[1]).backward()
            grads.append([p.grad.detach().clone() for p in params])  # type: ignore[union-attr]
        for k, param in enumerate(params):
            fed = [g[k] if r[k] is None else g[k] + r[k] for g, r in zip(grads, residual)]
            if way == "ddp":
                update = server[k].roundtrip(sum(fed) / workers)
                for w in range(workers):
                    residual[w][k] = fed[w] - update
            else:
                sent = []
                for w in range(workers):
                    decoded = pushers[w][k].roundtrip(fed[w])
                    residual[w][k] = fed[w] - decoded
                    sent.append(decoded)
                update = sum(sent) / workers
                if way == "recompress":
                    m = update if server_residual[k] is None else update + server_residual[k]
                    update = server[k].roundtrip(m)
                    server_residual[k] = m - update
            param.grad = update
        optimizer.step()
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="digits-cnn")
    p.add_argument("--target", type=float, required=True, help="test accuracy to reach")
    p.add_argument("--spec", default="powersgd:2", help="the level every worker pushes")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--ways", default=",".join(WAYS))
    p.add_argument("--every", type=int, default=5, help="evaluate every N steps")
    p.add_argument("--max-steps", type=int, default=400)
    args = p.parse_args()
    ways = args.ways.split(",")
    if unknown := set(ways) - set(WAYS):
        p.error(f"--ways: unknown {sorted(unknown)}; use {', '.join(WAYS)}")
    if args.workers < 1 or args.every < 1:
        p.error("--workers and --every must be >= 1")
    make_codec(args.spec)  # a typo fails here, before any training
    torch.set_num_threads(1)
    task = load_task(args.model)
    seeds = [int(s) for s in args.seeds.split(",")]
    for way in ways:
        found = [
            steps_to_target(task, args.spec, way, s, workers=args.workers, target=args.target, every=args.every, max_steps=args.max_steps)
            for s in seeds
        ]
        print(f"{args.model} {args.spec} x{args.workers} {way}: steps to {args.target} per seed {found}", flush=True)


if __name__ == "__main__":
    main()
