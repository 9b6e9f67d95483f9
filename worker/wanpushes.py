"""WAN pushes first: a relay or worker pushes its own site's shard only once its pushes of the same
step to the shards at other sites have left (their last bytes sent).

With a shard and a relay (or worker) at each of two sites, shard X's update to site Y crosses the
WAN in the X -> Y direction, where site X's push to shard Y runs too. Shard X can send that update
once it holds both sites' pushes: site Y's across the WAN and site X's own over the LAN, which
arrives first. So when site Y's push is through before site X's, shard X's update shares X -> Y
with the rest of site X's push, which then ends late, and shard Y's update to site X, which waits
for that push, starts late: each step, one direction idles while the other carries both. Holding
the site's own push until its WAN pushes have left keeps each direction to its push, then its
update (docs/ARCHITECTURE.md, "WAN pushes first"; measured in docs/BENCHMARKS.md). Left, not acked:
the near shard's update then queues behind the push's last bytes at the bottleneck, and waiting
for the acks would cost a round trip a step.

A shard counts as local or remote by the site its PS said in WELCOME against the pusher's own
(``--site``); shards that said none are neither held nor waited for. A hold never outlasts
`MAX_HOLD_S`. Pure bookkeeping, polled from the pusher's loop as `netsense.ps.release` polls.
"""

from __future__ import annotations

import asyncio
import time

MAX_HOLD_S = 1.0
"""Longest the site's own push waits: a WAN push that stalls must not stall the site's shard."""
POLL_S = 0.002
"""How often a held push looks again."""


def shard_role(relay_site: str, ps_site: str) -> str | None:
    """``local`` (the PS is at the relay's site), ``remote`` (at another), or None (either unsaid)."""
    if not relay_site or not ps_site:
        return None
    return "local" if ps_site == relay_site else "remote"


class WanPushes:
    """The last step whose pushes to each remote shard have left; what the local shards wait on."""

    def __init__(self) -> None:
        self._out: dict[int, int] = {}
        self._leaving: dict[int, list[int]] = {}  # per remote shard: [step, pushes out whole, pushes of the step (-1: unknown)]
        self.held_s = 0.0
        """Seconds the local pushes waited in all (logged when the worker or relay closes)."""

    def remote(self, shard: int) -> None:
        """Shard `shard` is at another site: local pushes wait for its pushes from now on."""
        self._out.setdefault(shard, -1)

    def pushed(self, shard: int, step: int) -> None:
        """Shard `shard`'s pushes of `step` have left, or will not (they failed, or the site resynced)."""
        if shard in self._out:
            self._out[shard] = max(self._out[shard], step)

    def left(self, shard: int, step: int, *, total: int | None = None) -> None:
        """One push of `step` to `shard` has left whole (`total` None), or the step's push count is
        now known (`total`); once all have left, `pushed`. Left, not acked: see the module. A late
        report of an older step is ignored; a report for a shard that is not remote too."""
        if shard not in self._out:
            return
        seen = self._leaving.get(shard)
        if seen is not None and step < seen[0]:
            return
        if seen is None or seen[0] != step:
            seen = self._leaving[shard] = [step, 0, -1]
        if total is None:
            seen[1] += 1
        else:
            seen[2] = total
        if seen[2] >= 0 and seen[1] >= seen[2]:
            self.pushed(shard, step)

    def sent(self, shard: int, step: int) -> asyncio.Future[None]:
        """A future to hand a push of `step` to `shard` as its `sent`: set when the push's last byte
        has left, it counts as one push `left`."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.add_done_callback(lambda _: self.left(shard, step))
        return future

    def through(self, step: int) -> bool:
        """Every remote shard's pushes of `step` (or a later one) have left."""
        return all(done >= step for done in self._out.values())

    async def hold(self, step: int) -> float:
        """Wait, at most `MAX_HOLD_S`, until `through(step)`; returns the seconds waited."""
        if self.through(step):
            return 0.0
        start = time.monotonic()
        while not self.through(step) and time.monotonic() - start < MAX_HOLD_S:
            await asyncio.sleep(POLL_S)
        held = time.monotonic() - start
        self.held_s += held
        return held
