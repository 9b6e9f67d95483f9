"""The uplink's start-up probe over a real PS connection (worker/exchange.py `Exchange._start`):
the first decision of a netsense worker is taken on a measured bandwidth, on the half-duplex step
and on the one that pushes from gradient hooks, whatever its payload's size. It is taken
while connecting, not in step 0: rank 0's INIT is the sample, a rank that finds the PS seeded
sends filler before its first pull."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from netsense.worker.optimizer import NetSenseOptimizer


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))  # 540 kB of fp32


def _small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))  # 69 kB of fp32


def _first_line(ps, tmp_path: Path, worker_id: str = "w0", small: bool = False, **kw: object) -> dict:  # type: ignore[no-untyped-def]
    model = _small_model() if small else _model()
    log = tmp_path / f"decisions-{worker_id}.jsonl"
    with NetSenseOptimizer(model, connect=ps.connect_settings(), worker_id=worker_id, policy="netsense", decision_log=log, **kw) as opt:
        assert (opt.uplink.payload_bytes < 256 * 1024) if small else (opt.uplink.payload_bytes >= 256 * 1024)
        sent_before = opt._exchange.traffic()[0]
        loss = torch.nn.functional.cross_entropy(model(torch.randn(32, 256)), torch.randint(0, 10, (32,)))
        loss.backward()
        opt.step(samples=32)
        sent = opt._exchange.traffic()[0] - sent_before
    line = json.loads(log.read_text().splitlines()[0])
    line["wire_bytes_up"] = sent
    return line


@pytest.mark.parametrize("overlap", [False, True], ids=["half-duplex", "overlap"])
def test_the_first_decision_is_taken_on_the_bandwidth_measured_while_connecting(ps, tmp_path: Path, overlap: bool) -> None:  # type: ignore[no-untyped-def]
    seeder = _first_line(ps, tmp_path, overlap=overlap)  # rank 0 on an empty PS: its INIT is the sample
    assert seeder["step"] == 0 and seeder["probe_source"] == "init" and seeder["probe_s"] > 0
    assert seeder["probe_bytes"] >= 4 * sum(p.numel() for p in _model().parameters())  # the whole model went up
    joiner = _first_line(ps, tmp_path, "w1", overlap=overlap)  # the PS is seeded: filler, before the first pull
    assert joiner["probe_source"] == "probe" and joiner["probe_bytes"] == 256 * 1024 and joiner["probe_s"] > 0
    for line in (seeder, joiner):
        assert line["reason"] != "unknown-bandwidth" and line["bw_used_Bps"] is not None
        assert line["wire_bytes_up"] < 256 * 1024 + line["bytes_sent"]  # step 0 carried no filler: the probe came before it


def test_a_model_smaller_than_a_sample_is_probed_with_filler_on_every_rank(ps, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A payload under a sample's size never makes a sample itself: rank 0's INIT of such a model
    is no sample either, so it sends filler after it, as a joiner does before its first pull."""
    seeder = _first_line(ps, tmp_path, small=True)
    joiner = _first_line(ps, tmp_path, "w1", small=True)
    for line in (seeder, joiner):
        assert line["probe_source"] == "probe" and line["probe_bytes"] == 256 * 1024 and line["probe_s"] > 0
        assert line["reason"] != "unknown-bandwidth" and "lower bound" not in line["reason"]
        assert line["bw_used_Bps"] is not None


def test_no_probe_when_the_policy_turns_it_off(ps, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    line = _first_line(ps, tmp_path, policy_settings={"start_probe": False})
    assert "probe_bytes" not in line and line["reason"] == "unknown-bandwidth"
