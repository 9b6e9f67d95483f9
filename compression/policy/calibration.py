"""Progress tables: the q of each ladder level, calibrated by level trials of the job's own model
(`netsense calibrate`; docs/POLICIES.md, "Calibrated q"), as a file the worker and the PS read.

The run-time estimators price a level from its compression error, and that error does not say what
the level costs in steps (docs/history/BENCHMARKS-2026.md, "Estimators against the steps they predict"); a trial
trains with the level and counts. The file holds one table per direction (``up``: the workers'
gradients, ``down``: the PS's updates) and what it was measured on, so a table made for another
model or optimizer is visible as such in the run's log.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from netsense.errors import ConfigError

log = logging.getLogger(__name__)

FORMAT = "netsense-progress-table/1"
"""The ``format`` field of a progress-table file."""
DIRECTIONS = ("up", "down")


def progress_table_json(tables: Mapping[str, Mapping[str, float]], about: Mapping[str, Any]) -> str:
    """The file's text: `tables` (direction -> level spec -> q) and `about` (what was measured)."""
    for direction in tables:
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    body = {"format": FORMAT, **dict(about), **{d: {s: round(float(q), 4) for s, q in t.items()} for d, t in tables.items()}}
    return json.dumps(body, indent=2) + "\n"


def parse_progress_table(data: Any, direction: str, *, source: str = "progress table") -> dict[str, float]:
    """The `direction` table of a parsed file, checked: a mapping of level spec to finite q >= 0
    (0: no progress in the trial, priced at the policy's floor). A file without that direction
    gives an empty table (nothing calibrated that way)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"{source}: not a progress table (want format {FORMAT!r}; `netsense calibrate` writes one)")
    table = data.get(direction, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: {direction!r} must be a table of level spec -> q, got {type(table).__name__}")
    out: dict[str, float] = {}
    for spec, q in table.items():
        if not (isinstance(q, (int, float)) and not isinstance(q, bool) and math.isfinite(q) and q >= 0):
            raise ConfigError(f"{source}: {direction}.{spec} must be a finite q >= 0, got {q!r}")
        out[str(spec)] = float(q)
    return out


def read_progress_table(path: str | Path, direction: str) -> dict[str, float]:
    """`parse_progress_table` of the file at `path`; an unreadable or malformed file is a
    `ConfigError` naming it."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"progress table {str(path)!r}: cannot read it: {exc}") from None
    table = parse_progress_table(data, direction, source=f"progress table {str(path)!r}")
    about = {k: data.get(k) for k in ("model", "optimizer", "lr", "workers", "batch_size", "trial_steps")}
    log.info("progress table %s, %s: %s (made for %s)", path, direction, table, about)
    return table


def progress_settings(path: str | Path | None, direction: str, policy: str | None) -> dict[str, Any] | None:
    """The settings of `policy` that carry the `direction` table of the file at `path`: what a
    worker's, a relay's and a PS's policy are built with. None without a file, or for a policy
    other than ``netsense`` (the only one that reads a table; the file is not read then)."""
    if path is None or policy != "netsense":
        return None
    return {"progress_table": read_progress_table(path, direction)}
