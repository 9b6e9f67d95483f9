"""How close a progress window's interim figures come to its final one, on the run's first window
(docs/POLICIES.md, "Interim figures"). Not a test, and no network: one process plays the PS and
two workers (`netsense.worker.trials.TrialRun`), the task's own model, loss and optimizer; the
window is fed worker 0's gradient from step 0, as a worker's first window is (no fill steps, Adam's
metric where the task runs Adam).

    .venv/bin/python scripts/interim_projection.py --models wide-mlp,digits-cnn,charlm [--seeds 0,1,2]

Per model and seed, each level's figure as the window gave it at W/4 steps before projection
(`raw`), its interim figures (projected to W) at W/4 and W/2, and the window's final q_W; last, the
mean distance of each from the final figure. `--models` takes `package.module:factory` too.
"""

from __future__ import annotations

import argparse

import torch

from netsense.compression.policy.ladder import DEFAULT_LADDER
from netsense.compression.window import WindowProbe
from netsense.models import load_task
from netsense.ps.optim import OptimizerSettings
from netsense.transport.hparams import scales_per_coordinate
from netsense.worker.trials import TaskSampler, TrialRun


def first_window(model: str, seed: int, specs: list[str], window: int) -> dict[str, dict[str, float]]:
    """Figures per kind (`raw`, one per interim step, `final`) per level spec, from one first window."""
    task = load_task(model)
    torch.manual_seed(seed)
    run = TrialRun(task.build_model(), task.loss, OptimizerSettings.from_dict(dict(task.optimizer)).build, None, direction="up")
    sampler = TaskSampler(task, seed, 2)
    precondition = scales_per_coordinate(str(task.optimizer.get("name", "sgd")))
    levels = dict(enumerate(specs))
    probe = WindowProbe(levels, window=window, warm=0, precondition=precondition)
    raw = WindowProbe(levels, window=window // 4, warm=0, interim=0, precondition=precondition)
    out: dict[str, dict[str, float]] = {}
    while not probe.done:
        batch = sampler.step()
        run.net.zero_grad(set_to_none=True)
        task.loss(run.net(batch[0][0]), batch[0][1]).backward()
        grads = [p.grad.detach().clone() for p in run.params if p.grad is not None]
        for name, p in (("probe", probe), ("raw", raw)):
            if p.done:
                continue
            result = p.feed(grads)
            if result is not None:
                kind = "raw" if name == "raw" else (f"at {result.steps}" if result.interim else "final")
                out[kind] = {specs[i]: q for i, q in result.progress.items()}
        run.step(batch)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="wide-mlp,digits-cnn,charlm")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--levels", default=",".join(s for s in DEFAULT_LADDER.split(",") if s not in ("fp32", "fp16", "qsgd:8")))
    args = p.parse_args()
    torch.set_num_threads(1)
    specs = args.levels.split(",")
    gaps: dict[str, list[float]] = {}
    for model in args.models.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            figures = first_window(model, seed, specs, args.window)
            final = figures["final"]
            kinds = [k for k in figures if k != "final"]
            print(f"{model} seed {seed}:")
            for spec in specs:
                if spec not in final:
                    continue
                cells = "  ".join(f"{k} {figures[k][spec]:.3f}" for k in kinds if spec in figures[k])
                print(f"  {spec:16s} {cells}  final {final[spec]:.3f}")
                for k in kinds:
                    if spec in figures[k]:
                        gaps.setdefault(k, []).append(abs(figures[k][spec] - final[spec]))
    print("mean |figure - final|: " + ", ".join(f"{k} {sum(v) / len(v):.3f}" for k, v in gaps.items()))


if __name__ == "__main__":
    main()
