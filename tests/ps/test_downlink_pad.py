"""The downlink's padded probe over a real connection (ps/session.py, ps/downlink.py `pad_for`):
the PS sends an update with `Decision.pad_bytes` of filler in its PARAMS (`pad`), the worker drops
it and applies the update, and the downlink policy hears the send with its filler."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from netsense.compression.policy import ChooseRequest, Decision, SendReport
from netsense.compression.policy.fixed import FixedPolicy
from netsense.compression.policy.ladder import Ladder
from netsense.ps.server import ServerSettings
from netsense.worker.optimizer import NetSenseOptimizer
from tests.conftest import start_ps, stop_ps, traffic_per_step

PAD = 150_000


class Padding(FixedPolicy):
    """fp16 always; the updates of odd decisions padded by `PAD` bytes where the sender can pad."""

    def __init__(self) -> None:
        super().__init__(Ladder.default(), "fp16", name="padding")
        self.reports: list[SendReport] = []

    def choose(self, request: ChooseRequest) -> Decision:
        d = super().choose(request)
        return dataclasses.replace(d, pad_bytes=PAD) if request.pad_ok and request.step % 2 else d

    def observe(self, report: SendReport) -> None:
        self.reports.append(report)


def test_a_padded_update_crosses_is_dropped_and_reported(certs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "down.jsonl"
    ps = start_ps(certs, ServerSettings(port=0, policy="fp16", decision_log=str(log)))
    try:
        assert ps.server.downlink is not None
        policy = Padding()
        ps.server.downlink.loop.policy = policy
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        with NetSenseOptimizer(model, connect=ps.connect_settings(), worker_id="w0", overlap=False) as opt:
            received = [got for _, got in traffic_per_step(opt, model, 6)]
            version = opt.version
            replica = {k: v.clone() for k, v in model.state_dict().items()}
        params = ps.call(lambda: {k: v.clone() for k, v in ps.server.store.params.items()})
    finally:
        stop_ps(ps)
    assert version == 6
    for name, value in replica.items():  # the filler did not reach the model: the replica is the PS's
        key = next(k for k in params if k.endswith(name) or name.endswith(k))
        assert torch.allclose(value, params[key].view_as(value), atol=1e-3)
    padded = [r for r in policy.reports if r.pad_bytes]
    assert padded and all(r.pad_bytes == PAD and r.bytes_sent > PAD for r in padded)
    assert all(r.pad_bytes == 0 and r.bytes_sent < PAD for r in policy.reports if r.step % 2 == 0)
    lines = {line["step"]: line for line in map(json.loads, log.read_text().splitlines())}
    assert all(lines[r.step]["pad_bytes"] == r.pad_bytes for r in policy.reports)
    # Step i receives the update of decision i: the odd ones came with the filler.
    assert [got > PAD for got in received] == [i % 2 == 1 for i in range(6)], received
