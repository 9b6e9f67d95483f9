"""A private event loop on a background thread, so QUIC keeps acking while the model computes.

Training code is synchronous (PyTorch); running the loop on its own thread means acks, timers
and retransmissions are served during forward/backward instead of stalling until the next await.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from netsense.transport.loop import new_event_loop

T = TypeVar("T")


class NetThread:
    """Owns an event loop running on a daemon thread; `run(coro)` executes a coroutine there."""

    def __init__(self, name: str = "netsense-net") -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Any:
        """Schedule `coro` on the loop; returns a concurrent future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result."""
        return self.submit(coro).result(timeout)

    def close(self) -> None:
        """Stop the loop and join the thread (idempotent)."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()
