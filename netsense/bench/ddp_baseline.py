"""Peer baseline: PyTorch DDP (gloo over TCP) with its fp16 / PowerSGD hooks, across a `tbf` bottleneck.

Two ranks in network namespaces (`netsense.transport.emulation.netns`): rank 0 in the server namespace, the
other ranks in the client namespace, so every all-reduce crosses the router's `tbf` both ways.
The same model, seed, batch order (`worker_batch`) and optimizer settings as a NetSense job; the
optimizer runs on every rank on the averaged gradient (DDP's contract). Rank 0 evaluates every
``--eval-every`` steps and prints the same step/eval JSON events as a NetSense worker, so
`netsense.bench.results.policy_figures` computes the same figures.

Bytes are the kernel's counters of the client namespace's veth (tx = up through the bottleneck,
rx = down), read by the client-side rank; the ideal step of a DDP run is the transfer bound only
(its compute overlaps the all-reduce inside backward and is not timed separately).

Run one rank by hand: ``python -m netsense.bench.ddp_baseline --rank 0 --world-size 2 --master HOST:PORT``;
`run_ddp` builds the namespaces and runs all ranks (root only; `netns_available()` says why not).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HOOKS = ("none", "fp16", "powersgd")
"""DDP communication hooks: fp32 all-reduce, fp16 compression, PowerSGD rank-2 with error feedback."""
MASTER_PORT = 29517


def _net_bytes() -> tuple[int, int]:
    """(tx, rx) bytes of every interface but loopback in this process's network namespace."""
    tx = rx = 0
    for iface in Path("/sys/class/net").iterdir():
        if iface.name == "lo":
            continue
        tx += int((iface / "statistics" / "tx_bytes").read_text())
        rx += int((iface / "statistics" / "rx_bytes").read_text())
    return tx, rx


def _make_optimizer(params: Any, settings: dict[str, Any]) -> Any:
    import torch

    s = dict(settings)
    name = s.pop("name", "sgd")
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[name]
    return cls(params, **s)


def run_rank(args: argparse.Namespace) -> int:
    """One DDP rank: train, print JSON events (rank 0 evaluates)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel

    from netsense.models import load_task
    from netsense.worker.trainer import build_model, evaluate, worker_batch

    torch.set_num_threads(1)
    task = load_task(args.model)
    # Gloo binds to the address of the hostname (127.0.0.1 here): point it at the namespace's veth.
    ifaces = sorted(i.name for i in Path("/sys/class/net").iterdir() if i.name != "lo")
    if ifaces:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", ifaces[0])
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.rank, world_size=args.world_size)
    model = DistributedDataParallel(build_model(task, args.seed))
    if args.hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif args.hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    opt = _make_optimizer(model.parameters(), {**task.optimizer, **json.loads(args.optimizer or "{}")})
    steps, b, n = args.steps or task.steps, args.batch_size or task.batch_size, len(task.train_inputs)
    tx0, rx0 = _net_bytes()
    dist.barrier()
    t0 = time.perf_counter()
    for step in range(steps):
        idx = worker_batch(step, rank=args.rank, world_size=args.world_size, batch_size=b, seed=args.seed, n=n)
        loss = task.loss(model(task.train_inputs[idx]), task.train_targets[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        tx, rx = _net_bytes()
        wall = time.perf_counter() - t0
        print(json.dumps({"event": "step", "step": step + 1, "steps": steps, "loss": loss.item(), "wall_s": wall,
                          "bytes_up": tx - tx0, "bytes_down": rx - rx0, "codec": args.hook}), flush=True)  # fmt: skip
        last = step + 1 == steps
        due = bool(args.eval_every) and (step + 1) % args.eval_every == 0
        if args.rank == 0 and (due or last):
            acc, _ = evaluate(task, model.module)
            print(json.dumps({"event": "eval", "step": step + 1, "test_accuracy": acc,
                              "wall_s": wall if last else time.perf_counter() - t0}), flush=True)  # fmt: skip
        if due and not last:
            dist.barrier()  # the others wait for rank 0's evaluation, as NetSense workers do at the PS
    # Leave together: a rank that tore gloo down while rank 0 still evaluated the last step aborted
    # now and then ("terminate called without an active exception", 1 run in ~10).
    dist.barrier()
    dist.destroy_process_group()
    return 0


def run_ddp(
    *, model: str, hook: str, link: str, workers: int = 2, steps: int | None = None, seed: int = 0,
    batch_size: int | None = None, eval_every: int = 10, max_time_s: float = 900.0,
) -> dict[int, list[dict[str, Any]]]:  # fmt: skip
    """All ranks inside a `NetnsTopology(link)`; returns each rank's JSON events (rank 0 has evals)."""
    from netsense.transport.emulation.netns import NetnsTopology

    with NetnsTopology(link) as topo:
        procs = []
        for rank in range(workers):
            argv = [sys.executable, "-m", "netsense.bench.ddp_baseline", "--model", model, "--hook", hook, "--rank", str(rank),
                    "--world-size", str(workers), "--master", f"{topo.server_ip}:{MASTER_PORT}", "--seed", str(seed),
                    "--eval-every", str(eval_every)]  # fmt: skip
            if steps:
                argv += ["--steps", str(steps)]
            if batch_size:
                argv += ["--batch-size", str(batch_size)]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
            procs.append(topo.popen("server" if rank == 0 else "client", argv, stdout=subprocess.PIPE, text=True, env=env))
        events: dict[int, list[dict[str, Any]]] = {}
        deadline = time.monotonic() + max_time_s + 120
        for rank, p in enumerate(procs):
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if p.returncode != 0:
                raise RuntimeError(f"DDP rank {rank} ({hook}) exited with status {p.returncode}")
            events[rank] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return events


def figures(events: dict[int, list[dict[str, Any]]], *, link: str, target: float, global_batch: int) -> dict[str, Any]:
    """The scenario figures of a DDP run (bytes from the client-side rank's counters)."""
    from netsense.bench.results import policy_figures
    from netsense.transport.emulation.linkspec import parse_link

    client = {e["step"]: e for e in events[1] if e["event"] == "step"}
    steps = {0: {e["step"]: {**e, "bytes_up": client[e["step"]]["bytes_up"], "bytes_down": client[e["step"]]["bytes_down"]}
                 for e in events[0] if e["event"] == "step" and e["step"] in client}}  # fmt: skip
    evals = [e for e in events[0] if e["event"] == "eval"]
    return policy_figures(steps=steps, evals=evals, decisions={}, link_t0=None, spec=parse_link(link), target=target,
                          global_batch=global_batch)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m netsense.bench.ddp_baseline", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="digits-cnn")
    p.add_argument("--hook", choices=HOOKS, default="none")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--master", required=True, metavar="HOST:PORT")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--optimizer", help="JSON overrides of the task's optimizer settings")
    return run_rank(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
