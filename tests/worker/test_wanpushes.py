"""`WanPushes`: the site's own shard waits for the pushes of the same step to the other sites."""

from __future__ import annotations

import asyncio

import pytest

from netsense.worker import wanpushes as order
from netsense.worker.wanpushes import WanPushes, shard_role


def test_roles_need_both_sites() -> None:
    assert shard_role("a", "a") == "local" and shard_role("a", "b") == "remote"
    assert shard_role("", "a") is None and shard_role("a", "") is None


def test_through_once_every_remote_shard_pushed_the_step() -> None:
    p = WanPushes()
    assert p.through(0)  # no remote shard: nothing to wait for
    p.remote(1)
    p.remote(2)
    assert not p.through(0)
    p.pushed(1, 0)
    assert not p.through(0)
    p.pushed(2, 3)  # a later step counts for the earlier ones
    assert p.through(0) and not p.through(1)
    p.pushed(1, 0)  # out of order: never goes back
    p.pushed(5, 9)  # not a remote shard: ignored
    p.pushed(1, 3)
    assert p.through(3) and not p.through(4)


def test_hold_ends_at_the_ack_or_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> tuple[float, float, float]:
        p = WanPushes()
        p.remote(1)
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, p.pushed, 1, 0)
        held = await p.hold(0)
        free = await p.hold(0)  # already through: no wait
        monkeypatch.setattr(order, "MAX_HOLD_S", 0.05)
        capped = await p.hold(1)  # never out: the cap ends it
        return held, free, capped

    held, free, capped = asyncio.run(run())
    assert 0.04 < held < 0.5 and free == 0.0 and 0.04 < capped < 0.5


def test_left_counts_a_steps_pushes_out_whatever_the_order_it_learns_them() -> None:
    p = WanPushes()
    p.remote(1)
    p.left(1, 0)  # one push out before the step's count is known
    assert not p.through(0)
    p.left(1, 0, total=2)
    assert not p.through(0)
    p.left(1, 0)
    assert p.through(0)
    p.left(1, 1, total=1)  # the count first, then its push
    p.left(1, 0)  # a late report of an older step: ignored
    assert not p.through(1)
    p.left(1, 1)
    p.left(4, 7, total=0)  # not a remote shard: ignored
    assert p.through(1) and not p.through(2)


def test_a_sent_future_counts_as_one_push_out() -> None:
    async def run() -> bool:
        p = WanPushes()
        p.remote(2)
        p.left(2, 5, total=1)
        future = p.sent(2, 5)
        future.set_result(None)
        await asyncio.sleep(0)  # done callbacks run on the loop
        return p.through(5)

    assert asyncio.run(run())

