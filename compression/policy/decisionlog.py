"""The decision log: one JSON line per step and direction, what a policy chose and what it cost.

Records come from `Decision.to_record` (docs/POLICIES.md lists the fields) plus ``direction``
(``"up"``: a worker's push, ``"down"``: the PS's update). Lines are written whole and flushed, so
a crashed run still leaves a readable log up to its last step. Plain file writes, no event loop:
both directions' policy loops write it from whatever thread runs them.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import IO, Any

from .decision import Decision
from .link import LinkState


class DecisionLog:
    """Appends decision records to a JSONL file (thread-safe; `close` is idempotent)."""

    def __init__(self, path: str | Path, *, direction: str, extra: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.direction = direction
        """``"up"`` or ``"down"``, written into every record."""
        self.extra = dict(extra or {})
        """Fields added to every record (e.g. the worker id)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] | None = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(
        self, decision: Decision, link: LinkState, *, bytes_sent: int | None, comm_s: float | None, **fields: Any
    ) -> dict[str, Any]:
        """Write one record; returns it."""
        rec = decision.to_record(link, bytes_sent=bytes_sent, comm_s=comm_s)
        rec["direction"] = self.direction
        rec.update(self.extra)
        rec.update(fields)
        line = json.dumps(rec, allow_nan=False) + "\n"
        with self._lock:
            if self._fh is not None:
                self._fh.write(line)
                self._fh.flush()
        return rec

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


def read_decision_log(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a decision log, in order."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
