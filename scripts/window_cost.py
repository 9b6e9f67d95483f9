"""What one progress-window step costs each ladder level on a model's keys, on the thread's CPU
clock (docs/POLICIES.md, "Schedule and cost"; docs/history/BENCHMARKS-2026.md, "Window steps without the wire
format"). Not a test: random gradients of the model's parameter shapes, one intra-op thread as a
window runs, `WindowProbe` with one level at a time and then with all of them, W = 16, no fill;
the first feed (codec set-up) is not timed.

    .venv/bin/python scripts/window_cost.py [--models digits-cnn,wide-mlp] [--steps 24]
"""

from __future__ import annotations

import argparse
import time

import torch

from netsense.compression.policy.ladder import DEFAULT_LADDER
from netsense.compression.window import WindowProbe
from netsense.models import load_task


def step_ms(specs: dict[int, str], steps: list[list[torch.Tensor]]) -> float:
    """Mean thread CPU ms of a window step over `specs`, after an untimed first feed."""
    probe = WindowProbe(specs, window=len(steps), warm=0)
    probe.feed(steps[0])
    t0 = time.thread_time()
    for tensors in steps[1:]:
        probe.feed(tensors)
    return (time.thread_time() - t0) / (len(steps) - 1) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="digits-cnn,wide-mlp,charlm", help="comma-separated registered models")
    ap.add_argument("--steps", type=int, default=24, help="window steps fed per measurement (>= 3)")
    args = ap.parse_args()
    if args.steps < 3:
        ap.error("--steps must be >= 3")
    torch.set_num_threads(1)
    lossy = {i: spec for i, spec in enumerate(DEFAULT_LADDER.split(",")) if spec != "fp32"}
    for model in args.models.split(","):
        shapes = [p.shape for p in load_task(model).build_model().parameters()]
        gen = torch.Generator().manual_seed(0)
        steps = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(args.steps)]
        print(f"{model} ({sum(s.numel() for s in shapes)} parameters): ms of thread CPU per window step")
        for level, spec in lossy.items():
            print(f"  {spec:18s} {step_ms({level: spec}, steps):8.2f}")
        print(f"  {'all ' + str(len(lossy)):18s} {step_ms(lossy, steps):8.2f}")


if __name__ == "__main__":
    main()
