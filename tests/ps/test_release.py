"""ps/release.py: a local pull waits while a peer at another site waits for, or is being sent, the
same version; nobody else waits, and no wait outlasts the cap."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from netsense.ps import release
from netsense.ps.release import WanFirst
from netsense.ps.server import PSServer, ServerSettings


@dataclass
class Conn:
    unsent: bool = False

    def replying(self) -> bool:
        return self.unsent


@dataclass
class Peer:
    site: str
    pulls: int | None = None  # the version of its one pull (None: none)
    conn: Conn = field(default_factory=Conn)

    @property
    def pulling(self) -> dict[int, int]:
        return {} if self.pulls is None else {self.pulls: 1}


async def test_a_local_pull_waits_until_the_far_peer_has_its_reply() -> None:
    wf = WanFirst("a")
    here, far = Peer("a", pulls=5), Peer("b", pulls=5)

    async def far_side() -> None:
        await asyncio.sleep(0.03)
        far.pulls, far.conn.unsent = None, True  # answered: the reply is being sent
        await asyncio.sleep(0.03)
        far.conn.unsent = False  # all of it has left

    task = asyncio.ensure_future(far_side())
    held = await wf.hold(here, [here, far], 5)
    await task
    assert held >= 0.055 and wf.holds == 1 and wf.held_s == held
    assert far.pulls is None and not far.conn.unsent  # it waited for both phases


@pytest.mark.parametrize(
    ("site", "here", "far"),
    [
        ("a", Peer("a", 5), Peer("b", 6)),  # the far peer waits for another version
        ("a", Peer("a", 5), Peer("", 5)),  # a peer that did not say its site is no far peer
        ("a", Peer("b", 5), Peer("a", 5)),  # a far peer itself never waits
        ("a", Peer("", 5), Peer("b", 5)),  # nor one that did not say
        (None, Peer("a", 5), Peer("b", 5)),  # a PS not told its site holds nobody
    ],
)
async def test_no_hold(site: str | None, here: Peer, far: Peer) -> None:
    wf = WanFirst(site)
    assert await wf.hold(here, [here, far], 5) == 0.0 and wf.holds == 0


async def test_off_and_async_mode_hold_nobody() -> None:
    here, far = Peer("a", 5), Peer("b", 5)
    assert await WanFirst("a", enabled=False).hold(here, [here, far], 5) == 0.0
    assert PSServer(ServerSettings(), secret=None, site="a").release.enabled
    assert not PSServer(ServerSettings(wan_first=False), secret=None, site="a").release.enabled
    assert not PSServer(ServerSettings(staleness=2), secret=None, site="a").release.enabled  # no barrier to keep in step
    assert not PSServer(ServerSettings(), secret=None).release.enabled


async def test_a_stalled_far_peer_holds_a_local_pull_no_longer_than_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(release, "MAX_HOLD_S", 0.05)
    here, far = Peer("a", 5), Peer("b", None, Conn(unsent=True))  # its reply never leaves
    held = await WanFirst("a").hold(here, [here, far], 5)
    assert 0.05 <= held < 1.0


async def test_peers_are_read_again_while_holding() -> None:
    """A far peer that leaves (its session is dropped) stops the hold: `peers` is a live view."""
    here, far = Peer("a", 5), Peer("b", 5)
    sessions = {"here": here, "far": far}

    async def drop() -> None:
        await asyncio.sleep(0.02)
        del sessions["far"]

    task = asyncio.ensure_future(drop())
    held = await WanFirst("a").hold(here, sessions.values(), 5)
    await task
    assert 0.015 <= held < 0.5
