"""2 sites x 1 worker in network namespaces, a PS shard at each, a tbf link between them: NetSense
trains across it, and its WAN bytes per step are one model each way, as DDP's 2-rank ring's are
(with both workers behind one bottleneck they were two). Root only; skipped with the reason elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from netsense.cli import main
from netsense.models import load_task
from netsense.transport.emulation.netns import netns_available

AVAILABLE, REASON = netns_available()


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.skipif(not AVAILABLE, reason=REASON)
def test_two_sites_train_over_the_shaped_link_with_the_rings_wan_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = _namespaces()
    out = tmp_path / "scn"
    assert main([
        "bench", "scenario", "--model", "digits-cnn", "--netns-link", "rate=50mbit,queue=50ms", "--policies",
        "netns:none,ddp:none", "--steps", "16", "--eval-every", "8", "--target-accuracy", "0.01",
        "--idle-timeout", "60", "--out", str(out),
    ]) == 0  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    assert results["scenario"]["topology"] == "sites"
    model_bytes = 4 * sum(p.numel() for p in load_task("digits-cnn").build_model().parameters())
    wan = {}
    for name, f in results["policies"].items():
        assert f["topology"] == "sites" and f["steps"] == 16, name
        assert f["time_to_target_s"] is not None, name
        assert set(f["wan_bytes_per_step"]) == {"into s0", "into s1"}, name
        assert 0 < f["wan_ideal_step_s"] == f["ideal_step_s"] < f["mean_step_s"], name
        wan[name] = max(f["wan_bytes_per_step"].values())
    # One fp32 model each way per step, plus framing and the start-up (INIT, first pulls, handshakes)
    # spread over 16 steps; every worker behind one link would carry two.
    for name, per_step in wan.items():
        assert 0.9 * model_bytes < per_step < 1.5 * model_bytes, (name, per_step, model_bytes)
    assert wan["netns:none"] < 1.4 * wan["ddp:none"], wan
    assert "| `netns:none` | s0 " in (out / "results.md").read_text()
    # Every namespace of both rows is gone; only this process's count (netsense-<pid>x<n>-...):
    # other jobs on the machine may add or remove their own meanwhile.
    ours = f"netsense-{os.getpid()}x"
    assert {n for n in _namespaces().split() if n.startswith(ours)} <= set(before.split())
