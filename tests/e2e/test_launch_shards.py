"""`netsense launch --servers 2`: two PS shard processes, workers talk to both, each shard checkpoints
alone, and the job trains exactly as with one PS (sync, lossless: sharding only moves keys)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_launch import _launch, _procs_mentioning


@pytest.mark.slow
def test_launch_two_shards_trains_and_checkpoints_per_shard(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    cfg = tmp_path / "job.toml"
    cfg.write_text(f'[server]\ncheckpoint_dir = "{ckpt}"\ncheckpoint_every_steps = 10\n')
    (tmp_path / "none.toml").write_text("")
    summaries = {}
    for servers in (1, 2):
        out = tmp_path / f"summary-{servers}.json"
        proc = _launch(
            tmp_path, "--config", str(cfg if servers == 2 else tmp_path / "none.toml"), "--servers", str(servers),
            "--workers", "2", "--steps", "20", "--eval-every", "0", "--summary-json", str(out), timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        summaries[servers] = json.loads(out.read_text())
    assert summaries[2]["servers"] == 2 and summaries[2]["steps"] == 20
    assert summaries[2]["final_loss"] == pytest.approx(summaries[1]["final_loss"], abs=1e-6)
    assert summaries[2]["test_accuracy"] == summaries[1]["test_accuracy"]
    for shard in ("shard-0", "shard-1"):
        assert any((ckpt / shard).iterdir()), f"{shard} wrote no checkpoint"
    assert not _procs_mentioning(str(tmp_path / "run"))
