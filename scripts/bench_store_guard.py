"""What the PS's update check costs per step (docs/BENCHMARKS.md, "Update check"): a plain
`optimizer.step()` vs. `StepGuard.step` on ordinary gradients (the bound proves the step safe: one
read pass, `torch.aminmax`) vs. the copy-step-check path that huge values or keys applied ahead
take. Not a test: timings belong here, not in assertions.

    .venv/bin/python scripts/bench_store_guard.py [--numel 11e6] [--keys 62] [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from netsense.ps.optim import OptimizerSettings
from netsense.ps.store.guard import StepGuard


def _median_ms(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm-up: optimizer state and copy buffers exist from here on
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numel", type=float, default=11e6, help="parameters in all (ResNet-18: 11.2 M)")
    ap.add_argument("--keys", type=int, default=62, help="tensors they are split into")
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()
    n = int(a.numel) // a.keys
    print(f"{a.keys} keys x {n} floats = {a.keys * n / 1e6:.1f} M parameters, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'optimizer':<14}{'step ms':>10}{'guarded ms':>12}{'overhead':>10}{'copy+check ms':>15}")
    for opt in ({"name": "sgd", "lr": 0.1, "momentum": 0.9}, {"name": "adam", "lr": 1e-3}):
        torch.manual_seed(0)
        params = {f"k{i}": torch.randn(n) for i in range(a.keys)}
        optimizer = OptimizerSettings.from_dict(opt).build(list(params.values()))
        for p in params.values():
            p.grad = torch.randn(n) * 1e-2
        guard = StepGuard()
        plain = _median_ms(optimizer.step, a.repeat)
        guarded = _median_ms(lambda: guard.step(optimizer, params, params), a.repeat)
        assert guard.guarded_steps == 0  # ordinary values: the bound proved every step safe
        kept = _median_ms(lambda: (guard.step(optimizer, params, params, keep=True), guard.commit()), a.repeat)
        print(f"{opt['name']:<14}{plain:>10.1f}{guarded:>12.1f}{(guarded - plain) / plain:>+10.0%}{kept:>15.1f}")


if __name__ == "__main__":
    main()
