"""transport/emulation/probe.py and `netsense probe`: the signal of a bulk transfer through the emulator.

Sink, emulator and sender share one process (and 2 CPU cores), so the checks skip, with the
measured goodput, when the relay could not carry the configured rate: then the CPU, not the
link, was the bottleneck and no estimator could find the rate.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from netsense.cli import main
from netsense.transport.emulation.probe import ProbeResult, probe_link
from netsense.transport.tls import TransportSettings

# Large datagrams: at 1200 B the per-packet Python work of sender + relay + receiver on one core
# tops out below 50 Mbit/s (docs/EMULATOR.md); loopback carries 16 kB datagrams.
LOOPBACK = TransportSettings(max_datagram_size=16_000)


def _check_sustained(result: ProbeResult, rate_mbit: float) -> None:
    print(result)
    if result.goodput_mbit < 0.8 * rate_mbit:
        pytest.skip(f"relay could not carry {rate_mbit} Mbit/s here: goodput {result.goodput_mbit:.1f}")
    # A starved relay releases its backlog in bursts above the rate, which a delivery-rate estimate
    # reads as bandwidth (CI at load 13: +18-21 %); then the CPU, not the link, made the samples.
    late = result.emulator_late_fraction
    if late is not None and late > 0.02:
        pytest.skip(f"relay released {late:.1%} of datagrams > 2 ms late: the CPU shaped the link")


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("rate_mbit", [20, 50, 100])
async def test_bandwidth_estimate_within_15_percent(rate_mbit: int) -> None:
    result = await probe_link(f"rate={rate_mbit}mbit,delay=5ms", 3.0, LOOPBACK)
    _check_sustained(result, rate_mbit)
    assert result.bw_estimate_mbit == pytest.approx(rate_mbit, rel=0.15)
    assert result.samples > 50


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("one_way_ms", [10, 40])
async def test_min_rtt_within_25_percent(one_way_ms: int) -> None:
    # 1200 B packets: a 16 kB datagram alone takes 6.4 ms to serialise at 20 Mbit/s, on top of the delay
    result = await probe_link(f"rate=20mbit,delay={one_way_ms}ms", 3.0, TransportSettings())
    print(result)
    assert result.min_rtt_ms is not None
    assert abs(result.min_rtt_ms - 2 * one_way_ms) <= 0.25 * 2 * one_way_ms + 1.0


def test_cli_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "probe.json"
    assert main(["probe", "--link", "rate=20mbit,delay=2ms", "--seconds", "1", "--json", str(out),
                 "--max-datagram-size", "16000"]) == 0  # fmt: skip
    doc = json.loads(out.read_text())
    assert {"goodput_mbit", "bw_estimate_mbit", "min_rtt_ms", "srtt_ms", "loss_rate", "samples"} <= set(doc)
    assert doc["goodput_mbit"] > 0 and doc["samples"] > 0
    assert json.loads(capsys.readouterr().out) == doc


def test_cli_rejects_bad_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--link", "rate=20mbit", "--seconds", "0"]) == 2
    assert "--seconds" in capsys.readouterr().err
