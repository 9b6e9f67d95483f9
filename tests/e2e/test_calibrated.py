"""Calibrated q end to end (docs/POLICIES.md, "Calibrated q"): `netsense calibrate` writes a progress
table from level trials, and a launched job's workers and PS price their levels at its figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from netsense.compression.policy.calibration import FORMAT, progress_table_json, read_progress_table
from netsense.compression.policy.decisionlog import read_decision_log
from netsense.compression.policy.ladder import DEFAULT_LADDER


def _netsense(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cwd / "cache"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "netsense", *args], capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


def test_calibrate_writes_a_table_per_direction(tmp_path: Path) -> None:
    proc = _netsense(
        ["calibrate", "--model", "digits-cnn", "--trial-steps", "20", "--levels", "qsgd:4,topk:0.001+fp16", "--out", "q.json"],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "q.json").read_text())
    assert data["format"] == FORMAT and data["model"] == "digits-cnn" and data["trial_steps"] == 20 and data["workers"] == 2
    for direction in ("up", "down"):
        table = read_progress_table(tmp_path / "q.json", direction)
        assert set(table) == {"qsgd:4", "topk:0.001+fp16"}
        assert all(0 <= q <= 2 for q in table.values())  # at most K / (K/2) when a level beats fp32 by chance
    # Top-k 0.1 % of each worker's gradient leaves digits-cnn where it started for 20 steps (q 0),
    # 4-bit QSGD keeps up with fp32 (1.00-1.10); the downlink's early steps are too alike to order.
    up = read_progress_table(tmp_path / "q.json", "up")
    assert up["topk:0.001+fp16"] < 0.5 < up["qsgd:4"], up
    # Progress on stderr: one line per trajectory and direction, then the file.
    lines = proc.stderr.strip().splitlines()
    assert sum("calibrate up:" in line for line in lines) == 3 and sum("calibrate down:" in line for line in lines) == 3
    assert lines[-1].startswith("wrote q.json: up 2 levels, down 2 levels")


@pytest.mark.slow
def test_a_launched_job_prices_its_levels_from_the_table(tmp_path: Path) -> None:
    """Workers read the up table, the PS the down table, through `launch` with a path relative to
    the caller's folder; levels the table leaves out are estimated as before."""
    (tmp_path / "q.json").write_text(
        progress_table_json({"up": {"powersgd:2": 0.777}, "down": {"powersgd:2": 0.555}}, {"model": "digits-cnn"})
    )
    steps = 4
    proc = _netsense(
        ["launch", "--no-progress", "--run-dir", "run", "--model", "digits-cnn", "--steps", str(steps), "--eval-every", "0",
         "--policy", "netsense", "--downlink-policy", "netsense", "--progress-table", "q.json", "--insecure"],
        tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    level = DEFAULT_LADDER.split(",").index("powersgd:2")
    for name, q in (("decisions-up-0.jsonl", 0.777), ("decisions-up-1.jsonl", 0.777), ("decisions-down.jsonl", 0.555)):
        recs = read_decision_log(tmp_path / "run" / name)
        assert len(recs) >= steps - 1, name
        assert all(r["progress_levels"][level] == pytest.approx(q) for r in recs), (name, [r["progress_levels"] for r in recs])
