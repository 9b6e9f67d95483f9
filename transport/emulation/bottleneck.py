"""One direction of an emulated link, sans I/O: random loss, drop-tail queue, rate, then delay.

`Bottleneck` takes arrivals with a timestamp and says what to hand on, and when; time is an
argument, so it is tested without sockets. `emulator.LinkEmulator` is the asyncio shell that feeds
it datagrams, one `Bottleneck` per direction shared by every client (docs/EMULATOR.md).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Any

from .linkspec import LinkSpec

TICK_S = 0.001
"""Timer granularity: a tick releases what is due within this, and no timer is armed closer."""

LATE_S = 0.002
"""A release this much after its due time counts as late: past the loop's ordinary timer jitter
(up to a ms), so the process was starved of CPU and released a backlog at once, faster than the
link's rate. Measurements downstream (delivery-rate estimates) then read the CPU, not the link."""


@dataclass(frozen=True)
class DirectionStats:
    """Counters of one direction since start; sizes are UDP payload bytes."""

    packets_in: int
    """Datagrams that arrived at the bottleneck."""
    bytes_in: int
    packets_forwarded: int
    """Datagrams handed to the outgoing socket."""
    bytes_forwarded: int
    dropped_queue: int
    """Drop-tail drops: the queue was full on arrival."""
    dropped_loss: int
    """Random-loss drops."""
    dropped_send: int
    """Datagrams the outgoing socket refused (buffer full, peer gone)."""
    queue_bytes: int
    """Bytes waiting at the bottleneck now."""
    queue_delay_s: float
    """How long a packet arriving now would wait before its last bit leaves the bottleneck."""
    max_queue_delay_s: float
    """The longest such wait any accepted packet had."""
    released_late: int = 0
    """Datagrams handed on more than `LATE_S` after they were due (the shell was starved of CPU)."""
    max_release_late_s: float = 0.0
    """The latest any datagram was handed on, past its due time."""

    @property
    def late_fraction(self) -> float:
        """Share of forwarded datagrams released late: above a few %, the CPU shaped the traffic."""
        return self.released_late / self.packets_forwarded if self.packets_forwarded else 0.0

    @property
    def dropped(self) -> int:
        """All drops, whatever the cause."""
        return self.dropped_queue + self.dropped_loss + self.dropped_send


class _Packet:
    __slots__ = ("arrival", "departure", "deliver_at", "size", "payload")

    def __init__(self, arrival: float, size: int, payload: Any) -> None:
        self.arrival = arrival
        self.departure = arrival
        self.deliver_at = arrival
        self.size = size
        self.payload = payload


class Bottleneck:
    """One direction of the link, sans I/O: random loss, drop-tail queue, rate, then delay.

    The rate is served as a token bucket whose fill is the trace's capacity curve C(t): the queue
    head leaves once the capacity consumed so far reaches its last byte. Capacity unused while the
    queue is empty is lost beyond ``burst_bytes`` (0 by default: a serialising link, like a real one).
    """

    def __init__(self, spec: LinkSpec, *, now: float, rng: random.Random) -> None:
        self._rng = rng
        self._queue: deque[_Packet] = deque()  # not yet left the bottleneck
        self._line: deque[_Packet] = deque()  # left it, in propagation
        self._queued_bytes = 0
        self._last_deliver = 0.0
        self._counts = dict.fromkeys(
            ("packets_in", "bytes_in", "packets_forwarded", "bytes_forwarded",
             "dropped_queue", "dropped_loss", "dropped_send", "released_late"),
            0,
        )
        self._max_queue_delay = 0.0
        self._max_release_late = 0.0
        self.set_spec(spec, now)

    @property
    def spec(self) -> LinkSpec:
        """The spec in force."""
        return self._spec

    def set_spec(self, spec: LinkSpec, now: float) -> None:
        """Switch to ``spec`` at ``now``; a trace restarts at its time 0, queued packets are re-served."""
        self._spec = spec
        self._origin = now
        self._served = 0.0  # capacity consumed, in bytes of C(t - origin)
        self._limit = spec.queue_limit_bytes
        waiting, self._queue, self._queued_bytes = self._queue, deque(), 0
        self._last_deliver = self._line[-1].deliver_at if self._line else 0.0
        for packet in waiting:
            self._serve(packet, now)

    def offer(self, now: float, size: int, payload: Any) -> bool:
        """A datagram arrives; False when it was dropped (random loss or a full queue)."""
        self._advance(now)
        self._counts["packets_in"] += 1
        self._counts["bytes_in"] += size
        if self._spec.loss and self._rng.random() < self._spec.loss:
            self._counts["dropped_loss"] += 1
            return False
        if self._limit is not None and self._queued_bytes + size > self._limit:
            self._counts["dropped_queue"] += 1
            return False
        packet = _Packet(now, size, payload)
        self._serve(packet, now)
        self._max_queue_delay = max(self._max_queue_delay, packet.departure - now)
        return True

    def _serve(self, packet: _Packet, now: float) -> None:
        spec = self._spec
        if spec.rate is None:
            packet.departure = now
        else:
            idle_credit = spec.rate.capacity(now - self._origin) - spec.burst_bytes
            self._served = max(self._served, idle_credit) + packet.size
            packet.departure = max(self._origin + spec.rate.time_for(self._served), now)
        # FIFO even when a smaller delay was just set: a link does not reorder.
        packet.deliver_at = max(packet.departure + spec.delay_s, self._last_deliver)
        self._last_deliver = packet.deliver_at
        self._queue.append(packet)
        self._queued_bytes += packet.size

    def _advance(self, now: float) -> None:
        while self._queue and self._queue[0].departure <= now:
            packet = self._queue.popleft()
            self._queued_bytes -= packet.size
            self._line.append(packet)

    def pop_due(self, now: float, horizon: float = TICK_S) -> list[Any]:
        """Payloads to deliver now: everything due by ``now + horizon``, in order."""
        edge = now + horizon
        self._advance(edge)
        out = []
        while self._line and self._line[0].deliver_at <= edge:
            packet = self._line.popleft()
            late = now - packet.deliver_at
            if late > LATE_S:
                self._counts["released_late"] += 1
                self._max_release_late = max(self._max_release_late, late)
            self._counts["packets_forwarded"] += 1
            self._counts["bytes_forwarded"] += packet.size
            out.append(packet.payload)
        return out

    def next_due(self) -> float | None:
        """When the next delivery is due; None when nothing will ever be (empty, or a final blackout)."""
        head = self._line[0] if self._line else self._queue[0] if self._queue else None
        if head is None or head.deliver_at == float("inf"):
            return None
        return head.deliver_at

    def note_send_error(self) -> None:
        """The shell could not send a released datagram."""
        self._counts["dropped_send"] += 1
        self._counts["packets_forwarded"] -= 1

    def stats(self, now: float) -> DirectionStats:
        """A snapshot of the counters and the queue at ``now``."""
        self._advance(now)
        waiting = max(self._queue[-1].departure - now, 0.0) if self._queue else 0.0
        return DirectionStats(
            **self._counts,
            queue_bytes=self._queued_bytes,
            queue_delay_s=waiting,
            max_queue_delay_s=self._max_queue_delay,
            max_release_late_s=self._max_release_late,
        )
