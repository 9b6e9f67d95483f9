"""`netsense.bench.plot` and `netsense plot DIR`: figures from a results.json, and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from netsense.cli import main
from netsense.bench.plot import FIGURES, plot_results

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _policy(ttt: float | None, *, levels: list[int], est: list[float | None], t: list[float | None]) -> dict[str, object]:
    return {
        "samples_per_s": 500.0, "time_to_target_s": ttt, "final_accuracy": 0.93, "bytes_up": 10**6,
        "bytes_down": 2 * 10**6, "steps": 4, "wall_s": 8.0, "mean_step_s": 2.0, "ideal_step_s": 1.5,
        "evals": [[2.0, 1, 0.4], [4.0, 2, 0.8], [8.0, 4, 0.93]],
        "timeline": {"t_s": t, "step": [1, 2, 3, 4], "level": levels, "spec": ["fp32"] * 4,
                     "bw_est_bps": est, "true_bps": [1e8, 1e8, 1e7, 1e7] if t[0] is not None else [None] * 4},
    }  # fmt: skip


def _results(t: list[float | None]) -> dict[str, object]:
    return {
        "scenario": {"model": "digits-cnn", "workers": 2, "link": "rate=0s:100mbit,2s:10mbit"},
        "target_accuracy": 0.9,
        "policies": {
            "none": _policy(None, levels=[0, 0, 0, 0], est=[None, 9e7, 9e7, 9e6], t=t),
            "netsense": _policy(7.0, levels=[0, 1, 5, 5], est=[None, 9.5e7, 2e7, 9e6], t=t),
        },
    }


@pytest.mark.parametrize("t", [[0.5, 1.5, 2.5, 3.5], [None, None, None, None]], ids=["link-clock", "unshaped"])
def test_plot_results_writes_every_png(tmp_path: Path, t: list[float | None]) -> None:
    paths = plot_results(_results(t), tmp_path / "figs")
    assert [p.name for p in paths] == list(FIGURES)
    for p in paths:
        assert p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 5000


def test_cli_redraws_and_writes_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "results.json").write_text(json.dumps(_results([0.5, 1.5, 2.5, 3.5])))
    assert main(["plot", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| `netsense` |" in out and "7.0" in out
    assert (tmp_path / "results.md").read_text().startswith("| policy |")
    assert all((tmp_path / name).exists() for name in FIGURES)


def test_cli_errors_name_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", str(tmp_path)]) == 2
    assert "run `netsense bench scenario" in capsys.readouterr().err
    (tmp_path / "results.json").write_text("{not json")
    assert main(["plot", str(tmp_path)]) == 2
    assert "is not JSON" in capsys.readouterr().err
    broken = _results([0.5, 1.5, 2.5, 3.5])
    broken["policies"]["none"]["bytes_up"] = 0  # type: ignore[index]
    (tmp_path / "results.json").write_text(json.dumps(broken))
    assert main(["plot", str(tmp_path)]) == 2
    assert "bytes_up must be > 0" in capsys.readouterr().err
