"""The level ladder: parsing against the codec registry, calibration, and the calibration file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import netsense.compression as comp
from netsense.compression.base import Codec, Payload, codec_names, register_codec
from netsense.compression.policy.ladder import (
    DEFAULT_DECODE_S_PER_MB,
    DEFAULT_ENCODE_S_PER_MB,
    DEFAULT_LADDER,
    DEFAULT_LOSSLESS_S_PER_MB,
    Ladder,
    Level,
    level_for,
)
from netsense.errors import ConfigError


class FakeRatio(Codec):
    """Sends a fixed fraction of fp32's bytes (zeros), so ratios are known exactly."""

    def __init__(self, arg: str | None) -> None:
        self.fraction = float(arg or "nan")
        if not 0 < self.fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {arg!r}")
        self.spec = f"ladderfake:{arg}"

    def encode(self, tensor: torch.Tensor) -> Payload:
        size = int(self.fraction * tensor.numel() * 4)
        return Payload(self.spec, tuple(tensor.shape), "float32", (bytes(size),))

    def decode(self, payload: Payload, *, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.zeros(payload.shape, device=device)

    def nominal_ratio(self, numel: int) -> float:
        return self.fraction


register_codec("ladderfake", FakeRatio)


def test_parse_dense_levels() -> None:
    ladder = Ladder.parse("fp32, fp16,bf16")
    assert ladder.specs == ("fp32", "fp16", "bf16")
    assert [lv.lossless for lv in ladder] == [True, False, False]
    assert [lv.ratio for lv in ladder] == [1.0, 0.5, 0.5]
    assert ladder[0].encode_s_per_mb == DEFAULT_LOSSLESS_S_PER_MB
    assert (ladder[1].encode_s_per_mb, ladder[1].decode_s_per_mb) == (DEFAULT_ENCODE_S_PER_MB, DEFAULT_DECODE_S_PER_MB)
    assert not any(lv.calibrated for lv in ladder)
    assert Ladder.parse(["fp32", "ladderfake:0.25"])[1].ratio == 0.25


def test_parse_canonicalizes_and_round_trips() -> None:
    ladder = Ladder.parse("none,fp16")
    assert ladder.specs == ("fp32", "fp16")
    assert Ladder.parse(ladder.spec) == ladder
    assert ladder.find("fp16") == 1
    assert ladder.find("none") == 0
    assert ladder.find("bf16") is None
    assert ladder.find("nosuchcodec") is None
    assert len(ladder) == 2 and list(ladder) == list(ladder.levels)


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("fp32,nosuchcodec:3", "nosuchcodec:3"),
        ("fp32,fp16:x", "fp16:x"),
        ("fp32,ladderfake:2", "ladderfake:2"),
    ],
)
def test_parse_names_the_bad_spec(text: str, bad: str) -> None:
    with pytest.raises(ConfigError, match=bad):
        Ladder.parse(text)


@pytest.mark.parametrize("text", ["", "fp32,,fp16", "fp32, "])
def test_parse_rejects_empty_levels(text: str) -> None:
    with pytest.raises(ConfigError, match="empty level"):
        Ladder.parse(text)


def test_duplicate_levels_rejected() -> None:
    with pytest.raises(ConfigError, match="fp32"):
        Ladder.parse("fp32,none")


def test_level_validates_figures() -> None:
    with pytest.raises(ConfigError, match="ratio"):
        Level("x", 0.0, 0.0, 0.0, False)
    with pytest.raises(ConfigError, match="encode_s_per_mb"):
        Level("x", 0.5, -1.0, 0.0, False)
    with pytest.raises(ConfigError, match="at least one"):
        Ladder(())


def test_level_cost_arithmetic() -> None:
    lv = Level("x", 0.25, 0.01, 0.002, False)
    assert lv.wire_bytes(4_000_000) == 1_000_000
    assert math.isclose(lv.codec_s(45_000_000), 0.012 * 45)


def test_default_ladder_when_codecs_registered() -> None:
    missing = {"qsgd", "topk", "powersgd"} - set(codec_names())
    if missing:
        pytest.skip(f"codecs {sorted(missing)} not registered yet")
    ladder = Ladder.default()
    assert len(ladder) == 9 and ladder.spec.split(",")[0] == "fp32"
    assert ladder[0].lossless and not any(lv.lossless for lv in ladder.levels[1:])
    assert DEFAULT_LADDER.split(",")[-1] == "topk:0.001+fp16"
    assert ladder[-1].ratio < 0.01


def test_calibrate_measures_ratio_and_cost() -> None:
    ladder = Ladder.parse("fp32,fp16,ladderfake:0.25").calibrate(numel=1 << 14, repeats=2)
    assert all(lv.calibrated for lv in ladder)
    # Measured ratios include the payload framing, so they sit a hair above the nominal ones.
    for lv, nominal in zip(ladder, (1.0, 0.5, 0.25), strict=True):
        assert nominal <= lv.ratio < nominal + 0.01
        assert math.isfinite(lv.encode_s_per_mb) and lv.encode_s_per_mb >= 0
        assert math.isfinite(lv.decode_s_per_mb) and lv.decode_s_per_mb >= 0
    assert ladder.specs == ("fp32", "fp16", "ladderfake:0.25")
    with pytest.raises(ConfigError):
        ladder.calibrate(numel=0)


def test_save_load_round_trip(tmp_path: Path) -> None:
    ladder = Ladder.parse("fp32,fp16").calibrate(numel=1024, repeats=1)
    path = tmp_path / "ladder.json"
    ladder.save(path)
    assert Ladder.load(path) == ladder
    assert json.loads(path.read_text())["format"] == "netsense-ladder-calibration"
    assert [p.name for p in tmp_path.iterdir()] == ["ladder.json"]  # no temp file left behind


def test_with_measurements_takes_matching_specs() -> None:
    measured = Ladder((Level("fp16", 0.51, 0.001, 0.001, False, calibrated=True),))
    merged = Ladder.parse("fp32,fp16,bf16").with_measurements(measured)
    assert [lv.calibrated for lv in merged] == [False, True, False]
    assert merged[1].ratio == 0.51


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (None, "cannot read"),
        ("{not json", "cannot read"),
        ('{"format": "other", "version": 1, "levels": []}', "not a version-1"),
        ('{"format": "netsense-ladder-calibration", "version": 1, "levels": {}}', "must be a list"),
        ('{"format": "netsense-ladder-calibration", "version": 1, "levels": [{"spec": "fp32"}]}', "bad field"),
        ('{"format": "netsense-ladder-calibration", "version": 1, "levels": [3]}', "malformed"),
        (
            '{"format": "netsense-ladder-calibration", "version": 1, "levels": [{"spec": "gone:1", "ratio": 1,'
            ' "encode_s_per_mb": 0, "decode_s_per_mb": 0, "lossless": true}]}',
            "gone:1",
        ),
    ],
)
def test_load_errors(tmp_path: Path, content: str | None, match: str) -> None:
    path = tmp_path / "ladder.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=match):
        Ladder.load(path)


def test_level_for_uses_nominal_ratio() -> None:
    assert level_for("ladderfake:0.125").ratio == 0.125
    with pytest.raises(ConfigError, match="nope"):
        level_for("nope")


def test_public_exports() -> None:
    for name in ("Ladder", "Level", "DEFAULT_LADDER"):
        assert name in comp.__all__ and hasattr(comp, name)
