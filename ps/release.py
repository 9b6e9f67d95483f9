"""WAN-first release: a PS answers the pulls of other sites before those of its own site.

With a shard and a worker at each of two sites, a worker that gets its own shard's update first
(over the LAN) and pushes its next step at once shares the WAN direction with its shard's update to
the far worker, which cannot push before that update is in: the two directions then take turns
instead of running together (docs/ARCHITECTURE.md, "WAN-first release"; measured in
docs/BENCHMARKS.md). So a local peer's pull waits while a peer at another site still waits for the
same version or has reply bytes unsent.

Only peers that said their site in HELLO, at a PS told its own (`netsense ps --site`), take part;
a hold never outlasts `MAX_HOLD_S`; async mode (no barrier) never holds (`PSServer`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

MAX_HOLD_S = 1.0
"""Longest a local pull waits: a far peer that stalls must not stall this site."""
POLL_S = 0.002
"""How often a held pull looks again (the PS's loop sends meanwhile)."""


class Peer(Protocol):
    """What the release reads of one session (read-only, so a session's Counter fits)."""

    @property
    def site(self) -> str:
        """The site its HELLO named ("" : not said)."""

    @property
    def pulling(self) -> Mapping[int, int]:
        """Its pulls waiting or being answered, by version (a missing version: none)."""

    @property
    def conn(self) -> Any:
        """Its connection; ``conn.replying()`` is True while a reply still has unsent bytes."""


class WanFirst:
    """Holds a local peer's pull while a peer at another site still waits for, or is being sent,
    the same version. `held_s` and `holds` count what it cost (metrics)."""

    def __init__(self, site: str | None, *, enabled: bool = True) -> None:
        self.site = site or None
        self.enabled = enabled and self.site is not None
        self.held_s = 0.0
        self.holds = 0

    def local(self, peer: Peer) -> bool:
        return self.enabled and peer.site == self.site

    def remote_busy(self, peers: Iterable[Peer], version: int) -> bool:
        """Some peer at another site waits for `version` or still has reply bytes unsent."""
        return any(
            p.site and p.site != self.site and (p.pulling.get(version, 0) > 0 or p.conn.replying()) for p in peers
        )

    async def hold(self, peer: Peer, peers: Iterable[Peer], version: int) -> float:
        """Wait (at most `MAX_HOLD_S`) before answering local `peer`'s pull of `version`; returns
        the seconds held. `peers` is re-read each time (a dict's values view does)."""
        if not self.local(peer) or not self.remote_busy(peers, version):
            return 0.0
        start = time.monotonic()
        while self.remote_busy(peers, version) and time.monotonic() - start < MAX_HOLD_S:
            await asyncio.sleep(POLL_S)
        held = time.monotonic() - start
        self.held_s += held
        self.holds += 1
        return held
