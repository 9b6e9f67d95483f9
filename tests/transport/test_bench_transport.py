"""`netsense bench transport`: PUSH and raw QUIC alternate on warm connections; the report holds
every pair's ratio and the CPU cost per MB of each stack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from netsense.cli import main


def test_bench_transport_reports_pairs_and_cpu_cost(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.json"
    assert main(["bench", "transport", "--mb", "1", "--repeats", "2", "--max-datagram-size", "8952", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["bytes"] == 1_000_000 and result["repeats"] == 2
    assert set(result["stacks"]) == {"push", "raw_quic", "tcp"}
    for name in ("push", "raw_quic"):
        stack = result["stacks"][name]
        assert len(stack["runs_s"]) == 2 and stack["goodput_MBps"] > 0 and stack["cpu_s_per_MB"] > 0
    assert len(result["push_vs_raw_quic_runs"]) == 2 and result["push_vs_raw_quic"] > 0
    assert result["push_vs_raw_quic_cpu"] > 0
    assert "push / raw QUIC" in capsys.readouterr().out


def test_bench_transport_refuses_empty_payload(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "transport", "--mb", "0"]) == 2
    assert "--mb" in capsys.readouterr().err
