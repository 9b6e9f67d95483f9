"""Running the event loop: uvloop where available (faster per packet), asyncio otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop if uvloop is installed, else the default asyncio loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on the fastest available loop."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
