"""What a progress window of W steps prices each level at, for several W, on an fp32 run of a model
(docs/history/BENCHMARKS-2026.md, "The downlink's window"). Not a test, and no network: one process plays the PS
and two workers (`netsense.worker.trials.TrialRun`), the task's own model, loss and optimizer.
Compare with the steps each level really costs (`scripts/level_cost.py`).

    .venv/bin/python scripts/window_sweep.py --direction down --models wide-mlp,digits-cnn
        [--windows 2,4,8,16] [--starts 10,60] [--levels qsgd:4,powersgd:4,powersgd:2,powersgd:1]

Downlink: the window is fed the parameters after each update (`cumulative`), as the PS feeds it;
with `--curvature` (SGD-family tasks) each column gives two figures, the lag charged raw (as the
PS's windows charge it) and weighed by the loss's curvature, |lr_eff H r_t|^2 with lr_eff = lr /
(1 - momentum) and H r_t a Hessian-vector product at that step's parameters on the step's batches
(whole-key levels only: PowerSGD; the others stay raw; docs/history/BENCHMARKS-2026.md, "The downlink's lag
weighed by curvature");
uplink: worker 0's gradient, weighed in Adam's metric where the task's optimizer is Adam(W), as
the worker does. Each window starts at step `start` from zero residuals, fills them for `--fill`
steps (default W/2, as the policy's later windows; 0: its first window) and measures W.
`--models` takes `package.module:factory` too.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import torch

from netsense.compression.window import LagEnergy, WindowProbe, sees_whole_keys
from netsense.models import load_task
from netsense.ps.optim import OptimizerSettings
from netsense.transport.hparams import scales_per_coordinate
from netsense.worker.task import TrainTask
from netsense.worker.trials import Batch, TaskSampler, TrialRun


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
    curvature: bool = False,
) -> dict[str, float]:
    """q_W per level of one window of `window` steps from step `start` of seed 0's fp32 run
    (`precondition` None: Adam's metric where the policy would use it, an Adam uplink; `curvature`:
    a downlink's lag weighed by the loss's curvature, `curvature_lag`)."""
    task = load_task(model)
    torch.manual_seed(0)
    run = TrialRun(task.build_model(), task.loss, OptimizerSettings.from_dict(dict(task.optimizer)).build, None, direction=direction)
    sampler = TaskSampler(task, 0, workers)
    for _ in range(start):
        run.step(sampler.step())
    if precondition is None:
        precondition = direction == "up" and scales_per_coordinate(str(task.optimizer.get("name", "sgd")))
    if curvature and direction != "down":
        raise ValueError("--curvature weighs the downlink's lag; the uplink charges its residual once")
    batch: list[Batch] = []
    lag = curvature_lag(task, run, lambda: batch, whole={i for i, s in enumerate(specs) if sees_whole_keys(s)}) if curvature else None
    probe = WindowProbe(
        dict(enumerate(specs)),
        window=window,
        cumulative=direction == "down",
        warm=fill,
        interim=0,
        precondition=precondition,
        lag_energy=lag,
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


def curvature_lag(task: TrainTask, run: TrialRun, batches: Callable[[], Sequence[Batch]], whole: set[int]) -> LagEnergy:
    """A downlink window's `lag_energy`: |lr_eff H r|^2 for the whole-key levels (`whole`), H the
    Hessian of the task's loss at `run`'s parameters on the current `batches` (autograd's double
    backward), lr_eff = lr / (1 - momentum): the error the lag puts into the momentum-integrated
    updates, where |r|^2 bounds it only while lr_eff H <= 1. The other levels' lag stays raw."""
    settings = OptimizerSettings.from_dict(dict(task.optimizer))
    if settings.per_coordinate:
        raise ValueError(f"--curvature prices an SGD-family downlink; {task.name} runs {settings.name}")
    lr_eff = settings.lr / (1.0 - settings.momentum)

    def charge(level: int, residual: Sequence[torch.Tensor]) -> float:
        if level not in whole:
            return sum(float(r.square().sum()) for r in residual)
        x = torch.cat([b[0] for b in batches()])
        y = torch.cat([b[1] for b in batches()])
        grads = torch.autograd.grad(task.loss(run.net(x), y), run.params, create_graph=True)
        hv = torch.autograd.grad(sum((g * r).sum() for g, r in zip(grads, residual)), run.params)
        return sum(float((lr_eff * h).square().sum()) for h in hv)

    return charge


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="wide-mlp,digits-cnn")
    p.add_argument("--direction", choices=("up", "down"), default="down")
    p.add_argument("--windows", default="2,4,8,16")
    p.add_argument("--starts", default="10,60")
    p.add_argument("--levels", default="qsgd:4,powersgd:4,powersgd:2,powersgd:1")
    p.add_argument("--fill", type=int, default=None, help="steps filling the residuals first (default W/2)")
    p.add_argument("--curvature", action="store_true", help="downlink: also the lag weighed by the loss's curvature")
    args = p.parse_args()
    if args.curvature and args.direction != "down":
        p.error("--curvature weighs the downlink's lag: use it with --direction down")
    torch.set_num_threads(1)
    specs = [s for s in args.levels.split(",") if s]
    windows = [int(w) for w in args.windows.split(",")]
    print(f"{args.direction}link q_W per level ({' / '.join(specs)}), fill {'W/2' if args.fill is None else args.fill}"
          + ("; each cell: raw lag, then curvature-weighed" if args.curvature else ""))
    print("| model | from step | " + " | ".join(f"W = {w}" for w in windows) + " |")
    print("|---|---|" + "---|" * len(windows))
    for model in args.models.split(","):
        for start in (int(s) for s in args.starts.split(",")):
            cells = []
            for w in windows:
                q = window_q(model, specs, w, start, args.direction, args.fill)
                cell = " / ".join(f"{q[s]:.2f}" if s in q else "-" for s in specs)
                if args.curvature:
                    qh = window_q(model, specs, w, start, args.direction, args.fill, curvature=True)
                    cell += "; " + " / ".join(f"{qh[s]:.2f}" if s in qh else "-" for s in specs)
                cells.append(cell)
            print(f"| {model} | {start} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
