"""`netsense launch` through the real CLI: reaches the accuracy, writes the summary, leaves no process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _sigint_default() -> None:
    """In the child: Ctrl-C's default action. A test run in the background (CI started with `&`)
    inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler, so the SIGINT
    this test sends would be ignored and the command never stop."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _kill_all(text: str) -> None:
    """SIGKILL every process whose command line mentions `text` (the children of a launch)."""
    for pid in _procs_mentioning(text):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _procs_mentioning(text: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if text in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


def _launch(tmp_path: Path, *args: str, timeout: float = 400, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pythonpath), env.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "netsense", "launch", "--no-progress", "--run-dir", str(tmp_path / "run"), *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip


@pytest.mark.slow
def test_default_job_reaches_accuracy_and_cleans_up(tmp_path: Path) -> None:
    summary_path = tmp_path / "summary.json"
    proc = _launch(tmp_path, "--steps", "200", "--summary-json", str(summary_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert {"test_accuracy", "final_loss", "wall_s", "steps", "samples_per_s", "bytes_up", "bytes_down", "workers"} <= set(summary)
    assert summary["test_accuracy"] >= 0.95, summary
    assert summary["steps"] == 200 and summary["workers"] == 2
    assert summary["bytes_up"] > 0 and summary["bytes_down"] > 0 and summary["samples_per_s"] > 0
    assert all(Path(p).exists() for p in summary["decision_logs"]), summary  # the gradient domain logs no downlink
    assert (tmp_path / "cache" / "netsense" / "dev-certs" / "ca.pem").exists()  # TLS on by default
    assert not _procs_mentioning(str(tmp_path / "run"))
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert sum(e["event"] == "step" for e in events) == 2 * 200  # every step of both workers, logged
    assert {e["rank"] for e in events} == {0, 1}


_FAILS_IN_THE_WORKER = """
from netsense.models import load_task
import dataclasses


def _build():
    raise RuntimeError("this model cannot be built")


def task():
    return dataclasses.replace(load_task("digits-cnn"), build_model=_build)
"""


@pytest.mark.slow
def test_a_model_that_does_not_load_stops_launch_before_any_process(tmp_path: Path) -> None:
    """Issue #16 item 6: --model is resolved before the PS or a worker starts (it used to surface
    as a worker's exit status once the workers had started)."""
    proc = _launch(tmp_path, "--model", "no.such.module:factory", timeout=120)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("netsense launch: error: cannot load model factory 'no.such.module:factory'"), proc.stderr[-2000:]
    assert not (tmp_path / "run" / "config.json").exists()  # nothing was started
    assert not _procs_mentioning(str(tmp_path / "run"))


@pytest.mark.slow
def test_failing_worker_stops_the_job_with_nonzero_exit(tmp_path: Path) -> None:
    # The task loads (launch checks that up front), but its model fails to build in the workers.
    (tmp_path / "fails_in_the_worker.py").write_text(_FAILS_IN_THE_WORKER)
    proc = _launch(tmp_path, "--model", "fails_in_the_worker:task", timeout=120, pythonpath=tmp_path)
    assert proc.returncode != 0
    assert "exited" in proc.stderr
    assert (tmp_path / "run" / "config.json").exists()  # the job did start
    assert not _procs_mentioning(str(tmp_path / "run"))


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_every_process(tmp_path: Path, sig: int, status: int) -> None:
    """Ctrl-C, or SIGTERM (a scheduler's time limit): launch stops every child before it exits."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    run_dir = tmp_path / "run"
    p = subprocess.Popen(
        [sys.executable, "-m", "netsense", "launch", "--no-progress", "--steps", "100000", "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=_sigint_default,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(_procs_mentioning(str(run_dir))) < 3 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(_procs_mentioning(str(run_dir))) >= 3
        time.sleep(2)
        p.send_signal(sig)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()  # stop launch and what it did not stop, then report with its stderr
            _kill_all(str(run_dir))
            out, err = p.communicate()
            pytest.fail(f"launch still running 30 s after signal {sig}; stderr tail: {err[-2000:]!r}")
        assert p.returncode == status
        deadline = time.monotonic() + 10
        while _procs_mentioning(str(run_dir)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _procs_mentioning(str(run_dir))
    finally:
        if p.poll() is None:
            p.kill()
        _kill_all(str(run_dir))  # a failed run must not leave training processes behind for later tests


def _no_nan(name: str) -> None:
    raise AssertionError(f"summary holds {name}, which is not JSON")


@pytest.mark.slow
def test_metrics_port_reaches_every_process(tmp_path: Path) -> None:
    summary_path = tmp_path / "summary.json"
    proc = _launch(tmp_path, "--workers", "1", "--steps", "3", "--metrics-port", "0", "--summary-json", str(summary_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(summary_path.read_text(), parse_constant=_no_nan)
    ports = summary["metrics_ports"]
    assert len(ports["ps"]) == 1 and len(ports["workers"]) == 1, ports
    assert all(p > 0 for p in ports["ps"] + ports["workers"])
    assert not _procs_mentioning(str(tmp_path / "run"))
