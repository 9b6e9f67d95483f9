"""The uplink's start-up probe over a real PS connection (worker/optimizer.py `_probe_path`): the
first decision of a netsense worker whose payload is at least a sample is taken on a measured
bandwidth, on the half-duplex step and on the one that pushes from gradient hooks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from netsense.worker.optimizer import NetSenseOptimizer


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))  # 540 kB of fp32


def _first_line(ps, tmp_path: Path, **kw: object) -> dict:  # type: ignore[no-untyped-def]
    model = _model()
    log = tmp_path / "decisions.jsonl"
    with NetSenseOptimizer(model, connect=ps.connect_settings(), worker_id="w0", policy="netsense", decision_log=log, **kw) as opt:
        assert opt.uplink.payload_bytes >= 256 * 1024
        sent_before = opt._exchange.traffic()[0]
        loss = torch.nn.functional.cross_entropy(model(torch.randn(32, 256)), torch.randint(0, 10, (32,)))
        loss.backward()
        opt.step(samples=32)
        sent = opt._exchange.traffic()[0] - sent_before
    line = json.loads(log.read_text().splitlines()[0])
    line["wire_bytes_up"] = sent
    return line


@pytest.mark.parametrize("overlap", [False, True], ids=["half-duplex", "overlap"])
def test_the_first_decision_is_taken_on_the_probed_bandwidth(ps, tmp_path: Path, overlap: bool) -> None:  # type: ignore[no-untyped-def]
    line = _first_line(ps, tmp_path, overlap=overlap)
    assert line["step"] == 0 and line["probe_bytes"] == 256 * 1024 and line["probe_s"] > 0
    assert line["reason"] != "unknown-bandwidth" and line["bw_used_Bps"] is not None
    assert line["wire_bytes_up"] >= 256 * 1024 + line["bytes_sent"]  # the filler did cross


def test_no_probe_when_the_policy_turns_it_off(ps, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    line = _first_line(ps, tmp_path, policy_settings={"start_probe": False})
    assert "probe_bytes" not in line and line["reason"] == "unknown-bandwidth"
    assert line["wire_bytes_up"] < 256 * 1024 + line["bytes_sent"]
