"""Peer baseline: PyTorch DDP (gloo over TCP) with its fp16 / PowerSGD hooks, across a `tbf` bottleneck.

Ranks in network namespaces. By default (``topology="sites"``) rank r runs at site r of a
`SitesTopology`, as a NetSense worker of `netsense bench scenario` does, with a tbf link between each
pair of sites: a 2-rank ring moves one model each way across it. ``topology="bottleneck"``: rank 0
in the server namespace of a `NetnsTopology`, the other ranks in the client namespace.
The same model, seed, batch order (`worker_batch`) and optimizer settings as a NetSense job; the
optimizer runs on every rank on the averaged gradient (DDP's contract). Rank 0 evaluates every
``--eval-every`` steps and prints the same step/eval JSON events as a NetSense worker, so
`netsense.bench.results.policy_figures` computes the same figures.

Bytes are the kernel's counters of rank 1's veth (tx = up through the bottleneck, rx = down),
read by that rank; with sites, `run_ddp` also reports what the router forwarded into each site; the ideal step of a DDP run is the transfer bound only
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
import threading
import time
from pathlib import Path
from typing import IO, Any

from netsense.errors import ProcessFailed
from netsense.launch import PYTHON

HOOKS = ("none", "fp16", "powersgd")
"""DDP communication hooks: fp32 all-reduce, fp16 compression, PowerSGD rank-2 with error feedback."""
MASTER_PORT = 29517
HANG_GRACE_S = 120.0
"""Seconds past `run_ddp`'s ``max_time_s`` (start-up, the last step, the last eval) before ranks that
have not ended are taken for hung: a rank blocked in a collective never reports the step that
would stop the run at its time limit."""
FAIL_GRACE_S = 5.0
"""After a rank fails, how long the others get to end on their own before they are stopped: a rank
that raises takes its peers down with it ("Connection closed by peer"), and the peer's abort can
be seen first; the report names every rank that failed, the cause first."""
PEER_LOSS = ("Connection closed by peer", "Connection reset by peer")
"""gloo's words for a peer that went away: an effect of another rank's failure, reported after it."""


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


def _powersgd_bucket_by_bucket(state: Any, bucket):  # type: ignore[no-untyped-def]
    """torch's `powerSGD_hook`, waited for before DDP hands the hook its next bucket.

    The hook all-reduces a bucket in three collectives: the uncompressed tensors from the calling
    (autograd) thread, then P and Q from ``.then`` callbacks on gloo's worker threads. Meanwhile
    the autograd thread goes on and starts the next bucket's first all-reduce, so with two buckets
    or more the order in which a rank issues its collectives depends on timing. Gloo matches
    collectives across ranks by that order (ProcessGroupGloo: "expected to be called in the same
    order across processes"): one rank's P met the other's next uncompressed tensors, and gloo
    aborted ("op.preamble.length <= op.nbytes. 1044 vs 512 ... collective mismatch", issue 15) or
    both ranks waited for ever. Waiting keeps every rank's order that of the buckets; it gives up
    overlapping one bucket's compression with the rest of backward.

    `bucket` and the result are unannotated: DDP's `register_comm_hook` accepts no annotation but
    the classes themselves, and ``from __future__ import annotations`` would hand it strings.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    fut = powerSGD_hook.powerSGD_hook(state, bucket)
    fut.wait()
    return fut


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
        model.register_comm_hook(state, _powersgd_bucket_by_bucket)
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


def _pump(stream: IO[str], lines: list[str], echo: IO[str] | None = None) -> None:
    """Append every line of `stream` to `lines` (a reader thread), copying it to `echo` if given."""
    for line in stream:
        lines.append(line)
        if echo is not None:
            echo.write(line)
            echo.flush()


def _last_error(lines: list[str]) -> str:
    """The line of a rank's stderr that says why it ended: the last error line, else the last line."""
    text = [line.strip() for line in lines if line.strip()]
    errors = [line for line in text if "Error" in line or "what():" in line or "enforce fail" in line]
    return (errors or text or ["no stderr"])[-1][:500]


def run_ddp(
    *, model: str, hook: str, link: str, workers: int = 2, steps: int | None = None, seed: int = 0,
    batch_size: int | None = None, eval_every: int = 10, max_time_s: float = 900.0, topology: str = "sites",
    wan_out: dict[str, int] | None = None, sites: int | None = None,
) -> dict[int, list[dict[str, Any]]]:  # fmt: skip
    """All ranks inside a `SitesTopology` (rank r at site ``s{r}``, or with `sites` the ranks
    spread evenly over that many sites in rank order, as `netsense bench scenario --sites` puts
    NetSense's workers; ``topology="bottleneck"``: a
    `NetnsTopology(link)`); returns each rank's JSON events (rank 0 has evals). With sites,
    `wan_out` receives the bytes the router forwarded into each site during the run.

    `max_time_s` is the guard of a NetSense job in `netsense bench scenario`: when rank 0 reports a
    step past it the ranks are stopped (SIGTERM) and the events are those printed so far, so the
    run has fewer steps than asked. ProcessFailed when a rank exits with an error (the message has
    the status and the rank's last error line) or when the ranks have not ended `HANG_GRACE_S`
    after `max_time_s`.
    """
    from netsense.transport.emulation.netns import NetnsTopology
    from netsense.transport.emulation.sites import SitesTopology

    if topology not in ("sites", "bottleneck"):
        raise ValueError(f"topology must be 'sites' or 'bottleneck', got {topology!r}")
    from netsense.bench.topology import rank_site_names

    placed = rank_site_names(workers, sites)
    sites_names = list(dict.fromkeys(placed))
    with SitesTopology(sites_names, link) if topology == "sites" else NetnsTopology(link) as topo:
        master = topo.ip(placed[0]) if isinstance(topo, SitesTopology) else topo.server_ip
        before = topo.wan_bytes() if isinstance(topo, SitesTopology) else {}
        procs: list[subprocess.Popen[str]] = []
        outs: list[list[str]] = []
        errs: list[list[str]] = []
        readers: list[threading.Thread] = []
        for rank in range(workers):
            argv = [*PYTHON, "-m", "netsense.bench.ddp_baseline", "--model", model, "--hook", hook, "--rank", str(rank),
                    "--world-size", str(workers), "--master", f"{master}:{MASTER_PORT}", "--seed", str(seed),
                    "--eval-every", str(eval_every)]  # fmt: skip
            if steps:
                argv += ["--steps", str(steps)]
            if batch_size:
                argv += ["--batch-size", str(batch_size)]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
            where = placed[rank] if isinstance(topo, SitesTopology) else "server" if rank == 0 else "client"
            p = topo.popen(where, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # type: ignore[arg-type]
            procs.append(p)
            outs.append([])
            errs.append([])
            readers.append(threading.Thread(target=_pump, args=(p.stdout, outs[rank]), daemon=True))
            readers.append(threading.Thread(target=_pump, args=(p.stderr, errs[rank], sys.stderr), daemon=True))
        for t in readers:
            t.start()
        _supervise(procs, outs, errs, readers, hook=hook, max_time_s=max_time_s)
        if isinstance(topo, SitesTopology) and wan_out is not None:
            after = topo.wan_bytes()
            wan_out.update({s: after[s] - before[s] for s in sites_names})
    for t in readers:
        t.join(timeout=2.0)
    # A rank stopped mid-write leaves a partial last line: keep the complete ones.
    return {rank: [json.loads(line) for line in out if line.startswith("{") and line.endswith("\n")]
            for rank, out in enumerate(outs)}  # fmt: skip


def _supervise(
    procs: list[subprocess.Popen[str]], outs: list[list[str]], errs: list[list[str]], readers: list[threading.Thread],
    *, hook: str, max_time_s: float,
) -> None:  # fmt: skip
    """Wait until every rank exits 0, or stop them all at `max_time_s`; ProcessFailed on an error or a hang."""
    from netsense.launch.launcher import stop_processes

    deadline = time.monotonic() + max_time_s + HANG_GRACE_S
    while True:
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes):
            raise ProcessFailed(_failure(procs, outs, errs, readers, hook=hook))
        if all(c == 0 for c in codes):
            return
        step_lines = (line for line in reversed(outs[0]) if '"event": "step"' in line and line.endswith("\n"))
        last = next((json.loads(line) for line in step_lines), None)
        if last is not None and float(last["wall_s"]) > max_time_s:
            # All at once: a rank that outlives its peer by a moment prints gloo's "Connection reset".
            stop_processes(procs)
            return
        if time.monotonic() > deadline:
            stop_processes(procs)
            step = last["step"] if last is not None else 0
            raise ProcessFailed(f"DDP ranks ({hook}) still ran {max_time_s:g} s + {HANG_GRACE_S:g} s after they "
                                f"started, rank 0 at step {step}: hung")  # fmt: skip
        time.sleep(0.2)


def _failure(
    procs: list[subprocess.Popen[str]], outs: list[list[str]], errs: list[list[str]], readers: list[threading.Thread], *, hook: str
) -> str:
    """Why the run failed, once one rank has: the others get `FAIL_GRACE_S` to end on their own
    (then all are stopped), and every rank that failed is named, with the last step it reported,
    those whose last error is only a lost peer (`PEER_LOSS`) after the rest."""
    from netsense.launch.launcher import stop_processes

    deadline = time.monotonic() + FAIL_GRACE_S
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    codes = [p.poll() for p in procs]
    stop_processes(procs)
    failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
    for r in failed:
        readers[2 * r + 1].join(timeout=2.0)  # the rank's last words
    why = {r: _last_error(errs[r]) for r in failed}
    failed.sort(key=lambda r: any(words in why[r] for words in PEER_LOSS))
    return "; ".join(
        f"DDP rank {r} ({hook}) exited with status {codes[r]}: {why[r]} (its last step: {_last_step(outs[r])})" for r in failed
    )


def _last_step(lines: list[str]) -> int | None:
    """The step of a rank's last step event (None before its first): where in the run it failed."""
    for line in reversed(lines):
        if '"event": "step"' in line:
            try:
                return int(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):
                continue
    return None


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
    code = main()  # an error raises before this line, with its traceback and exit status
    # Done: every step and eval is printed and the process group destroyed. Interpreter teardown
    # still aborted now and then in torch's C++ destructors ("terminate called without an active
    # exception", status -6, 2 rows in ~60, each after its last step: docs/BENCHMARKS.md), which
    # failed a complete row. Nothing is left to flush or measure, so the teardown is skipped.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
