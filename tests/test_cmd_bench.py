"""`netsense bench codecs` through `netsense.cli.main`: JSON shape, figures, errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from netsense.cli import main

SPECS = ["fp32", "fp16", "qsgd:8", "topka:0.01+fp16", "powersgd:2"]


def test_codecs_writes_finite_figures_and_consistent_ratios(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "codecs.json"
    status = main(["bench", "codecs", "--numel", "100000", "--repeats", "2", "--specs", ",".join(SPECS), "--json", str(out)])
    assert status == 0
    result = json.loads(out.read_text())
    assert result["numel"] == 100_000
    assert math.isfinite(result["clone_s"]) and result["clone_s"] > 0
    assert list(result["codecs"]) == SPECS
    for figures in result["codecs"].values():
        assert set(figures) == {"encode_s", "decode_s", "clone_s", "ratio"}
        assert all(math.isfinite(v) and v > 0 for v in figures.values())
    ratios = {spec: f["ratio"] for spec, f in result["codecs"].items()}
    assert ratios["fp32"] == pytest.approx(1.0, abs=0.01)
    assert ratios["fp16"] == pytest.approx(0.5, abs=0.01)
    assert ratios["qsgd:8"] == pytest.approx(0.25 + 1 / 512, abs=0.01)
    assert 0.005 < ratios["topka:0.01+fp16"] < 0.012
    assert ratios["powersgd:2"] < 0.05
    table = capsys.readouterr().out
    assert "x clone" in table and all(spec in table for spec in SPECS)


def test_default_specs_without_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "codecs", "--numel", "5000", "--repeats", "1"]) == 0
    assert "qsgd:8" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--specs", "fp16,nope:3"], "unknown codec 'nope'"),
        (["--specs", "topk:2"], "topk:2"),
        (["--specs", ","], "names no codec"),
        (["--device", "tpu9"], "--device 'tpu9'"),
        (["--numel", "0"], "--numel"),
        (["--repeats", "0"], "--repeats"),
    ],
)
def test_bad_arguments_exit_2_with_the_value(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "codecs", "--numel", "1000", *argv]) == 2
    assert message in capsys.readouterr().err


def test_cuda_refused_clearly_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["bench", "codecs", "--numel", "1000", "--device", "cuda"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_bench_without_kind_shows_the_kinds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench"]) == 2
    assert "codecs" in capsys.readouterr().out


def test_help_has_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "codecs", "--help"])
    assert exc.value.code == 0
    assert "netsense bench codecs --numel 11000000 --json" in capsys.readouterr().out
