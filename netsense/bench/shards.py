"""`netsense bench shards`: aggregate PUSH ingest (MB/s) of S PS shard processes fed by W worker processes.

Every PS shard and every worker is its own process on loopback (`netsense ps`, and this module run
as a worker), as in a real job. Each worker holds a synthetic model of `--mb` MB of fp32 in
`--keys` equal tensors, spread over the shards by `assign_shards`, and runs synchronous steps
through `NetSenseOptimizer`. The ingest window of a step runs from the first worker's first push
byte to the last worker's last push ack (one monotonic clock for all processes), so it counts what
the shards take in and not the downlink that follows; the figure is the median over steps of
W * payload / window.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from netsense.transport.tls import LOOPBACK_MAX_DATAGRAM_SIZE
from netsense.launch import PYTHON


def register(kinds: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = kinds.add_parser(
        "shards",
        help="aggregate PUSH ingest of S PS shard processes with W worker processes",
        description=__doc__,
        epilog="Example: netsense bench shards --servers 1,2 --workers 2,4,8 --mb 16 --json shards.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--servers", default="1,2", help="comma-separated shard counts (default 1,2)")
    p.add_argument("--workers", default="2,4", help="comma-separated worker counts (default 2,4)")
    p.add_argument("--mb", type=float, default=16.0, help="fp32 payload per worker per step, MB (default 16)")
    p.add_argument("--keys", type=int, default=16, help="equal-size tensors the payload is split into (default 16)")
    p.add_argument("--steps", type=int, default=6, help="measured steps after one warm-up step (default 6)")
    p.add_argument("--max-datagram-size", type=int, default=LOOPBACK_MAX_DATAGRAM_SIZE, help="QUIC packet payload")
    p.add_argument("--json", metavar="PATH", help="write results here")
    p.set_defaults(func=run)


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def run(args: argparse.Namespace) -> int:
    results = []
    for servers in _ints(args.servers):
        for workers in _ints(args.workers):
            r = measure(servers, workers, mb=args.mb, keys=args.keys, steps=args.steps, mds=args.max_datagram_size)
            results.append(r)
            print(
                f"servers {servers}  workers {workers:2d}  ingest {r['ingest_MBps']:7.1f} MB/s  "
                f"step {r['step_s']:.3f} s  push window {r['window_s']:.3f} s",
                flush=True,
            )
    base = {r["workers"]: r["ingest_MBps"] for r in results if r["servers"] == 1}
    for r in results:
        if r["servers"] > 1 and r["workers"] in base:
            r["vs_1_shard"] = r["ingest_MBps"] / base[r["workers"]]
            print(f"{r['servers']} shards vs 1 shard, {r['workers']} workers: {r['vs_1_shard']:.2f}x")
    out = {"mb_per_worker": args.mb, "keys": args.keys, "steps": args.steps, "cpus": os.cpu_count(), "runs": results}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


def measure(servers: int, workers: int, *, mb: float, keys: int, steps: int, mds: int) -> dict[str, Any]:
    """One configuration: start the shards and workers, collect each worker's push windows."""
    py = [*PYTHON, "-m", "netsense"]
    procs: list[subprocess.Popen[str]] = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="netsense-bench-shards-") as tmp:
        env["XDG_CACHE_HOME"] = tmp
        try:
            ports = []
            for _ in range(servers):
                ps = subprocess.Popen(
                    [*py, "ps", "--insecure", "--port", "0", "--max-datagram-size", str(mds)],
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                )  # fmt: skip
                procs.append(ps)
                ports.append(_ready_port(ps))
            spec = {"ps": ports, "workers": workers, "mb": mb, "keys": keys, "steps": steps, "mds": mds}
            ws = [
                subprocess.Popen(
                    [*PYTHON, "-m", "netsense.bench.shards", json.dumps({**spec, "rank": r})],
                    stdout=subprocess.PIPE, text=True, env=env,
                )  # fmt: skip
                for r in range(workers)
            ]
            procs += ws
            reports = []
            for w in ws:
                out, _ = w.communicate(timeout=600)
                if w.returncode != 0:
                    raise RuntimeError(f"bench worker exited with {w.returncode}")
                reports.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
    payload = reports[0]["payload_bytes"]
    windows, step_times = [], []
    for i in range(steps):
        start = min(r["push"][i][0] for r in reports)
        end = max(r["push"][i][1] for r in reports)
        windows.append(end - start)
        step_times.append(statistics.median(r["step_s"][i] for r in reports))
    window = statistics.median(windows)
    return {
        "servers": servers,
        "workers": workers,
        "payload_bytes": payload,
        "window_s": window,
        "step_s": statistics.median(step_times),
        "ingest_MBps": workers * payload / window / 1e6,
        "ingest_MBps_per_step": [workers * payload / w / 1e6 for w in windows],
    }


def _ready_port(ps: subprocess.Popen[str], timeout_s: float = 60.0) -> int:
    assert ps.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = ps.stdout.readline()
        if not line:
            raise RuntimeError(f"the PS exited with {ps.poll()} before it was ready")
        if line.startswith("{") and json.loads(line).get("event") == "ready":
            return int(json.loads(line)["port"])
    raise RuntimeError("the PS did not report ready")


def _worker(spec: dict[str, Any]) -> None:
    """One bench worker process: synthetic gradients, sync steps, push window per step on stdout."""
    import torch

    from netsense.transport.tls import TransportSettings
    from netsense.worker.connect import ConnectSettings
    from netsense.worker.optimizer import NetSenseOptimizer

    torch.set_num_threads(1)
    numel = int(spec["mb"] * 1e6 / 4 / spec["keys"])
    model = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(numel)) for _ in range(spec["keys"])])
    transport = TransportSettings(max_datagram_size=spec["mds"], local_max_datagram_size=0)  # the size asked, on loopback too
    connect = [ConnectSettings("127.0.0.1", port, insecure=True, transport=transport) for port in spec["ps"]]
    grads = [torch.randn(numel) * 1e-3 for _ in range(spec["keys"])]
    push, step_s = [], []
    with NetSenseOptimizer(
        model, connect=connect, rank=spec["rank"], world_size=spec["workers"], worker_id=f"bench-{spec['rank']}",
        optimizer={"name": "sgd", "lr": 1e-6},
    ) as opt:  # fmt: skip
        for i in range(spec["steps"] + 1):
            for p, g in zip(model, grads, strict=True):
                p.grad = g
            t0 = time.perf_counter()
            stats = opt.step(samples=1)
            if i == 0:
                continue  # warm-up: connections' windows open, first-step quorum
            start = t0 + stats.encode_s
            push.append((start, start + stats.push_s))
            step_s.append(time.perf_counter() - t0)
    print(json.dumps({"payload_bytes": 4 * numel * spec["keys"], "push": push, "step_s": step_s}), flush=True)


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]))
