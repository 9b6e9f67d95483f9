"""The adaptive policy end to end: decision logs on both directions, lossless where the link is free."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from netsense.compression.policy.decisionlog import read_decision_log
from netsense.compression.policy.ladder import DEFAULT_LADDER
from netsense.ps.server import ServerSettings
from netsense.transport.tls import CertPaths
from netsense.worker.optimizer import NetSenseOptimizer

from ..conftest import run_ranks, start_ps, stop_ps

BATCH = 2048
"""Per worker. On 2 loaded cores loopback QUIC moves a 150 kB fp32 push in 30-40 ms, and the
sensing estimate of such short, paced bursts is 4-8 MB/s: compute must be several 100 ms for
communication to be small beside it (P_0 within (1 + eps) of the best level's)."""

RECORD_FIELDS = {
    "t", "step", "policy", "level", "spec", "reason", "payload_bytes", "predicted_bytes", "bytes_sent", "compute_s",
    "predicted_comm_s", "comm_s", "bw_Bps", "min_rtt_s", "srtt_s", "loss_rate", "direction",
}  # fmt: skip


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


def test_decision_logs_both_directions_and_replicas_stay_exact(certs: CertPaths, tmp_path: Path) -> None:
    """Forced lossy levels on both sides: logs have one record per step and direction, and every
    replica still equals the PS shadow bit for bit."""
    down_log = tmp_path / "down.jsonl"
    ladder = "fp32,fp16,qsgd:8,topk:0.1+fp16"
    ps = start_ps(certs, ServerSettings(port=0, policy="fixed:qsgd:8", ladder=ladder, decision_log=str(down_log)))
    steps = 6
    models = [_mlp(), _mlp()]
    try:

        def work(rank: int) -> None:
            with NetSenseOptimizer(
                models[rank], connect=ps.connect_settings(), rank=rank, world_size=2, worker_id=f"w{rank}",
                optimizer={"name": "sgd", "lr": 0.1}, policy="netsense" if rank == 0 else "fixed:topk:0.1+fp16",
                ladder=ladder, decision_log=tmp_path / f"up-{rank}.jsonl",
            ) as opt:  # fmt: skip
                for step in range(steps):
                    g = torch.Generator().manual_seed(10 * step + rank)
                    x, y = torch.randn(8, 64, generator=g), torch.randint(0, 10, (8,), generator=g)
                    opt.zero_grad()
                    torch.nn.functional.cross_entropy(models[rank](x), y).backward()
                    opt.step(samples=8)

        run_ranks(work)
        shadow = ps.call(lambda: {k: v.clone() for k, v in ps.server.store.shadow.items()})
    finally:
        stop_ps(ps)
    for model in models:
        for name, p in model.named_parameters():
            assert torch.equal(p.detach(), shadow[name]), name
    for rank in range(2):
        recs = read_decision_log(tmp_path / f"up-{rank}.jsonl")
        assert [r["step"] for r in recs] == list(range(steps))
        for r in recs:
            assert RECORD_FIELDS <= set(r), RECORD_FIELDS - set(r)
            assert r["direction"] == "up" and r["worker_id"] == f"w{rank}"
            assert r["bytes_sent"] > 0 and r["comm_s"] > 0 and r["payload_bytes"] == 4 * sum(
                p.numel() for p in models[rank].parameters()
            )
        assert {r["policy"] for r in recs} == {"netsense" if rank == 0 else "fixed:topk:0.1+fp16"}
        if rank == 1:
            assert {r["spec"] for r in recs} == {"topk:0.1+fp16"}
            assert all(r["bytes_sent"] < 0.3 * r["payload_bytes"] for r in recs)
    down = read_decision_log(down_log)
    assert [r["step"] for r in down] == list(range(steps))  # one per update (version v -> v + 1)
    assert all(r["direction"] == "down" and r["spec"] == "qsgd:8" for r in down)
    # A record is written when the next update is chosen: the slower worker's delivery may still be
    # unacknowledged then (receivers 1), and the last one is written at shutdown.
    assert all(r["bytes_sent"] and r["comm_s"] and 1 <= r["receivers"] <= 2 for r in down[:-1])


@pytest.mark.slow
@pytest.mark.serial  # its premise is this host's CPU as the link: beside another test, low rank can pay
def test_unconstrained_loopback_digits_cnn_stays_near_lossless(tmp_path: Path) -> None:
    """On loopback `netsense` sends only near-lossless levels: fp32, fp16 and the quantized levels,
    whose error feedback the windowed q measures at 0.93-0.99+ here (qsgd:4 is the low end, and the
    law may take it when its time per unit of progress is lower; a CI run saw q=0.938). The
    CPU-bound QUIC path makes cutting the bytes worth it (fp16 was 1.27x faster to target than fp32
    unshaped, docs/BENCHMARKS.md); sparsification and low rank never are: fixed powersgd:4 up
    measured 5 ms slower per step here and behind in loss, though its windowed q is 0.98, and the
    levels' predicted steps differ by about the step's own jitter, which a move's band now spans
    (docs/history/BENCHMARKS-2026.md, "A move's band widens to the step's jitter"; before it, 1 CI run in ~20
    sent powersgd:4). Separate processes via `netsense launch`, as a job really runs; asserted
    from the logs."""
    steps = 20
    run = tmp_path / "run"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "netsense", "launch", "--no-progress", "--run-dir", str(run), "--model", "digits-cnn",
         "--steps", str(steps), "--batch-size", str(BATCH), "--eval-every", "0", "--policy", "netsense",
         "--downlink-policy", "netsense", "--summary-json", str(tmp_path / "summary.json")],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    near_lossless = {spec for spec in DEFAULT_LADDER.split(",") if spec.split(":")[0] in ("fp32", "fp16", "qsgd")}
    known = 0
    for name in ("decisions-up-0.jsonl", "decisions-up-1.jsonl", "decisions-down.jsonl"):
        recs = read_decision_log(run / name)
        assert len(recs) >= steps - 1, name
        bad = [(r["step"], r["spec"], r["progress"], r["reason"], r.get("progress_levels"), r.get("predicted_levels")) for r in recs
               if r["spec"] not in near_lossless or (r["progress"] is not None and r["progress"] < 0.9)]  # fmt: skip
        assert not bad, (name, bad)  # before the summary's check: a failure shows why the level was chosen
        known += sum(r["bw_used_Bps"] is not None for r in recs)
    assert set(summary["levels"]) <= near_lossless and sum(summary["levels"].values()) == 2 * steps
    # 150 kB pushes are app-limited samples, so an uplink estimate may never form (then the safe
    # lossless level is the reason); the downlink's bigger bursts give one, and the law keeps fp32.
    assert known > 0, "no decision was made with a known bandwidth: the law was never exercised"
