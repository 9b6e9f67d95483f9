"""A transmit's datagrams leave as GSO runs and arrive as the datagrams they were; a refusal falls
back to one send a datagram; the setting reaches both ends of a connection."""

from __future__ import annotations

import asyncio
import errno
import socket
from typing import Any

import pytest

from netsense.transport import gso
from netsense.transport.channel import open_connection
from netsense.transport.gso import MAX_SEGMENTS, SegmentingTransport, segment_runs
from netsense.transport.listener import start_server
from netsense.transport.tls import TransportSettings, client_configuration, make_dev_certs, server_configuration
from netsense.transport.wire import Ack, Message, Probe

A, B = ("127.0.0.1", 1), ("127.0.0.1", 2)


def _sizes(runs: list[tuple[Any, int, list[bytes]]]) -> list[tuple[Any, int, list[int]]]:
    return [(addr, size, [len(d) for d in run]) for addr, size, run in runs]


def test_runs_hold_one_address_and_one_size_but_a_shorter_last() -> None:
    dgs = [(b"x" * 10, A)] * 3 + [(b"y" * 4, A), (b"z" * 10, A), (b"w" * 10, B), (b"v" * 12, B), (b"u" * 3, B)]
    assert _sizes(segment_runs(dgs)) == [
        (A, 10, [10, 10, 10, 4]),  # the short one closes the run
        (A, 10, [10]),
        (B, 10, [10]),  # a larger datagram cannot join a run of smaller segments
        (B, 12, [12, 3]),
    ]
    assert segment_runs([]) == []


def test_runs_respect_the_segment_and_byte_limits() -> None:
    many = [(b"x" * 100, A)] * (MAX_SEGMENTS + 5)
    assert [len(run) for _, _, run in segment_runs(many)] == [MAX_SEGMENTS, 5]
    assert [len(run) for _, _, run in segment_runs(many, max_bytes=350)] == [3] * 23  # 69 datagrams


class _Sink(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.got: list[bytes] = []

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.got.append(data)


async def _send_through(datagrams: list[bytes]) -> tuple[list[bytes], SegmentingTransport]:
    """Send `datagrams` in one batch through a SegmentingTransport on loopback; what arrived."""
    loop = asyncio.get_running_loop()
    sink_tr, sink = await loop.create_datagram_endpoint(_Sink, local_addr=("127.0.0.1", 0))
    src_tr, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0))
    try:
        seg = SegmentingTransport(src_tr)
        to = sink_tr.get_extra_info("sockname")
        with seg.batch():
            for d in datagrams:
                seg.sendto(d, to)
        for _ in range(200):
            if len(sink.got) >= len(datagrams):
                break
            await asyncio.sleep(0.01)
        return sink.got, seg
    finally:
        src_tr.close()
        sink_tr.close()


def _payloads() -> list[bytes]:
    return [bytes([i]) * 1452 for i in range(20)] + [b"tail" * 50] + [bytes([99]) * 1452]


@pytest.mark.skipif(not gso.supported(), reason="UDP GSO is Linux-only")
async def test_a_batch_arrives_as_its_datagrams_in_order() -> None:
    sent = _payloads()
    got, seg = await _send_through(sent)
    assert got == sent
    assert seg.enabled and seg.segmented_sends == 1 and seg.segmented_datagrams == 21  # the last goes alone


@pytest.mark.skipif(not gso.supported(), reason="UDP GSO is Linux-only")
def test_a_batch_arrives_as_its_datagrams_on_uvloop() -> None:
    uvloop = pytest.importorskip("uvloop")
    sent = _payloads()
    got, seg = uvloop.run(_send_through(sent))
    assert got == sent and seg.segmented_datagrams == 21


async def test_a_refused_segmentation_falls_back_for_good(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def refuse(self: socket.socket, *args: Any) -> int:
        calls.append(args)
        raise OSError(errno.EIO, "no checksum offload")

    monkeypatch.setattr(gso, "supported", lambda: True)
    monkeypatch.setattr(socket.socket, "sendmsg", refuse)
    sent = _payloads()
    got, seg = await _send_through(sent)
    assert got == sent  # every datagram still left, one sendto each
    assert len(calls) == 1 and not seg.enabled and seg.segmented_sends == 0


class _Recording:
    """A transport that records its sends and claims buffered bytes."""

    def __init__(self, sock: socket.socket, buffered: int) -> None:
        self.sock, self.buffered, self.sent = sock, buffered, []

    def get_extra_info(self, name: str) -> Any:
        return self.sock if name == "socket" else None

    def sendto(self, data: bytes, addr: Any = None) -> None:
        self.sent.append(data)

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return self.buffered


def test_datagrams_the_transport_still_buffers_are_not_overtaken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gso, "supported", lambda: True)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        inner = _Recording(sock, buffered=3000)
        seg = SegmentingTransport(inner)
        with seg.batch():
            for d in _payloads():
                seg.sendto(d, A)
        assert inner.sent == _payloads() and seg.segmented_sends == 0
        seg.sendto(b"outside", A)  # outside a batch: straight through
        assert inner.sent[-1] == b"outside"


class _Echo:
    def __init__(self, conn: object) -> None:
        pass

    async def handle(self, msg: Message) -> Message:
        return Ack(0)


@pytest.mark.parametrize("udp_gso", [True, False])
async def test_the_setting_reaches_both_ends_of_a_connection(tmp_path: object, udp_gso: bool) -> None:
    """A 300 kB request crosses a loopback connection; with GSO on, its datagrams went in runs."""
    settings = TransportSettings(local_max_datagram_size=0, max_datagram_size=1452, udp_gso=udp_gso)
    certs = make_dev_certs(str(tmp_path), hosts=["127.0.0.1"], force=True)
    listener = await start_server("127.0.0.1", 0, server_configuration(certs.cert, certs.key, settings), _Echo)
    try:
        cfg = client_configuration(settings, ca=certs.ca, server_name="127.0.0.1")
        async with open_connection("127.0.0.1", listener.port, cfg) as conn:
            assert isinstance(await conn.request(Probe(b"p" * 300_000), 10), Ack)
            (server_conn,) = listener.accepted
            ends = (conn.segmenting, server_conn.segmenting)
            assert all(end is not None and end.enabled == (udp_gso and gso.supported()) for end in ends)
            if udp_gso and gso.supported():
                assert conn.segmenting.segmented_datagrams > 100  # most of the ~210 request datagrams
            else:
                assert conn.segmenting.segmented_sends == 0
    finally:
        await listener.stop()
