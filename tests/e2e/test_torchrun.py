"""Workers started by torchrun find their rank, world size and PS from the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from netsense.launch.launcher import stop_processes


def _start_ps(certs: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], int]:
    ps = subprocess.Popen(
        [sys.executable, "-m", "netsense", "ps", "--port", "0", "--certs", str(certs)],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert ps.stdout is not None
    line = ps.stdout.readline()
    return ps, json.loads(line)["port"]


@pytest.mark.slow
def test_torchrun_two_workers_against_a_ps(tmp_path: Path) -> None:
    from netsense.transport.tls import make_dev_certs

    make_dev_certs(tmp_path / "certs")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    ps, port = _start_ps(tmp_path / "certs", env)
    try:
        run = subprocess.run(
            [
                sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "-m", "netsense", "worker", "--certs", str(tmp_path / "certs"), "--steps", "30", "--eval-every", "0",
                "--summary-json", str(tmp_path / "summary.json"),
            ],
            env={**env, "NETSENSE_PS": f"127.0.0.1:{port}", "OMP_NUM_THREADS": "1"},
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        # both ranks ran 30 synchronous steps against the same PS: the PS is at version 30
        summary = json.loads((tmp_path / "summary.json").read_text())
        assert summary["steps"] == 30 and summary["workers"] == 2
        assert '"rank": 0' in run.stdout and '"rank": 1' in run.stdout  # each rank read its own RANK
    finally:
        stop_processes([ps])
    assert ps.returncode == 0
    stopped = json.loads(ps.stdout.read().strip().splitlines()[-1])  # type: ignore[union-attr]
    assert stopped["event"] == "stopped" and stopped["version"] == 30 and stopped["errors_sent"] == 0
