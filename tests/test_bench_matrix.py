"""`netsense bench matrix`: the table's arithmetic on fabricated runs, flag validation, --resume,
a hung run killed with its children, the two shipped traces, and one tiny matrix end to end (slow)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from netsense.bench import matrix
from netsense.bench.matrix_results import (
    CellSummary,
    best_fixed,
    cell_key,
    format_cell,
    markdown_matrix,
    row_ratios,
    summarize,
    time_ratio,
)
from netsense.cli import build_parser, main
from netsense.transport.emulation.linkspec import parse_link
from netsense.transport.emulation.traces import MahimahiTrace, StepRate, load_trace

TRACES = Path(__file__).resolve().parents[1] / "examples" / "traces"


def _rec(ttt: float | None, acc: float = 0.9, status: str = "ok", step_at_target: int | None | str = "absent", **kw: Any) -> dict[str, Any]:
    figures: dict[str, Any] | None = {"time_to_target_s": ttt, "final_accuracy": acc} if status == "ok" else None
    if figures is not None and step_at_target != "absent":
        figures["step_at_target"] = step_at_target
    return {"status": status, "figures": figures, **kw}


# --- arithmetic ----------------------------------------------------------------------------------


def test_summary_is_median_and_min_max_over_seeds() -> None:
    s = summarize([_rec(12.0, 0.91), _rec(10.0, 0.95), _rec(20.0, 0.93)])
    assert (s.runs, s.failed, s.reached) == (3, 0, 3)
    assert (s.median_s, s.min_s, s.max_s, s.final_accuracy) == (12.0, 10.0, 20.0, 0.93)
    assert format_cell(s) == "12.0 (10.0-20.0) / 0.930"
    even = summarize([_rec(10.0), _rec(14.0)])
    assert even.median_s == 12.0


def test_a_seed_that_missed_the_target_counts_as_infinite_and_a_failed_one_not_at_all() -> None:
    most = summarize([_rec(10.0), _rec(None, 0.5), _rec(11.0)])
    assert most.median_s == 11.0 and math.isinf(most.max_s) and most.reached == 2
    assert format_cell(most) == "11.0 (10.0-n/r) / 0.900"
    half = summarize([_rec(10.0), _rec(None)])
    assert math.isinf(half.median_s)  # half of the seeds did not get there: "not reached"
    failed = summarize([_rec(10.0), _rec(None, status="failed", reason="boom")])
    assert (failed.runs, failed.failed, failed.median_s) == (1, 1, 10.0)
    assert format_cell(failed) == "10.0 / 0.900 [1 failed]"
    assert format_cell(summarize([_rec(None, status="failed")])) == "failed (1)"


def test_the_cell_shows_the_median_step_the_target_was_read_at() -> None:
    """Over the seeds that reached it: time over step tells the step's speed from the progress
    per step. Records without the figure (older results.json) keep the old cell."""
    s = summarize([_rec(12.0, step_at_target=130), _rec(10.0, step_at_target=120), _rec(None, 0.8, step_at_target=None)])
    assert s.median_step == 125 and format_cell(s) == "12.0 (10.0-n/r) @ 125 / 0.900"
    assert format_cell(summarize([_rec(7.5, step_at_target=90)])) == "7.5 @ 90 / 0.900"
    assert summarize([_rec(12.0)]).median_step is None


def test_time_ratio_handles_targets_not_reached() -> None:
    assert time_ratio(10.0, 5.0) == 2.0
    assert time_ratio(10.0, math.inf) == 0.0  # only the first reached it: faster
    assert time_ratio(math.inf, 5.0) == math.inf
    assert time_ratio(math.inf, math.inf) is None
    assert time_ratio(math.nan, 5.0) is None


def _summ(median: float) -> CellSummary:
    return CellSummary(runs=2, failed=0, reached=2, median_s=median, min_s=median, max_s=median, final_accuracy=0.9)


def test_best_fixed_is_the_fastest_non_adaptive_policy() -> None:
    s = {"none": _summ(30.0), "fp16": _summ(20.0), "fixed:powersgd:2": _summ(15.0), "dc2": _summ(5.0),
         "accordion": _summ(4.0), "gravac": _summ(36.0), "netsense": _summ(18.0),
         "fixed:qsgd:4": _summ(math.inf)}  # fmt: skip
    assert best_fixed(s) == "fixed:powersgd:2"
    ratios = row_ratios(s)
    assert ratios["best_fixed"] == "fixed:powersgd:2"
    assert ratios["vs_best_fixed"] == pytest.approx(18.0 / 15.0)
    assert ratios["vs_dc2"] == pytest.approx(18.0 / 5.0) and ratios["vs_accordion"] == pytest.approx(4.5)
    assert ratios["vs_gravac"] == pytest.approx(0.5)
    assert "vs_netsenseml-paper" not in ratios  # not run: no column
    assert best_fixed({"none": _summ(math.inf), "netsense": _summ(1.0)}) is None


def _matrix(cells: dict[str, dict[str, Any]], policies: list[str]) -> dict[str, Any]:
    return {"models": ["m"], "links": {"20mbit": {}, "trace": {}}, "policies": policies, "seeds": [0, 1],
            "targets": {"m": 0.8}, "cells": cells}  # fmt: skip


def test_table_has_one_row_per_scenario_and_netsense_ratios() -> None:
    cells = {}
    times = {"none": (40.0, 44.0), "fp16": (20.0, 22.0), "fixed:qsgd:4": (12.0, 16.0), "dc2": (15.0, 15.0),
             "netsense": (13.0, 15.0)}  # fmt: skip
    for policy, (a, b) in times.items():
        for seed, t in enumerate((a, b)):
            cells[cell_key("m", "20mbit", policy, seed)] = _rec(t, model="m", link="20mbit", policy=policy, seed=seed)
    cells[cell_key("m", "trace", "netsense", 0)] = _rec(None, model="m", link="trace", policy="netsense", seed=0,
                                                        status="failed", reason="exit 1: the PS died")  # fmt: skip
    table = markdown_matrix(_matrix(cells, list(times)))
    lines = table.splitlines()
    assert lines[0] == ("| model | link | `none` | `fp16` | `fixed:qsgd:4` | `dc2` | `netsense` | best fixed "
                        "| netsense / best fixed | netsense / dc2 |")  # fmt: skip
    row = lines[2]
    assert row.startswith("| m | 20mbit | 42.0 (40.0-44.0) / 0.900 | 21.0 (20.0-22.0) / 0.900 | 14.0 (12.0-16.0)")
    assert row.endswith("| 14.0 (13.0-15.0) / 0.900 | `fixed:qsgd:4` | **1.00** | **0.93** |")
    assert lines[3] == "| m | trace |  |  |  |  | failed (1) | none reached | — | — |"
    assert "Failed `m x trace x netsense x 0`: exit 1: the PS died" in table


# --- flags ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seeds", "0"], "--seeds must be >= 1"),
        (["--max-time", "0"], "--max-time must be > 0"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--workers", "0"], "--workers must be >= 1"),
        (["--links", "30mbit"], "unknown link '30mbit'"),
        (["--links", "trace:/no/such.trace"], "--links trace:/no/such.trace: link spec field 'trace': cannot read"),
        (["--links", "20mbit,20mbit"], "repeats a name"),
        (["--policies", "fp16,nope"], "nope"),
        (["--policies", "fp16,ddp:fp16"], "need network namespaces"),
        (["--models", "no-such-model"], "unknown model 'no-such-model'"),
        (["--targets", "1.5"], "--targets: an accuracy must be in (0, 1]"),
        (["--targets", "charlm=0.5"], "MODEL=ACC with MODEL one of --models"),
        (["--models", "examples.own_model:task"], "--targets: no default target for examples.own_model:task"),
    ],
)
def test_bad_flags_are_one_line_errors_before_anything_runs(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*a: Any) -> Any:
        raise AssertionError("a run started")

    monkeypatch.setattr(matrix, "run_subprocess", never)
    base = ["bench", "matrix", "--models", "digits-cnn", "--links", "unshaped", "--out", str(tmp_path / "m")]
    assert main([*base, *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert message in err
    assert not (tmp_path / "m").exists()


def _args(tmp_path: Path, *extra: str) -> Any:
    return build_parser().parse_args(["bench", "matrix", "--models", "digits-cnn", "--links", "20mbit,unshaped",
                                      "--policies", "fp16,netsense", "--out", str(tmp_path / "m"), *extra])  # fmt: skip


class FakeRunner:
    """Stands in for the scenario subprocess: netsense fails once on the unshaped link, seed 0."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.failed: set[str] = set()

    def __call__(self, cell: matrix.Cell, argv: list[str], out: Path, limit_s: float) -> tuple[Any, str | None]:
        self.calls.append(cell.key)
        assert argv[:2] == ["bench", "scenario"] and argv[argv.index("--out") + 1] == str(out)
        if cell.key == cell_key("digits-cnn", "unshaped", "netsense", 0) and cell.key not in self.failed:
            self.failed.add(cell.key)
            return None, "exit 1: crashed"
        return {"time_to_target_s": 10.0 + cell.seed, "final_accuracy": 0.95, "steps": 100}, None


def test_resume_skips_the_runs_that_finished_and_retries_failed_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeRunner()
    assert matrix.run(_args(tmp_path, "--seeds", "1"), runner=fake) == 1  # one run failed
    assert len(fake.calls) == 4
    results = json.loads((tmp_path / "m" / "results.json").read_text())
    assert results["cells"][cell_key("digits-cnn", "unshaped", "netsense", 0)]["reason"] == "exit 1: crashed"
    assert "matrix [4/4]" in capsys.readouterr().err

    assert main(["bench", "matrix", "--models", "digits-cnn", "--out", str(tmp_path / "m"), "--seeds", "1"]) == 2
    assert "pass --resume" in capsys.readouterr().err  # a second run never overwrites a matrix silently

    fake.calls.clear()
    assert matrix.run(_args(tmp_path, "--seeds", "2", "--resume"), runner=fake) == 0
    assert fake.calls == [cell_key("digits-cnn", "unshaped", "netsense", 0)] + [
        cell_key("digits-cnn", link, p, 1) for link in ("20mbit", "unshaped") for p in ("fp16", "netsense")
    ]
    err = capsys.readouterr().err
    assert "3 run(s) already in" in err and "5 to go" in err
    results = json.loads((tmp_path / "m" / "results.json").read_text())
    assert len(results["cells"]) == 8 and all(r["status"] == "ok" for r in results["cells"].values())
    assert len(results["runs"]) == 2 and results["seeds"] == [0, 1]
    assert "10.5 (10.0-11.0) / 0.950" in (tmp_path / "m" / "matrix.md").read_text()

    fake.calls.clear()
    assert matrix.run(_args(tmp_path, "--seeds", "2", "--resume"), runner=fake) == 0
    assert fake.calls == []


def test_calibrate_runs_once_per_model_and_hands_netsense_its_table(tmp_path: Path) -> None:
    calibrations: list[list[str]] = []
    argvs: dict[str, list[str]] = {}

    def calibrator(argv: list[str], log: Path) -> None:
        calibrations.append(argv)
        Path(argv[argv.index("--out") + 1]).write_text("{}")

    def runner(cell: matrix.Cell, argv: list[str], out: Path, limit_s: float) -> tuple[Any, str | None]:
        argvs[cell.key] = argv
        return {"time_to_target_s": 10.0, "final_accuracy": 0.95, "steps": 100}, None

    assert matrix.run(_args(tmp_path, "--seeds", "1", "--calibrate"), runner=runner, calibrator=calibrator) == 0
    assert len(calibrations) == 1 and calibrations[0][:3] == ["calibrate", "--model", "digits-cnn"]
    assert calibrations[0][calibrations[0].index("--workers") + 1] == "2"
    results = json.loads((tmp_path / "m" / "results.json").read_text())
    table = results["calibration"]["digits-cnn"]["table"]
    assert table == str((tmp_path / "m" / "tables" / "digits-cnn.json").resolve()) and results["settings"]["calibrate"]
    for key, argv in argvs.items():
        has = "--progress-table" in argv
        assert has == ("netsense" in key), (key, argv)
        if has:
            assert argv[argv.index("--progress-table") + 1] == table
    assert "netsense ran with calibrated q" in (tmp_path / "m" / "matrix.md").read_text()
    # A resume keeps the table it made (and must keep calibrating: the figures depend on it).
    assert matrix.run(_args(tmp_path, "--seeds", "2", "--calibrate", "--resume"), runner=runner, calibrator=calibrator) == 0
    assert len(calibrations) == 1
    with pytest.raises(matrix.ConfigError, match="calibrate"):
        matrix.run(_args(tmp_path, "--seeds", "2", "--resume"), runner=runner, calibrator=calibrator)


def test_resume_refuses_other_settings(tmp_path: Path) -> None:
    assert matrix.run(_args(tmp_path, "--seeds", "1"), runner=FakeRunner()) == 1
    with pytest.raises(matrix.ConfigError, match="max_time_s=300.0, now 60.0"):
        matrix.run(_args(tmp_path, "--resume", "--max-time", "60"), runner=FakeRunner())
    with pytest.raises(matrix.ConfigError, match="target digits-cnn was 0.9, now 0.5"):
        matrix.run(_args(tmp_path, "--resume", "--targets", "0.5"), runner=FakeRunner())


def test_resume_refuses_a_file_that_is_no_matrix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "results.json").write_text(json.dumps({"format": "netsense-bench-scenario", "policies": {}}))
    assert main(["bench", "matrix", "--models", "digits-cnn", "--out", str(tmp_path / "m"), "--resume"]) == 2
    assert "results.json is not a netsense-bench-matrix file" in capsys.readouterr().err


def test_scenario_argv_passes_link_trace_and_settings(tmp_path: Path) -> None:
    links = matrix.parse_links("trace,unshaped")
    results = {"links": links, "targets": {"m": 0.7},
               "settings": {"max_time_s": 60.0, "workers": 2, "eval_every": 5, "steps": 40, "batch_size": None}}  # fmt: skip
    argv = matrix.scenario_argv(matrix.Cell("m", "trace", "dc2", 1), results, tmp_path, insecure=True)
    pairs = dict(zip(argv[2::2], argv[3::2]))
    assert pairs["--link"] == "delay=20ms" and pairs["--trace"] == str(TRACES / "cellular.mahimahi")
    assert (pairs["--policies"], pairs["--seed"], pairs["--max-time"], pairs["--target-accuracy"]) == ("dc2", "1", "60.0", "0.7")
    assert pairs["--steps"] == "40" and "--batch-size" not in argv and argv[-1] == "--insecure"
    bare = matrix.scenario_argv(matrix.Cell("m", "unshaped", "dc2", 0), results, tmp_path, insecure=False)
    assert "--link" not in bare and "--trace" not in bare and "--insecure" not in bare
    assert bare[bare.index("--downlink") + 1] == "same"  # a results.json from before the flag ran the parameter domain
    gradient = matrix.scenario_argv(matrix.Cell("m", "unshaped", "dc2", 0), {**results, "settings": {**results["settings"], "downlink": "gradient"}}, tmp_path, insecure=False)
    assert gradient[gradient.index("--downlink") + 1] == "gradient"


# --- the subprocess: a hung run is killed with its children --------------------------------------

HANG = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[-1], "w").write(str(child.pid))
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_hung_run_is_killed_with_its_children_and_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pidfile = tmp_path / "child.pid"
    monkeypatch.setattr(matrix, "SCENARIO_CMD", (sys.executable, "-c", HANG))
    cell = matrix.Cell("m", "unshaped", "fp16", 0)
    t0 = time.monotonic()
    figures, reason = matrix.run_subprocess(cell, [str(pidfile)], tmp_path / "run", limit_s=3.0)
    assert figures is None and reason is not None and reason.startswith("hung: no result after 3 s, killed")
    assert time.monotonic() - t0 < 60
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the run's child outlived the kill"


def test_a_run_that_exits_with_an_error_gives_its_last_error_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = "import sys; print('starting'); print('netsense bench: error: --link spec field rate: bad', file=sys.stderr); sys.exit(2)"
    monkeypatch.setattr(matrix, "SCENARIO_CMD", (sys.executable, "-c", script))
    figures, reason = matrix.run_subprocess(matrix.Cell("m", "l", "fp16", 0), [], tmp_path / "run", limit_s=60.0)
    assert figures is None and reason == "exit 2: netsense bench: error: --link spec field rate: bad"


# --- the shipped traces --------------------------------------------------------------------------


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("make_cellular", TRACES / "make_cellular.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cellular_trace_is_its_script_output_with_the_intended_mean_and_range(tmp_path: Path) -> None:
    gen = _generator()
    rates = gen.rate_curve()
    assert gen.main(["make_cellular.py", str(tmp_path / "t")]) == 0
    assert (tmp_path / "t").read_text() == (TRACES / "cellular.mahimahi").read_text()  # regenerable byte for byte
    trace = load_trace(TRACES / "cellular.mahimahi")
    assert isinstance(trace, MahimahiTrace) and trace.period_s == gen.PERIOD_S == 30.0
    assert trace.mean_bps / 1e6 == pytest.approx(gen.mean_mbit(rates), rel=0.005)
    assert 25.0 < trace.mean_bps / 1e6 < 40.0
    assert min(rates) == gen.LOW_MBIT and max(rates) == gen.HIGH_MBIT  # it does swing over the whole 5-60 range
    windows = [trace.rate_at(t / 10, window_s=1.0) / 1e6 for t in range(0, 290)]  # 1 s averages
    assert min(windows) < 15.0 and max(windows) > 45.0
    assert trace.capacity(30.0 + 1.0) - trace.capacity(30.0) == trace.capacity(1.0)  # it loops
    assert parse_link("delay=20ms", trace=TRACES / "cellular.mahimahi").up.delay_s == 0.02


def test_the_step_link_loops_with_the_intended_mean() -> None:
    rate = parse_link(matrix.STEP_LINK).up.rate
    assert isinstance(rate, StepRate) and rate.period_s == 16.0
    assert rate.mean_bps == pytest.approx(46.25e6)
    assert [rate.rate_at(t) / 1e6 for t in (1, 5, 9, 13, 17, 21)] == [50, 10, 100, 25, 50, 10]


# --- end to end ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_tiny_matrix_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m"
    argv = ["bench", "matrix", "--models", "digits-cnn", "--links", "unshaped", "--policies", "none,fp16",
            "--seeds", "1", "--steps", "20", "--eval-every", "10", "--targets", "0.05", "--max-time", "60",
            "--insecure", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert sorted(results["cells"]) == [cell_key("digits-cnn", "unshaped", p, 0) for p in ("fp16", "none")]
    for record in results["cells"].values():
        assert record["status"] == "ok" and record["figures"]["steps"] == 20
        assert record["figures"]["time_to_target_s"] is not None
    table = (out / "matrix.md").read_text()
    assert "| digits-cnn | unshaped |" in table
    assert (out / "runs" / "digits-cnn" / "unshaped" / "fp16" / "seed0" / "results.json").exists()
    assert main([*argv, "--resume"]) == 0  # nothing left to run
    assert "2 run(s) already in" in capsys.readouterr().err


def test_a_failed_calibration_stops_the_matrix_with_its_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matrix, "SCENARIO_CMD", (sys.executable, "-c", "import sys; print('calibrate: error: no such model'); sys.exit(2)"))
    with pytest.raises(matrix.ConfigError, match="exit 2.*calibrate: error: no such model"):
        matrix.run_calibrate(["calibrate", "--model", "x"], tmp_path / "log.txt")
