"""What a progress window of W steps prices each level at, for several W, on an fp32 run of a model
(docs/BENCHMARKS.md, "The downlink's window"). Not a test, and no network: one process plays the PS
and two workers (`netsense.worker.trials.TrialRun`), the task's own model, loss and optimizer.
Compare with the steps each level really costs (`scripts/level_cost.py`).

    .venv/bin/python scripts/window_sweep.py --direction down --models wide-mlp,digits-cnn
        [--windows 2,4,8,16] [--starts 10,60] [--levels qsgd:4,powersgd:4,powersgd:2,powersgd:1]

Downlink: the window is fed the parameters after each update (`cumulative`), as the PS feeds it;
uplink: worker 0's gradient, weighed in Adam's metric where the task's optimizer is Adam(W), as
the worker does. Each window starts at step `start` from zero residuals, fills them for `--fill`
steps (default W/2, as the policy's later windows; 0: its first window) and measures W.
`--models` takes `package.module:factory` too.
"""

from __future__ import annotations

import argparse

import torch

from netsense.compression.window import WindowProbe
from netsense.models import load_task
from netsense.ps.optim import OptimizerSettings
from netsense.transport.hparams import scales_per_coordinate
from netsense.worker.trials import TaskSampler, TrialRun


def window_q(
    model: str,
    specs: list[str],
    window: int,
    start: int,
    direction: str,
    fill: int | None = None,
    *,
    workers: int = 2,
    precondition: bool | None = None,
) -> dict[str, float]:
    """q_W per level of one window of `window` steps from step `start` of seed 0's fp32 run
    (`precondition` None: Adam's metric where the policy would use it, an Adam uplink)."""
    task = load_task(model)
    torch.manual_seed(0)
    run = TrialRun(task.build_model(), task.loss, OptimizerSettings.from_dict(dict(task.optimizer)).build, None, direction=direction)
    sampler = TaskSampler(task, 0, workers)
    for _ in range(start):
        run.step(sampler.step())
    if precondition is None:
        precondition = direction == "up" and scales_per_coordinate(str(task.optimizer.get("name", "sgd")))
    probe = WindowProbe(
        dict(enumerate(specs)), window=window, cumulative=direction == "down", warm=fill, interim=0, precondition=precondition
    )
    while True:
        batch = sampler.step()
        if direction == "down":
            result = probe.feed([p.detach().clone() for p in run.params])
        else:
            run.net.zero_grad(set_to_none=True)
            task.loss(run.net(batch[0][0]), batch[0][1]).backward()
            result = probe.feed([p.grad.detach().clone() for p in run.params])  # worker 0's gradient
        run.step(batch)
        if result is not None:
            return {specs[i]: q for i, q in result.progress.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="wide-mlp,digits-cnn")
    p.add_argument("--direction", choices=("up", "down"), default="down")
    p.add_argument("--windows", default="2,4,8,16")
    p.add_argument("--starts", default="10,60")
    p.add_argument("--levels", default="qsgd:4,powersgd:4,powersgd:2,powersgd:1")
    p.add_argument("--fill", type=int, default=None, help="steps filling the residuals first (default W/2)")
    args = p.parse_args()
    torch.set_num_threads(1)
    specs = [s for s in args.levels.split(",") if s]
    windows = [int(w) for w in args.windows.split(",")]
    print(f"{args.direction}link q_W per level ({' / '.join(specs)}), fill {'W/2' if args.fill is None else args.fill}")
    print("| model | from step | " + " | ".join(f"W = {w}" for w in windows) + " |")
    print("|---|---|" + "---|" * len(windows))
    for model in args.models.split(","):
        for start in (int(s) for s in args.starts.split(",")):
            cells = []
            for w in windows:
                q = window_q(model, specs, w, start, args.direction, args.fill)
                cells.append(" / ".join(f"{q[s]:.2f}" if s in q else "-" for s in specs))
            print(f"| {model} | {start} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
