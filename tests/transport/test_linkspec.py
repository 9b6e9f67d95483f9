"""Link-spec and rate-trace parsing: every unit, the three trace formats, and the error messages."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from netsense.errors import ConfigError
from netsense.transport.emulation.linkspec import DuplexSpec, LinkSpec, as_duplex, parse_link
from netsense.transport.emulation.traces import ConstantRate, MahimahiTrace, StepRate, load_trace


def test_full_spec_applies_to_both_directions() -> None:
    spec = parse_link("rate=50mbit,delay=20ms,queue=100ms,loss=0.01")
    assert spec.up == spec.down
    link = spec.up
    assert link.rate == ConstantRate(50e6)
    assert link.rate_bps == 50e6
    assert link.delay_s == pytest.approx(0.020)
    assert link.queue_s == pytest.approx(0.1)
    assert link.queue_limit_bytes == 625_000  # 100 ms of 50 Mbit/s
    assert link.loss == pytest.approx(0.01)


@pytest.mark.parametrize(
    ("text", "bps"),
    [("800bit", 800), ("800bps", 800), ("64kbit", 64e3), ("1.5mbit", 1.5e6), ("2gbit", 2e9), ("10MBit", 10e6)],
)
def test_rate_units(text: str, bps: float) -> None:
    assert parse_link(f"rate={text}").up.rate_bps == pytest.approx(bps)


@pytest.mark.parametrize(("text", "seconds"), [("500us", 500e-6), ("20ms", 0.02), ("1.5s", 1.5)])
def test_delay_units(text: str, seconds: float) -> None:
    assert parse_link(f"delay={text}").down.delay_s == pytest.approx(seconds)


@pytest.mark.parametrize(("text", "size"), [("1500b", 1500), ("64kb", 65536), ("1mb", 1 << 20)])
def test_queue_in_bytes(text: str, size: int) -> None:
    assert parse_link(f"rate=10mbit,queue={text}").up.queue_limit_bytes == size


def test_queue_default_and_floor() -> None:
    assert parse_link("rate=8mbit").up.queue_limit_bytes == 100_000  # default 100 ms
    assert parse_link("rate=100kbit,queue=1ms").up.queue_limit_bytes == 3000  # floor: two packets
    assert parse_link("delay=5ms").up.queue_limit_bytes is None  # no bottleneck, no queue


def test_loss_as_percent_and_seed() -> None:
    spec = parse_link("loss=2.5%,seed=7")
    assert spec.up.loss == pytest.approx(0.025)
    assert spec.seed == 7


def test_direction_overrides_win_wherever_written() -> None:
    spec = parse_link("up.rate=10mbit,rate=50mbit,down.rate=100mbit,delay=5ms,down.delay=1ms")
    assert spec.up.rate_bps == 10e6
    assert spec.down.rate_bps == 100e6
    assert (spec.up.delay_s, spec.down.delay_s) == (0.005, 0.001)


def test_empty_spec_is_a_plain_relay() -> None:
    assert parse_link("") == DuplexSpec()
    assert as_duplex("") == DuplexSpec()
    one = LinkSpec(delay_s=0.01)
    assert as_duplex(one) == DuplexSpec(up=one, down=one)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("rate=50mbitt", "'rate'"),
        ("rate=50", "'rate'"),
        ("rate=50mbps", "ambiguous"),
        ("rate=0mbit", "'rate'"),
        ("delay=20", "'delay'"),
        ("delay=fast", "'fast'"),
        ("queue=10 apples", "'queue'"),
        ("loss=1.5", "'loss'"),
        ("loss=-0.1", "'loss'"),
        ("jitter=5ms", "'jitter'"),
        ("sideways.rate=1mbit", "'sideways.rate'"),
        ("rate=10mbit,oops", "'oops'"),
        ("seed=x", "'seed'"),
        ("up.rate=1s:5mbit", "0s"),
        ("rate=0s:5mbit,0s:1mbit", "increase"),
        ("rate=0s:0", "never"),
        ("trace=/nonexistent/trace.csv", "cannot read"),
        ("rate=0s:5mbit,3s:loop,6s:1mbit", "last item"),
        ("rate=0s:5mbit,3s:1mbit,3s:loop", "after the last step"),
        ("rate=0s:loop", "last item"),
    ],
)
def test_bad_specs_name_field_and_value(text: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        parse_link(text)


def test_inline_step_trace_and_blackout() -> None:
    spec = parse_link("rate=0s:100mbit,20s:10mbit,40s:0,45s:50mbit,delay=10ms")
    trace = spec.up.rate
    assert isinstance(trace, StepRate)
    assert spec.up.delay_s == 0.01
    assert [trace.rate_at(t) for t in (0, 19.9, 20, 41, 45, 1000)] == [100e6, 100e6, 10e6, 0, 50e6, 50e6]
    # capacity integrates the rate; time_for inverts it and skips the blackout
    assert trace.capacity(30) == pytest.approx((20 * 100e6 + 10 * 10e6) / 8)
    assert trace.time_for(trace.capacity(30)) == pytest.approx(30)
    assert trace.time_for(trace.capacity(40) + 1) == pytest.approx(45, abs=1e-6)


def test_a_looping_step_trace_repeats_its_cycle() -> None:
    """`Ns:loop` repeats the steps every N s: a benchmark's jobs all see every phase, however
    fast each one runs; capacity and its inverse stay consistent across loop boundaries."""
    trace = parse_link("rate=0s:100mbit,3s:10mbit,6s:50mbit,9s:loop").up.rate
    assert isinstance(trace, StepRate) and trace.period_s == 9.0
    assert [trace.rate_at(t) for t in (0, 2.9, 3, 8.9, 9, 12.5, 15.1, 900.5)] == [
        100e6, 100e6, 10e6, 50e6, 100e6, 10e6, 50e6, 100e6,
    ]  # fmt: skip
    per_loop = (3 * 100e6 + 3 * 10e6 + 3 * 50e6) / 8
    assert trace.capacity(9) == pytest.approx(per_loop)
    assert trace.capacity(31) == pytest.approx(3 * per_loop + (3 * 100e6 + 1 * 10e6) / 8)
    assert trace.mean_bps == pytest.approx(per_loop * 8 / 9)
    for t in (0.5, 3.0, 8.999, 9.0, 12.3, 27.0, 100.7):
        assert trace.time_for(trace.capacity(t)) == pytest.approx(t)
    assert parse_link("rate=0s:1mbit,1s:0,2s:loop").up.rate.time_for(1e6) < math.inf  # a blackout that ends


def test_final_blackout_never_delivers() -> None:
    trace = parse_link("rate=0s:1mbit,1s:0").up.rate
    assert trace is not None
    assert trace.time_for(trace.capacity(1.0) + 1) == math.inf


def test_csv_trace_with_and_without_header(tmp_path: Path) -> None:
    with_header = tmp_path / "a.csv"
    with_header.write_text("time_s,rate_mbit\n0,100\n2.5,10\n5,0\n6,40\n")
    bare = tmp_path / "b.csv"
    bare.write_text("0,100\n2.5,10\n5,0\n6,40\n")
    for path in (with_header, bare):
        trace = load_trace(path)
        assert isinstance(trace, StepRate)
        assert [trace.rate_at(t) for t in (1, 3, 5.5, 7)] == [100e6, 10e6, 0, 40e6]
    assert parse_link(f"trace={bare},delay=1ms").down.rate == load_trace(bare)


def test_csv_trace_errors_name_the_row(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("time_s,rate_mbit\n0,100\n1,fast\n")
    with pytest.raises(ConfigError, match="row 3"):
        load_trace(bad)
    empty = tmp_path / "empty.csv"
    empty.write_text("time_s,rate_mbit\n")
    with pytest.raises(ConfigError, match="no rows"):
        load_trace(empty)


def test_mahimahi_trace_loops_and_counts_opportunities(tmp_path: Path) -> None:
    path = tmp_path / "link.trace"
    # 4 opportunities per 4 ms period, two of them in millisecond 2: 12 Mbit/s on average
    path.write_text("1\n2\n2\n4\n")
    trace = load_trace(path)
    assert isinstance(trace, MahimahiTrace)
    assert trace.period_s == pytest.approx(0.004)
    assert trace.mean_bps == pytest.approx(4 * 1500 * 8 / 0.004)
    assert trace.opportunities(0.0009) == 0
    assert trace.opportunities(0.002) == 3
    assert trace.opportunities(0.004) == 4
    assert trace.opportunities(0.0051) == 5  # looped: 4 + 1
    assert trace.capacity(0.008) == 8 * 1500
    assert trace.rate_at(0.0, window_s=0.4) == pytest.approx(12e6)
    # the k-th 1500-byte slot, looping; a partial slot is still that slot
    slots = [trace.time_for(k * 1500) for k in (1, 2, 3, 4, 5, 8)]
    assert slots == pytest.approx([0.001, 0.002, 0.002, 0.004, 0.005, 0.008])
    assert trace.time_for(1) == pytest.approx(0.001)


def test_mahimahi_prefix_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "numbers.txt"
    path.write_text("0\n5\n10\n")
    assert isinstance(load_trace(f"mahimahi:{path}"), MahimahiTrace)
    with pytest.raises(ConfigError, match="row 2"):
        load_trace(f"csv:{path}")  # forced CSV: one column is not time_s,rate_mbit
    for text, match in (("3\n2\n", "non-decreasing"), ("0\n0\n", "period"), ("1\nx\n", "integer")):
        path.write_text(text)
        with pytest.raises(ConfigError, match=match):
            load_trace(f"mahimahi:{path}")
