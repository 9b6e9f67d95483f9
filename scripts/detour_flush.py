"""What a detour through a level does to a run: accuracy every `--every` steps while a level
schedule plays (docs/POLICIES.md, "The ladder": the flush after top-k 0.1 %).

One process plays the PS and `--workers` workers on the task's own model, batches, loss and
optimizer: each worker's gradient goes through error feedback at the step's level (one codec per
key and level, `KeyCodecs`, as a sender keeps them), the PS averages the decoded pushes and steps.
Each schedule holds `--base` from step 0, takes `--detour` for `--length` steps from `--at`, then
`--after`; the first line holds `--base` throughout.

    .venv/bin/python scripts/detour_flush.py --model wide-mlp --detour topk:0.001+fp16
"""

from __future__ import annotations

import argparse

import torch

from netsense.compression.feedback import ErrorFeedback
from netsense.compression.keycodecs import KeyCodecs
from netsense.models import load_task
from netsense.ps.optim import OptimizerSettings


def run(task, schedule: list[str], workers: int, every: int, seed: int, drain: float = 0.0, forget: bool = False) -> list[float]:  # type: ignore[no-untyped-def]
    """Test accuracy every `every` steps; `drain` > 0: at a change of level each key's residual
    becomes a backlog that is released at most `drain` x the key's gradient norm a step; `forget`:
    it is dropped instead (experiments: error feedback itself flushes it whole)."""
    torch.manual_seed(seed)
    model = task.build_model()
    opt = OptimizerSettings.from_dict(dict(task.optimizer)).build(list(model.parameters()))
    gen = torch.Generator().manual_seed(seed + 1)
    feedback, codecs = [ErrorFeedback() for _ in range(workers)], [KeyCodecs() for _ in range(workers)]
    accuracy = []
    backlog: list[dict[str, torch.Tensor]] = [{} for _ in range(workers)]
    for step, spec in enumerate(schedule):
        switched = step > 0 and spec != schedule[step - 1]
        total = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
        for w in range(workers):
            idx = torch.randint(0, len(task.train_inputs), (task.batch_size,), generator=gen)
            model.zero_grad()
            task.loss(model(task.train_inputs[idx]), task.train_targets[idx]).backward()
            for n, p in model.named_parameters():
                codec = codecs[w].get(n, spec)
                grad = p.grad.detach().clone()
                if drain > 0 or forget:
                    owed = feedback[w].residual(n) if switched else None
                    if owed is not None:  # moved aside: error feedback starts the new level from zero
                        feedback[w].reset(n)
                        backlog[w][n] = backlog[w][n] + owed if n in backlog[w] else owed
                    held = backlog[w].get(n)
                    if held is not None:
                        share = 0.0 if forget else min(1.0, drain * float(grad.norm()) / max(float(held.norm()), 1e-30))
                        grad += share * held
                        backlog[w][n] = held * (1 - share)
                payload, _ = feedback[w].compress(n, grad, codec)
                total[n] += codec.decode(payload).view_as(p) / workers
        for n, p in model.named_parameters():
            p.grad = total[n]
        opt.step()
        if (step + 1) % every == 0:
            model.eval()
            with torch.no_grad():
                accuracy.append(task.accuracy(model(task.test_inputs), task.test_targets))
            model.train()
    return accuracy


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="wide-mlp")
    p.add_argument("--base", default="powersgd:2")
    p.add_argument("--detour", default="topk:0.001+fp16", help="comma-separated: one schedule each")
    p.add_argument("--after", default="powersgd:1")
    p.add_argument("--at", type=int, default=60)
    p.add_argument("--length", type=int, default=40)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--drain", type=float, default=0.0, help="also run each detour with the owed residual released at most this x the gradient's norm a step")
    p.add_argument("--forget", action="store_true", help="also run each detour with the residual dropped at each change of level")
    args = p.parse_args()
    if min(args.at, args.length, args.every, args.workers) < 1 or args.at + args.length > args.steps:
        p.error("--at, --length, --every and --workers must be >= 1, and --at + --length <= --steps")
    torch.set_num_threads(1)
    task = load_task(args.model)
    if task.train_inputs is None or task.test_inputs is None:
        p.error(f"{args.model} holds its data as a Dataset; this script indexes tensor-form tasks (train_inputs, test_inputs)")
    rows = [(args.base, [args.base] * args.steps)]
    for detour in args.detour.split(","):
        tail = args.steps - args.at - args.length
        rows.append((f"{args.base} > {detour} ({args.at}-{args.at + args.length}) > {args.after}",
                     [args.base] * args.at + [detour] * args.length + [args.after] * tail))  # fmt: skip
    print(f"{args.model} ({task.optimizer.get('name', 'sgd')}): test accuracy every {args.every} steps")
    for name, schedule in rows:
        print(f"  {name:48s} " + " ".join(f"{a:.2f}" for a in run(task, schedule, args.workers, args.every, args.seed)))
        if name == args.base:
            continue
        if args.drain > 0:
            drained = run(task, schedule, args.workers, args.every, args.seed, drain=args.drain)
            print(f"  {'  drained at ' + str(args.drain) + 'x |g|':48s} " + " ".join(f"{a:.2f}" for a in drained))
        if args.forget:
            forgot = run(task, schedule, args.workers, args.every, args.seed, forget=True)
            print(f"  {'  residual dropped at each change':48s} " + " ".join(f"{a:.2f}" for a in forgot))


if __name__ == "__main__":
    main()
