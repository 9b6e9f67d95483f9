"""A userspace UDP link emulator (docs/EMULATOR.md): rate, drop-tail queue, delay and loss per direction.

`LinkEmulator` is the asyncio shell around `bottleneck.Bottleneck`, the sans-I/O core of one
direction: a UDP relay between any number of clients and one upstream server, one upstream socket
per client (so the server sees distinct peers), and one `Bottleneck` per direction shared by every
client (a site's uplink is one queue, not one per flow).

Timing (measured, docs/EMULATOR.md): timestamps come from ``time.monotonic()`` (uvloop's loop clock
moves in 1 ms steps), each timer tick releases everything due within the next millisecond, and no
timer is ever armed less than a millisecond ahead (sub-millisecond re-arming spins the CPU).
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from netsense.errors import ConfigError

from .bottleneck import TICK_S, Bottleneck, DirectionStats
from .linkspec import DuplexSpec, LinkSpec, as_duplex

log = logging.getLogger(__name__)

SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
"""SO_RCVBUF/SO_SNDBUF: every loss seen on loopback was a receive-buffer overflow (docs/EMULATOR.md)."""
MAX_DATAGRAM = 65535
READ_BATCH = 256
"""Datagrams read per readiness callback, so one busy socket cannot starve the timer."""
MAX_CLIENTS = 1024
"""Upstream sockets held at most (one per client address); beyond that new clients are dropped."""


@dataclass(frozen=True)
class EmulatorStats:
    """A snapshot of both directions."""

    up: DirectionStats
    """Client -> upstream server."""
    down: DirectionStats
    """Upstream server -> client."""
    clients: int
    """Client addresses with an open upstream socket."""
    uptime_s: float


class _Session:
    """One client address and the upstream socket that speaks for it."""

    __slots__ = ("addr", "sock", "last_seen")

    def __init__(self, addr: Any, sock: socket.socket, now: float) -> None:
        self.addr = addr
        self.sock = sock
        self.last_seen = now


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _udp_socket(family: socket.AddressFamily, buffer_bytes: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.setblocking(False)
    for force, plain in ((getattr(socket, "SO_RCVBUFFORCE", None), socket.SO_RCVBUF),
                         (getattr(socket, "SO_SNDBUFFORCE", None), socket.SO_SNDBUF)):
        try:  # the FORCE variant passes rmem_max/wmem_max when we are root
            sock.setsockopt(socket.SOL_SOCKET, force if force is not None else plain, buffer_bytes)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, plain, buffer_bytes)
    return sock


class LinkEmulator:
    """A UDP relay from ``listen`` to ``upstream`` through an emulated link (see module docstring).

    Use ``async with LinkEmulator(upstream=(host, port), spec="rate=20mbit,delay=10ms") as emu:``
    and point clients at ``emu.address``.
    """

    def __init__(
        self,
        upstream: tuple[str, int],
        spec: DuplexSpec | LinkSpec | str = "",
        listen: tuple[str, int] = ("127.0.0.1", 0),
        *,
        idle_timeout_s: float = 60.0,
        socket_buffer_bytes: int = SOCKET_BUFFER_BYTES,
    ) -> None:
        self._upstream_arg = upstream
        self._spec = as_duplex(spec)
        self._listen_arg = listen
        self._idle_timeout_s = idle_timeout_s
        self._buffer_bytes = socket_buffer_bytes
        self._sock: socket.socket | None = None
        self._sessions: dict[Any, _Session] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = float("inf")
        self._sweeper: asyncio.TimerHandle | None = None
        self._started_at = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def address(self) -> tuple[str, int]:
        """Where clients send: the bound listen address."""
        if self._sock is None:
            raise RuntimeError("LinkEmulator.address is known only after start()")
        host, port = self._sock.getsockname()[:2]
        return host, port

    @property
    def spec(self) -> DuplexSpec:
        """The spec in force."""
        return self._spec

    async def start(self) -> None:
        """Bind the listen socket and start relaying."""
        loop = asyncio.get_running_loop()
        host, port = self._upstream_arg
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        except socket.gaierror as exc:
            raise ConfigError(f"emulator upstream {host}:{port}: cannot resolve ({exc})") from exc
        self._upstream_family, self._upstream = infos[0][0], infos[0][4]
        sock = _udp_socket(_family(self._listen_arg[0]), self._buffer_bytes)
        try:
            sock.bind(self._listen_arg)
        except OSError as exc:
            sock.close()
            raise ConfigError(f"emulator listen {self._listen_arg[0]}:{self._listen_arg[1]}: {exc.strerror}") from exc
        now = time.monotonic()
        self._loop, self._sock, self._started_at = loop, sock, now
        self._up = Bottleneck(self._spec.up, now=now, rng=random.Random(2 * self._spec.seed))
        self._down = Bottleneck(self._spec.down, now=now, rng=random.Random(2 * self._spec.seed + 1))
        loop.add_reader(sock.fileno(), self._on_client_readable)
        self._sweeper = loop.call_later(self._idle_timeout_s / 4, self._sweep)
        log.info("link emulator on %s -> %s, %s", self.address, self._upstream, self._spec.describe())

    async def close(self) -> None:
        """Stop relaying and close every socket; packets still in the link are discarded."""
        if self._sock is None or self._loop is None:
            return
        for handle in (self._timer, self._sweeper):
            if handle is not None:
                handle.cancel()
        for session in list(self._sessions.values()):
            self._close_session(session)
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        self._sock = None
        log.info("link emulator closed: %s", self._stats_unchecked())

    async def __aenter__(self) -> LinkEmulator:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def set_spec(self, spec: DuplexSpec | LinkSpec | str) -> None:
        """Change the link now (traces restart at their time 0); the loss seed is kept."""
        self._spec = as_duplex(spec)
        if self._sock is None:
            return
        now = time.monotonic()
        self._up.set_spec(self._spec.up, now)
        self._down.set_spec(self._spec.down, now)
        self._cancel_timer()
        self._service()
        log.info("link emulator spec now %s", self._spec.describe())

    def stats(self) -> EmulatorStats:
        """Counters of both directions now."""
        if self._sock is None:
            raise RuntimeError("LinkEmulator.stats() needs a started emulator")
        return self._stats_unchecked()

    def _stats_unchecked(self) -> EmulatorStats:
        now = time.monotonic()
        return EmulatorStats(self._up.stats(now), self._down.stats(now), len(self._sessions), now - self._started_at)

    # -- I/O -----------------------------------------------------------------------------------

    def _open_session(self, addr: Any, now: float) -> _Session | None:
        if len(self._sessions) >= MAX_CLIENTS:
            return None
        sock = _udp_socket(self._upstream_family, self._buffer_bytes)
        sock.connect(self._upstream)  # connected: the kernel filters out anyone but the server
        session = _Session(addr, sock, now)
        self._sessions[addr] = session
        assert self._loop is not None
        self._loop.add_reader(sock.fileno(), self._on_upstream_readable, session)
        log.debug("new client %s via %s", addr, sock.getsockname())
        return session

    def _close_session(self, session: _Session) -> None:
        assert self._loop is not None
        self._sessions.pop(session.addr, None)
        self._loop.remove_reader(session.sock.fileno())
        session.sock.close()

    def _on_client_readable(self) -> None:
        assert self._sock is not None
        now = time.monotonic()
        for _ in range(READ_BATCH):
            try:
                data, addr = self._sock.recvfrom(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                log.debug("listen socket: %s", exc)
                break
            session = self._sessions.get(addr) or self._open_session(addr, now)
            if session is None:
                continue
            session.last_seen = now
            self._up.offer(now, len(data), (session.sock, None, data))
        self._service()

    def _on_upstream_readable(self, session: _Session) -> None:
        assert self._sock is not None
        now = time.monotonic()
        for _ in range(READ_BATCH):
            try:
                data = session.sock.recv(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:  # e.g. ECONNREFUSED from an ICMP error: the server is not there
                log.debug("upstream socket for %s: %s", session.addr, exc)
                break
            session.last_seen = now
            self._down.offer(now, len(data), (self._sock, session.addr, data))
        self._service()

    def _service(self) -> None:
        """Send what is due, then arm the timer for the next delivery."""
        now = time.monotonic()
        for direction in (self._up, self._down):
            for sock, addr, data in direction.pop_due(now):
                try:
                    if addr is None:
                        sock.send(data)
                    else:
                        sock.sendto(data, addr)
                except OSError:
                    direction.note_send_error()
        dues = [d for d in (self._up.next_due(), self._down.next_due()) if d is not None]
        if not dues:
            return
        due = min(dues)
        if self._timer is not None and self._timer_due <= due:
            return
        self._cancel_timer()
        assert self._loop is not None
        # pop_due released everything within TICK_S, so this is never a sub-millisecond timer. Not
        # aimed early: asyncio fires up to a ms late (epoll rounds up) but uvloop up to a ms early
        # (its clock is floored to the ms); on time, both measured +0.3-0.4 ms per direction.
        self._timer = self._loop.call_later(max(due - now, TICK_S), self._on_timer)
        self._timer_due = due

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_due = None, float("inf")

    def _on_timer(self) -> None:
        self._timer, self._timer_due = None, float("inf")
        self._service()

    def _sweep(self) -> None:
        """Close upstream sockets of clients silent for ``idle_timeout_s``."""
        assert self._loop is not None
        cutoff = time.monotonic() - self._idle_timeout_s
        for session in [s for s in self._sessions.values() if s.last_seen < cutoff]:
            log.debug("client %s idle, closing its upstream socket", session.addr)
            self._close_session(session)
        self._sweeper = self._loop.call_later(self._idle_timeout_s / 4, self._sweep)
