"""`netsense plot RUN_DIR` on a launch run folder draws the timeline and accuracy PNGs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from netsense.cli import main
from netsense.errors import ConfigError
from netsense.bench.plot_run import plot_run

PNG = b"\x89PNG\r\n\x1a\n"


def _write_run(d: Path) -> None:
    d.mkdir()
    for rank in (0, 1):
        recs = [{"t": 100.0 + 0.5 * s, "step": s, "level": min(s // 5, 3), "bw_Bps": 2.5e6 + rank * 1e5} for s in range(20)]
        (d / f"decisions-up-{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"t": trunc')
    events = [{"t": 1000.0 + 0.5 * s, "rank": 0, "event": "step", "wall_s": 0.5 * s + 0.5, "samples_per_s": 100 + s} for s in range(20)]
    events += [{"t": 1005.0, "rank": 0, "event": "eval", "wall_s": 5.0, "test_accuracy": 0.8}]
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (d / "launch.json").write_text(json.dumps({"link": "rate=0s:20mbit,5s:10mbit", "trace": None}))


def test_plot_run_writes_pngs(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    _write_run(run)
    assert main(["plot", str(run)]) == 0
    for name in ("timeline.png", "accuracy.png"):
        data = (run / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000


def test_plot_run_refuses_other_folders(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a `netsense launch` run folder"):
        plot_run(tmp_path)
