"""How long each update took to reach every worker, for the workers' policies (sans I/O).

A synchronous step ends for everyone when the last copy of its update arrives: the PS writes one
copy per worker at once, and where the workers share a bottleneck each copy waits for the others.
A worker's own copy says only where it stood in that queue (the first copy of four arrived in a
quarter of the time of the last), so the PS reports, in each PUSH's ACK, the latest update whose
every copy was delivered: one copy's bytes and the seconds from the first write to the last
delivery (docs/POLICIES.md, "The update's return").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UpdateReturn:
    """One update's return, complete."""

    version: int
    nbytes: int
    """The largest copy's wire bytes."""
    seconds: float
    """First copy written to the last copy's delivery."""


@dataclass
class _Copies:
    first_at: float
    nbytes: int = 0
    written: int = 0
    delivered: int = 0
    last_at: float = 0.0
    closed: bool = False


class UpdateReturns:
    """Copies written and delivered per version; `latest` is the newest complete one."""

    def __init__(self) -> None:
        self._open: dict[int, _Copies] = {}
        self.latest: UpdateReturn | None = None
        """The newest version whose copies were all delivered after it was closed (None: none yet)."""

    def written(self, version: int, nbytes: int, at: float) -> None:
        """A copy of `version`'s update of `nbytes` is written at `at`."""
        copies = self._open.get(version)
        if copies is None:
            copies = self._open[version] = _Copies(first_at=at)
        copies.first_at = min(copies.first_at, at)
        copies.nbytes = max(copies.nbytes, nbytes)
        copies.written += 1

    def delivered(self, version: int, at: float) -> None:
        """A copy of `version` was acked whole at `at` (on the clock `written` used)."""
        copies = self._open.get(version)
        if copies is None:
            return
        copies.delivered += 1
        copies.last_at = max(copies.last_at, at)
        self._complete(version)

    def close(self, version: int) -> None:
        """No more copies of `version` will be written (the next update was applied: every worker
        pushed after it took its copy). Versions older than it that never completed are dropped."""
        for old in [v for v in self._open if v < version]:
            del self._open[old]
        copies = self._open.get(version)
        if copies is not None:
            copies.closed = True
            self._complete(version)

    def _complete(self, version: int) -> None:
        copies = self._open[version]
        if not copies.closed or copies.delivered < copies.written:
            return
        del self._open[version]
        if self.latest is None or version > self.latest.version:
            self.latest = UpdateReturn(version, copies.nbytes, max(0.0, copies.last_at - copies.first_at))
