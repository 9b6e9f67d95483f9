"""A transmit's datagrams leave in one `sendmsg` per run of equal sizes: UDP segmentation offload
(docs/ARCHITECTURE.md, "UDP segmentation offload").

aioquic's protocol sends each datagram of a `transmit` with its own `sendto`: a syscall and a trip
down the UDP stack per packet, ~2.5 us of the sender's ~30 us of CPU a 1452-byte datagram here.
With `UDP_SEGMENT` (Linux >= 4.18) the kernel takes a run of datagrams to one address, all of one
size but the last, as one buffer and cuts it into those datagrams after the stack (in the device or
in software): the receiver sees exactly the datagrams it would have. A transmit's datagrams are such
runs: full-size packets of a stream, paced in bursts of up to 16 (aioquic's pacer), then a short
one. Where the kernel or the device refuses (EIO without checksum offload, an old kernel), the
transport falls back to one `sendto` a datagram for good.

Only the protocol's own `transmit` batches (`SegmentingTransport.batch`); everything else passes
through to the wrapped transport, which keeps its buffering, errors and close.
"""

from __future__ import annotations

import errno
import logging
import socket
import struct
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

UDP_SEGMENT = getattr(socket, "UDP_SEGMENT", 103)
"""The socket option (linux/udp.h): a send's segment size."""
MAX_SEGMENTS = 64
"""Datagrams a send may carry (UDP_MAX_SEGMENTS: 64 on older kernels, 128 on newer; 64 suits both)."""
MAX_BYTES = 65000
"""Bytes a send may carry: one IP packet's worth (65535 less headers), rounded down."""
UNSUPPORTED = frozenset({errno.EIO, errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP})
"""What a send answers when this socket, kernel or device cannot segment: give GSO up."""

Datagram = tuple[bytes, Any]


def segment_runs(
    datagrams: Sequence[Datagram], max_segments: int = MAX_SEGMENTS, max_bytes: int = MAX_BYTES
) -> list[tuple[Any, int, list[bytes]]]:
    """Split `datagrams` (in order) into (address, segment size, datagrams) runs one GSO send can
    carry: one address, every datagram of the first one's size except the last, which may be
    shorter; at most `max_segments` datagrams and `max_bytes` bytes."""
    runs: list[tuple[Any, int, list[bytes]]] = []
    run: list[bytes] = []
    addr: Any = None
    size = total = 0
    for data, to in datagrams:
        n = len(data)
        fits = (
            run
            and to == addr
            and len(run[-1]) == size  # the run's last datagram is full size: it may go on
            and n <= size
            and len(run) < max_segments
            and total + n <= max_bytes
        )
        if fits:
            run.append(data)
            total += n
            continue
        if run:
            runs.append((addr, size, run))
        run, addr, size, total = [data], to, n, n
    if run:
        runs.append((addr, size, run))
    return runs


def supported() -> bool:
    """Whether this platform has UDP GSO at all (Linux; the kernel may still refuse a send)."""
    return sys.platform.startswith("linux")


class SegmentingTransport:
    """A datagram transport whose sends inside `batch()` leave as GSO runs (see the module)."""

    def __init__(self, transport: Any, *, enabled: bool = True) -> None:
        self._inner = transport
        sock = transport.get_extra_info("socket")
        self._family = getattr(sock, "family", None)
        self._fd = sock.fileno() if sock is not None else -1
        self.enabled = enabled and supported() and self._fd >= 0
        """False once a send was refused as unsupported (or when off from the start)."""
        self._queue: list[Datagram] | None = None
        self.segmented_sends = 0
        """GSO sends made (each carried two datagrams or more)."""
        self.segmented_datagrams = 0
        """Datagrams those sends carried."""

    def sendto(self, data: bytes, addr: Any = None) -> None:
        if self._queue is None:
            self._inner.sendto(data, addr)
        else:
            self._queue.append((data, addr))

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Collect the sends made inside; send them as runs on leaving (also on an exception:
        aioquic counted them as sent)."""
        if self._queue is not None or not self.enabled:  # nested, or nothing to gain
            yield
            return
        self._queue = []
        try:
            yield
        finally:
            queued, self._queue = self._queue, None
            self._send(queued)

    def _send(self, queued: list[Datagram]) -> None:
        plain = self._inner.sendto
        if len(queued) < 2:
            for data, addr in queued:
                plain(data, addr)
            return
        for addr, size, run in segment_runs(queued):
            if len(run) > 1 and self._can_segment() and self._segment(run, size, addr):
                continue
            for data in run:
                plain(data, addr)

    def _can_segment(self) -> bool:
        # Datagrams the transport still buffers go first: a direct send would overtake them.
        return self.enabled and not self._inner.is_closing() and not self._inner.get_write_buffer_size()

    def _segment(self, run: list[bytes], size: int, addr: Any) -> bool:
        """One GSO send of `run`; False when it did not leave (the caller sends it datagram by
        datagram through the transport, which buffers or reports the error its own way)."""
        # A socket object on the transport's descriptor for this call only: detached, never
        # closed, so it can never close the transport's socket (or a later one on its number).
        sock = socket.socket(self._family or socket.AF_INET, socket.SOCK_DGRAM, 0, self._fd)
        args: tuple[Any, ...] = (0,) if addr is None else (0, addr)  # a connected socket takes no address
        try:
            sock.sendmsg([b"".join(run)], [(socket.IPPROTO_UDP, UDP_SEGMENT, struct.pack("=H", size))], *args)
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno in UNSUPPORTED:
                self.enabled = False
                log.info("UDP segmentation offload refused (%s): one send a datagram from now on", exc)
            return False
        finally:
            sock.detach()
        self.segmented_sends += 1
        self.segmented_datagrams += len(run)
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
