"""What the PS's update check costs per step (docs/BENCHMARKS.md, "Update check"): a plain
`optimizer.step()` vs. what `StepGuard.step` adds to it on ordinary gradients (the proof: one read
of the mean gradient, `torch.aminmax`, and the carried bounds) vs. the whole copy-step-check path
that huge values and keys applied ahead (pipelined steps) take. Not a test: timings belong here, not in assertions.

    .venv/bin/python scripts/bench_store_guard.py [--numel 11e6] [--keys 62] [--repeat 20]
"""

from __future__ import annotations

import argparse
import time

import torch

from netsense.ps.optim import OptimizerSettings
from netsense.ps.store.guard import StepGuard, amax_each, limit


def _best_ms(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm-up: optimizer state and copy buffers exist from here on
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * min(times)  # best of `repeat`: the 2 shared cores make a median mostly other load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numel", type=float, default=11e6, help="parameters in all (ResNet-18: 11.2 M)")
    ap.add_argument("--keys", type=int, default=62, help="tensors they are split into")
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()
    n = int(a.numel) // a.keys
    print(f"{a.keys} keys x {n} floats = {a.keys * n / 1e6:.1f} M parameters, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'optimizer':<10}{'step ms':>10}{'proof ms':>10}{'proof/step':>12}{'copy+check ms':>15}")
    for opt in ({"name": "sgd", "lr": 0.1, "momentum": 0.9}, {"name": "adam", "lr": 1e-3}):
        torch.manual_seed(0)
        params = {f"k{i}": torch.randn(n) for i in range(a.keys)}
        optimizer = OptimizerSettings.from_dict(opt).build(list(params.values()))
        for p in params.values():
            p.grad = torch.randn(n) * 1e-2
        guard = StepGuard()
        guard.step(optimizer, params, params)  # state exists and bounds are carried from here on
        keys, lim = list(params), limit(params.values())
        plain = _best_ms(optimizer.step, a.repeat)

        def proof() -> None:  # what `StepGuard.step` adds to `optimizer.step()` on an ordinary step
            grads = dict(zip(keys, amax_each([params[k].grad for k in keys])))  # type: ignore[misc]
            assert guard._prove(optimizer, params, keys, grads, lim) is not None

        extra = _best_ms(proof, a.repeat)
        kept = _best_ms(lambda: (guard.step(optimizer, params, params, keep=True), guard.commit()), a.repeat)
        assert guard.guarded_steps == 0  # ordinary values: the bound proved every step safe
        print(f"{opt['name']:<10}{plain:>10.1f}{extra:>10.1f}{extra / plain:>12.0%}{kept:>15.1f}")

if __name__ == "__main__":
    main()
