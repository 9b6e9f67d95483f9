"""2 sites x 2 workers in network namespaces, a PS shard and a relay at each site, a tbf link
between them: NetSense's WAN bytes per step (fp16 on the WAN) are at most half the 4-rank ring's
(`ring_wan_bytes`, 1.5 fp32 models each way), an adaptive job's relays adapt while their
workers push them fp16, and DDP's own ring, measured on the same topology with
ranks 0,1 at one site and 2,3 at the other, moves what `ring_wan_bytes` says. Root only; skipped
with the reason elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from netsense.cli import main
from netsense.launch.sites import ring_wan_bytes
from netsense.models import load_task
from netsense.transport.emulation.netns import netns_available

AVAILABLE, REASON = netns_available()


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.timeout(600)
@pytest.mark.skipif(not AVAILABLE, reason=REASON)
def test_two_sites_of_two_workers_move_at_most_half_the_rings_wan_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = _namespaces()
    out = tmp_path / "scn"
    assert main([
        "bench", "scenario", "--model", "digits-cnn", "--workers", "4", "--sites", "2", "--netns-link",
        "rate=50mbit,queue=50ms", "--policies", "netns:fp16,ddp:none,netns:netsense", "--steps", "16", "--eval-every", "8",
        "--target-accuracy", "0.01", "--idle-timeout", "60", "--out", str(out),
    ]) == 0  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    assert results["scenario"]["sites"] == 2
    model_bytes = 4 * sum(p.numel() for p in load_task("digits-cnn").build_model().parameters())
    ring = ring_wan_bytes(["s0", "s0", "s1", "s1"], model_bytes)
    assert ring == {("s0", "s1"): 3 * model_bytes // 2, ("s1", "s0"): 3 * model_bytes // 2}
    per_direction = max(ring.values())
    wan = {}
    for name, f in results["policies"].items():
        assert f["topology"] == "sites" and f["steps"] == 16, name
        assert set(f["wan_bytes_per_step"]) == {"into s0", "into s1"}, name
        wan[name] = max(f["wan_bytes_per_step"].values())
    relays = results["policies"]["netns:fp16"]["relays"]
    assert [(r["site"], r["ranks"], r["upstream_codec"]) for r in relays] == [("s0", [0, 1], "fp16"), ("s1", [2, 3], "fp16")]
    # Under the adaptive policy the relays adapt the WAN push, and their workers push them fp16.
    relays = results["policies"]["netns:netsense"]["relays"]
    assert [(r["site"], r["upstream_codec"], r["upstream_policy"]) for r in relays] == [("s0", None, "netsense"), ("s1", None, "netsense")]
    for rank in range(4):
        log = out / "runs" / "netns_netsense" / f"decisions-up-{rank}.jsonl"
        decisions = [json.loads(line) for line in log.read_text().splitlines()]
        assert decisions and {d["policy"] for d in decisions} == {"fp16"} and {d["spec"] for d in decisions} == {"fp16"}, rank
    # Start-up (INIT, the first full pulls, handshakes) is spread over the 16 steps.
    assert wan["netns:fp16"] <= 0.5 * per_direction, (wan, per_direction)
    assert 0.9 * per_direction < wan["ddp:none"] < 1.3 * per_direction, (wan, per_direction)
    # Every namespace of both rows is gone. Only this process's count: other jobs on the machine
    # may add or remove their own meanwhile (the topologies name theirs netsense-<pid>x<n>-...).
    ours = f"netsense-{os.getpid()}x"
    assert {n for n in _namespaces().split() if n.startswith(ours)} <= set(before.split())
