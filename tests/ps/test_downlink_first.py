"""Update 0 of a netsense downlink over a real connection (ps/session.py, ps/downlink.py
`defers`): its level is chosen on the update itself, so its decision already holds every lossy
level's measured q and the workers' first step as its compute time; the step is applied whole (not
key by key), and replicas stay exact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from netsense.compression.policy import build_policy
from netsense.ps.server import ServerSettings
from netsense.worker.optimizer import NetSenseOptimizer
from tests.conftest import start_ps, stop_ps, traffic_per_step


@pytest.mark.parametrize("overlap", [False, True], ids=["half-duplex", "pipelined"])
def test_update_0_is_priced_on_itself(certs, tmp_path: Path, overlap: bool) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "down.jsonl"
    ps = start_ps(certs, ServerSettings(port=0, policy="netsense", decision_log=str(log)))
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        with NetSenseOptimizer(model, connect=ps.connect_settings(), worker_id="w0", overlap=overlap) as opt:
            traffic_per_step(opt, model, 3)
            replica = {k: v.clone() for k, v in model.state_dict().items()}
        shadow = ps.call(lambda: {k: v.clone() for k, v in ps.server.store.shadow.items()})
    finally:
        stop_ps(ps)
    first = json.loads(log.read_text().splitlines()[0])
    assert first["version"] == 1
    assert first["compute_s"] > 0  # the workers' first step, from their first pull's ack to the first push
    policy = build_policy("netsense", None)
    priors = list(policy.progress.values)  # type: ignore[attr-defined]
    lowrank = [i for i, lv in enumerate(policy.ladder) if lv.spec.startswith("powersgd")]
    assert lowrank
    for i in lowrank:  # measured on update 0, not the worst case the first push had
        assert first["progress_levels"][i] != pytest.approx(priors[i], abs=1e-3), (i, first["progress_levels"])
    for name, value in replica.items():
        key = next(k for k in shadow if k.endswith(name) or name.endswith(k))
        assert torch.equal(value, shadow[key].view_as(value))
