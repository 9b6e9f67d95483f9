from __future__ import annotations

import pytest
import torch

from netsense.cli import main
from netsense.compression import make_codec, topkscan
from netsense.compression.bench import (
    DEFAULT_SPECS,
    REFERENCE,
    _interleaved_times,
    make_bench_codec,
    matrix_shape,
    run_codec_bench,
)
from netsense.errors import CompressionError


def test_result_has_exactly_the_promised_keys() -> None:
    result = run_codec_bench(numel=20_000, specs=["fp32", "topk:0.01+fp16"], repeats=1)
    assert set(result) == {"numel", "rows", "clone_s", "codecs"}
    assert result["numel"] == 20_000 and result["clone_s"] > 0
    assert list(result["codecs"]) == ["fp32", "topk:0.01+fp16"]
    for figures in result["codecs"].values():
        assert set(figures) == {"encode_s", "decode_s", "clone_s", "ratio"}
        assert figures["clone_s"] > 0
    assert 1.0 < result["codecs"]["fp32"]["ratio"] < 1.01
    assert result["codecs"]["topk:0.01+fp16"]["ratio"] < 0.0125


def test_default_specs_cover_every_codec_family() -> None:
    families = {spec.partition(":")[0].partition("+")[0] for spec in DEFAULT_SPECS}
    assert families == {"fp32", "fp16", "bf16", "qsgd", "topk", "topka", "randk", "threshold", "powersgd"}
    for spec in DEFAULT_SPECS:
        make_codec(spec)


def test_matrix_shape_is_near_square() -> None:
    assert matrix_shape(11_000_000) == (3125, 3520)
    assert matrix_shape(13) == (1, 13)


def test_clone_is_timed_in_turn_with_each_codec() -> None:
    calls: list[str] = []
    times = _interleaved_times([lambda: calls.append("clone"), lambda: calls.append("encode")], 3, torch.device("cpu"))
    assert calls == ["clone", "encode"] * 3
    assert [len(t) for t in times] == [3, 3]


def test_reference_rows_time_torch_topk_beside_the_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    scans: list[int] = []
    scan = topkscan.topk_indices
    monkeypatch.setattr(topkscan, "topk_indices", lambda flat, k, rng: scans.append(k) or scan(flat, k, rng))
    new, old = make_bench_codec("topk:0.01+fp16"), make_bench_codec(f"topk:0.01+fp16{REFERENCE}")
    x = torch.randn(50_000)
    assert old.encode(x).parts == new.encode(x).parts and scans == [500]  # same payload, one scan
    assert old.spec == "topk:0.01+fp16"  # the payload names the real codec
    result = run_codec_bench(numel=20_000, specs=["topk:0.01", f"topk:0.01{REFERENCE}"], repeats=1)
    assert list(result["codecs"]) == ["topk:0.01", "topk:0.01@torch"]


@pytest.mark.parametrize("spec", ["fp16@torch", "topk:0.01@numpy", "topk:0.01@"])
def test_reference_suffix_only_on_top_k(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(CompressionError, match="only a top-k spec"):
        make_bench_codec(spec)
    assert main(["bench", "codecs", "--numel", "1000", "--specs", spec]) == 2
    assert spec in capsys.readouterr().err


def test_a_share_of_nonzero_rows_is_what_the_codecs_see(capsys: pytest.CaptureFixture[str]) -> None:
    """--rows 0.25: a quarter of the rows nonzero, as an embedding's gradient (threshold:1e-45
    sends exactly the nonzeros); out of range is a one-line error before anything is timed."""
    result = run_codec_bench(numel=20_000, specs=["threshold:1e-45"], repeats=1, rows=0.25)
    rows, cols = matrix_shape(20_000)
    nonzero = round(0.25 * rows) * cols
    sent = make_codec("threshold:1e-45").encode(torch.ones(nonzero))
    assert result["rows"] == 0.25
    assert result["codecs"]["threshold:1e-45"]["ratio"] == pytest.approx(sent.wire_size / (4 * 20_000), rel=0.05)
    for bad in ("0", "1.5", "-0.1"):
        assert main(["bench", "codecs", "--numel", "1000", "--rows", bad]) != 0
        assert "--rows must be in (0, 1]" in capsys.readouterr().err
