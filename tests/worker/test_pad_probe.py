"""A decision's filler over a real PS connection (worker/exchange.py): the worker sends
`Decision.pad_bytes` beside the step's pushes, times the push to the filler's ack too, and reports
both to the policy (docs/POLICIES.md, "Probes")."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from netsense.compression.policy import ChooseRequest, Decision, SendReport
from netsense.compression.policy.fixed import FixedPolicy
from netsense.compression.policy.ladder import Ladder
from netsense.worker.optimizer import NetSenseOptimizer
from tests.conftest import traffic_per_step

PAD = 200_000


class Padding(FixedPolicy):
    """fp16 always; every odd step padded by `PAD` bytes where the sender can pad."""

    def __init__(self) -> None:
        super().__init__(Ladder.default(), "fp16", name="padding")
        self.requests: list[ChooseRequest] = []
        self.reports: list[SendReport] = []

    def choose(self, request: ChooseRequest) -> Decision:
        self.requests.append(request)
        d = super().choose(request)
        return dataclasses.replace(d, pad_bytes=PAD) if request.pad_ok and request.step % 2 else d

    def observe(self, report: SendReport) -> None:
        self.reports.append(report)


@pytest.mark.parametrize("overlap", [False, True], ids=["half-duplex", "overlap"])
def test_the_filler_crosses_beside_the_push_and_is_reported(ps, tmp_path: Path, overlap: bool) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    policy, log = Padding(), tmp_path / "decisions.jsonl"
    with NetSenseOptimizer(model, connect=ps.connect_settings(), worker_id="w0", policy=policy, decision_log=log, overlap=overlap) as opt:
        sent_per_step = [sent for sent, _ in traffic_per_step(opt, model, 4)]
        version = opt.version
    assert version == 4  # the PS dropped the filler and applied every step
    assert all(r.pad_ok for r in policy.requests)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    # STARTUP_STEPS: the first steps are not fed back; the later ones are, filler counted.
    for report in policy.reports:
        line = lines[report.step]
        padded = report.step % 2 == 1
        assert report.pad_bytes == (PAD if padded else 0) and line["pad_bytes"] == report.pad_bytes
        assert line["bytes_sent"] == report.bytes_sent and report.comm_s > 0
    assert policy.reports and any(r.pad_bytes for r in policy.reports)
    for step, sent in enumerate(sent_per_step):
        payload = lines[step]["bytes_sent"] - lines[step]["pad_bytes"]
        assert (sent >= payload + PAD) if step % 2 else (payload <= sent < payload + PAD)
