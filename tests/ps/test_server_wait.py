"""The PS's PULL waits leave its condition lock consistent when cancelled, timed out or destroyed
with the loop (a PS restart), and `ServerSettings` refuses a barrier timeout that would spin."""

from __future__ import annotations

import asyncio
import gc
import math
import sys

import pytest
import torch

from netsense.compression import make_codec
from netsense.errors import ConfigError
from netsense.ps.server import PSServer, ServerSettings
from netsense.transport.wire import Push

FP32 = make_codec("fp32")


def _server(pull_timeout_s: float = 5.0) -> PSServer:
    return PSServer(ServerSettings(port=0, pull_timeout_s=pull_timeout_s), secret=b"x" * 32)


async def test_timed_out_and_cancelled_waits_release_the_lock_and_others_still_wake() -> None:
    server = _server(pull_timeout_s=0.05)
    with pytest.raises(TimeoutError):
        await server.wait_version(3)
    assert not server._changed.locked()

    server = _server()
    cancelled = [asyncio.create_task(server.wait_version(3)) for _ in range(3)]
    survivor = asyncio.create_task(server.wait_version(1))
    await asyncio.sleep(0.01)
    for t in cancelled:
        t.cancel()
    await server.wake()  # a notify racing the cancellations
    await asyncio.gather(*cancelled, return_exceptions=True)
    assert all(t.cancelled() for t in cancelled) and not server._changed.locked()
    server.store.initialize({"w": FP32.encode(torch.ones(2))}, {"name": "sgd", "lr": 0.1})
    server.store.join("a")
    server.store.push("a", Push(0, 1, 1, {"w": FP32.encode(torch.ones(2))}))
    await server.wake()
    await asyncio.wait_for(survivor, 2)  # the other waiter wakes: nothing was left holding the lock
    assert not server._changed.locked()


def test_waits_destroyed_with_their_loop_leave_no_lock_error() -> None:
    """A PS restart: the loop closes with PULLs still waiting; their coroutines are closed
    (GeneratorExit) when the tasks are collected. Before: `RuntimeError: Lock is not acquired`."""
    errors: list[BaseException | None] = []
    old_hook = sys.unraisablehook
    sys.unraisablehook = lambda u: errors.append(u.exc_value)
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _loop, _ctx: None)  # "Task was destroyed but it is pending!"
    try:
        server = loop.run_until_complete(_make(loop))
        tasks = [loop.create_task(server.wait_version(5)) for _ in range(4)]
        loop.run_until_complete(asyncio.sleep(0.01))
        loop.close()
        for t in tasks:  # what collecting the pending tasks does to their coroutines
            t.get_coro().close()
        gc.collect()
    finally:
        sys.unraisablehook = old_hook
    assert not [e for e in errors if isinstance(e, RuntimeError)], errors
    assert not server._changed.locked()


async def _make(loop: asyncio.AbstractEventLoop) -> PSServer:
    return _server()


@pytest.mark.parametrize("value", [0, -1, 0.05, math.nan, math.inf, 1e7])
def test_barrier_timeout_out_of_range_is_a_config_error(value: float) -> None:
    with pytest.raises(ConfigError) as err:
        ServerSettings(barrier_timeout_s=value)
    assert "barrier_timeout_s" in str(err.value) and "[0.1, 1e+06]" in str(err.value)


def test_barrier_timeout_in_range_is_accepted() -> None:
    for value in (0.1, 1, 30.0, 1e6):
        assert ServerSettings(barrier_timeout_s=value).barrier_timeout_s == value


async def test_clean_stop_checkpoints_the_version_a_running_write_made_it_skip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A step landing while the previous write runs is skipped; before, a stop then left it out."""
    import threading

    from netsense.ps import checkpoint

    server = PSServer(ServerSettings(port=0, checkpoint_dir=str(tmp_path), checkpoint_every_steps=1), secret=b"x" * 32)
    server.store.initialize({"w": FP32.encode(torch.ones(2))}, {"name": "sgd", "lr": 0.1})
    server.store.join("a")
    gate = threading.Event()
    write = server._write_checkpoint
    server._write_checkpoint = lambda state: (gate.wait(10), write(state))  # type: ignore[method-assign, func-returns-value]
    for step in range(2):  # version 1's write is held; version 2 lands while it runs
        await server.applied(server.store.push("a", Push(step, 1, 1, {"w": FP32.encode(torch.ones(2))})))
    assert server.store.version == 2
    gate.set()
    await server.flush_checkpoint(final=False)
    assert checkpoint.load_latest(tmp_path)[0]["version"] == 1  # what a crash now would keep
    await server.flush_checkpoint()
    assert checkpoint.load_latest(tmp_path)[0]["version"] == 2 and server.checkpoints_written == 2
