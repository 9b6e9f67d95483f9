"""The level ladder: the codecs a policy may pick from, ordered from lossless to heaviest.

The ladder is data (config), not code: `Ladder.parse("fp32,fp16,qsgd:8")` looks every spec up in
the codec registry, so a new codec becomes a level without touching the policies. Each level
carries what the policies need to predict a step: its wire-size ratio and its encode+decode cost.
Both are planning figures from `Codec.nominal_ratio` and conservative defaults until
`Ladder.calibrate` measures them on this machine (docs/POLICIES.md: measured, not assumed).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from netsense.errors import CompressionError, ConfigError

from ..base import make_codec

DEFAULT_LADDER = "fp32,fp16,qsgd:8,qsgd:4,powersgd:4,powersgd:2,topk:0.01+fp16,powersgd:1,topk:0.001+fp16"
"""The default ladder (docs/POLICIES.md, "The ladder"): fp32 -> 16-bit -> 8/4-bit stochastic
quantization -> PowerSGD ranks 4 and 2 -> top-k 1% -> PowerSGD rank 1 -> top-k 0.1%."""

NOMINAL_NUMEL = 1 << 20
"""Tensor size (elements) at which uncalibrated ratios are asked of `Codec.nominal_ratio`."""

MB = 1_000_000
"""Costs are quoted per MB (10^6 bytes) of dense fp32 input, the unit the policies scale by."""

# Uncalibrated costs, deliberately on the slow side: overestimating a lossy level's cost only
# makes the policy compress a little less, which is the safe direction. A lossless level is a
# memory copy (~2 GB/s here); a lossy encode is budgeted at 100 MB/s (exact top-k on 2 CPU cores
# is of that order), its decode (scatter or cast) at 500 MB/s.
DEFAULT_LOSSLESS_S_PER_MB = 0.0005
DEFAULT_ENCODE_S_PER_MB = 0.01
DEFAULT_DECODE_S_PER_MB = 0.002

_FILE_FORMAT = "netsense-ladder-calibration"
_FILE_VERSION = 1


@dataclass(frozen=True)
class Level:
    """One rung of the ladder: a codec spec and what it costs to use it."""

    spec: str
    """Canonical codec spec, e.g. ``"fp16"`` or ``"topk:0.01+fp16"``; `make_codec(spec)` builds it."""
    ratio: float
    """Wire size relative to fp32 dense (1.0 for fp32, ~0.5 for fp16)."""
    encode_s_per_mb: float
    """Encode seconds per MB of dense fp32 input."""
    decode_s_per_mb: float
    """Decode seconds per MB of dense fp32 output (the parameter server pays it)."""
    lossless: bool
    """True when decode(encode(x)) == x exactly; lossy levels need error feedback."""
    calibrated: bool = False
    """True when ratio and costs were measured here, False for nominal figures and defaults."""
    progress: float = 1.0
    """Prior progress efficiency q in (0, 1]: optimisation progress of one step at this level
    relative to a lossless step (`Codec.nominal_progress`); policies refine it online."""
    return_decode_s_per_mb: float | None = None
    """Seconds per MB the worker takes to decode an update that comes back at this level (a
    gradient-domain PS: `return_s`), measured on the run's steps (`CodecCosts.observe_return`);
    None: the sender timed no update (priced 0, as before the figure existed)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ratio) and self.ratio > 0):
            raise ConfigError(f"level {self.spec!r}: ratio must be a positive finite number, got {self.ratio!r}")
        for name in ("encode_s_per_mb", "decode_s_per_mb", "return_decode_s_per_mb"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"level {self.spec!r}: {name} must be >= 0 and finite, got {value!r}")
        if not (math.isfinite(self.progress) and 0 < self.progress <= 1):
            raise ConfigError(f"level {self.spec!r}: progress must be in (0, 1], got {self.progress!r}")

    def wire_bytes(self, payload_bytes: int) -> float:
        """Predicted bytes on the wire for `payload_bytes` of dense fp32 gradient."""
        return self.ratio * payload_bytes

    def codec_s(self, payload_bytes: int) -> float:
        """Predicted encode + decode seconds (e_l of the step-time model, docs/POLICIES.md) for
        `payload_bytes` of fp32."""
        return (self.encode_s_per_mb + self.decode_s_per_mb) * payload_bytes / MB

    def return_s(self, payload_bytes: int) -> float:
        """Predicted seconds for the worker to decode an update of `payload_bytes` that comes back
        at this level, 0 where none was timed: a sender that does not time it (a relay) may hold
        that decode in its Tc already (docs/POLICIES.md, "The update's decode")."""
        return (self.return_decode_s_per_mb or 0.0) * payload_bytes / MB


def level_for(spec: str, *, numel: int = NOMINAL_NUMEL) -> Level:
    """An uncalibrated level for `spec`: the codec's nominal ratio and the default costs.

    Raises `ConfigError` naming the spec when no registered codec accepts it.
    """
    try:
        codec = make_codec(spec)
    except CompressionError as exc:
        raise ConfigError(f"ladder level {spec!r} is not a valid codec spec: {exc}") from exc
    lossless = bool(codec.lossless)
    return Level(
        spec=codec.spec or spec,
        ratio=float(codec.nominal_ratio(numel)),
        encode_s_per_mb=DEFAULT_LOSSLESS_S_PER_MB if lossless else DEFAULT_ENCODE_S_PER_MB,
        decode_s_per_mb=DEFAULT_LOSSLESS_S_PER_MB if lossless else DEFAULT_DECODE_S_PER_MB,
        lossless=lossless,
        progress=1.0 if lossless else float(codec.nominal_progress(numel)),
    )


@dataclass(frozen=True)
class Ladder:
    """Levels ordered from least to most lossy; index 0 is the safe default.

    The order is the config's statement of lossiness, not a sort by ratio: a top-k level may
    send more bytes than a 4-bit one and still be the heavier reduction.
    """

    levels: tuple[Level, ...]
    """The rungs, lossless first."""

    def __post_init__(self) -> None:
        if not self.levels:
            raise ConfigError("a ladder needs at least one level, got none")
        specs = [lv.spec for lv in self.levels]
        dupes = sorted({s for s in specs if specs.count(s) > 1})
        if dupes:
            raise ConfigError(f"ladder repeats level(s) {', '.join(dupes)}; each spec may appear once")

    @classmethod
    def parse(cls, text: str | Sequence[str], *, numel: int = NOMINAL_NUMEL) -> Ladder:
        """Build an uncalibrated ladder from ``"fp32,fp16,..."`` (or a list of specs)."""
        items = text.split(",") if isinstance(text, str) else list(text)
        specs = [s.strip() for s in items]
        if not specs or any(not s for s in specs):
            raise ConfigError(f"ladder {text!r} has an empty level; write specs separated by commas")
        return cls(tuple(level_for(s, numel=numel) for s in specs))

    @classmethod
    def default(cls) -> Ladder:
        """`DEFAULT_LADDER`, parsed (needs the quantization and top-k codecs registered)."""
        return cls.parse(DEFAULT_LADDER)

    def __len__(self) -> int:
        return len(self.levels)

    def __iter__(self) -> Iterator[Level]:
        return iter(self.levels)

    def __getitem__(self, index: int) -> Level:
        return self.levels[index]

    @property
    def specs(self) -> tuple[str, ...]:
        """The level specs in order."""
        return tuple(lv.spec for lv in self.levels)

    @property
    def spec(self) -> str:
        """The comma-separated form that `parse` reads back."""
        return ",".join(self.specs)

    def find(self, spec: str) -> int | None:
        """Index of the level whose spec is `spec` (or its canonical form), None if absent."""
        if spec in self.specs:
            return self.specs.index(spec)
        try:
            canonical = make_codec(spec).spec
        except CompressionError:
            return None
        return self.specs.index(canonical) if canonical in self.specs else None

    def calibrate(self, *, numel: int = NOMINAL_NUMEL, repeats: int = 3, seed: int = 0) -> Ladder:
        """Measure every level's real wire ratio and encode/decode cost on this machine.

        Uses one random normal fp32 tensor of `numel` elements (gradients are roughly that);
        each cost is the median of `repeats` timed runs after one warm-up run, which absorbs
        lazy initialisation and warm-started state. Returns a new ladder.
        """
        if numel < 1 or repeats < 1:
            raise ConfigError(f"calibrate needs numel >= 1 and repeats >= 1, got {numel} and {repeats}")
        gen = torch.Generator().manual_seed(seed)
        tensor = torch.randn(numel, generator=gen, dtype=torch.float32)
        mb = numel * 4 / MB
        measured = []
        for level in self.levels:
            codec = make_codec(level.spec)
            payload = codec.encode(tensor)
            codec.decode(payload)
            enc, dec = [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                payload = codec.encode(tensor)
                t1 = time.perf_counter()
                codec.decode(payload)
                t2 = time.perf_counter()
                enc.append(t1 - t0)
                dec.append(t2 - t1)
            measured.append(
                replace(
                    level,
                    ratio=payload.wire_size / (numel * 4),
                    encode_s_per_mb=statistics.median(enc) / mb,
                    decode_s_per_mb=statistics.median(dec) / mb,
                    calibrated=True,
                )
            )
        return Ladder(tuple(measured))

    def with_measurements(self, measured: Ladder) -> Ladder:
        """This ladder, taking ratio and costs from `measured` for every spec both contain.

        Lets a config name its own ladder while reusing a calibration file made for a larger one.
        """
        by_spec = {lv.spec: lv for lv in measured.levels}
        return Ladder(tuple(by_spec.get(lv.spec, lv) for lv in self.levels))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the ladder (a calibration) as JSON, atomically: temp file, fsync, rename."""
        target = Path(path)
        doc = {"format": _FILE_FORMAT, "version": _FILE_VERSION, "levels": [asdict(lv) for lv in self.levels]}
        fd, tmp = tempfile.mkstemp(prefix=target.name, suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(doc, fh, indent=2)
                fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Ladder:
        """Read a file written by `save`; every spec must still name a registered codec."""
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read ladder calibration {str(path)!r}: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("format") != _FILE_FORMAT or doc.get("version") != _FILE_VERSION:
            raise ConfigError(
                f"{str(path)!r} is not a version-{_FILE_VERSION} ladder calibration; rerun the calibration"
            )
        levels = doc.get("levels")
        if not isinstance(levels, list):
            raise ConfigError(f"{str(path)!r}: 'levels' must be a list")
        return cls(tuple(_level_from_record(rec, path) for rec in levels))


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _level_from_record(rec: Any, path: str | os.PathLike[str]) -> Level:
    if not isinstance(rec, dict) or not isinstance(rec.get("spec"), str):
        raise ConfigError(f"{str(path)!r}: malformed level record {rec!r}")
    level_for(rec["spec"])  # the codec must still exist in this build
    try:
        return Level(
            spec=rec["spec"],
            ratio=float(rec["ratio"]),
            encode_s_per_mb=float(rec["encode_s_per_mb"]),
            decode_s_per_mb=float(rec["decode_s_per_mb"]),
            lossless=bool(rec["lossless"]),
            calibrated=bool(rec.get("calibrated", False)),
            progress=float(rec["progress"]) if "progress" in rec else level_for(rec["spec"]).progress,
            return_decode_s_per_mb=_optional_float(rec.get("return_decode_s_per_mb")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{str(path)!r}: level record {rec!r} is missing or has a bad field: {exc}") from exc
