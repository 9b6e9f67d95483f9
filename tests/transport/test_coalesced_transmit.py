"""Once the handshake is done, datagrams handed over in one loop pass are answered by one
transmit, not one each; a transmit made meanwhile sends for the coalesced one, which then does not
run; before it, every datagram is answered at once (the handshake's flights leave before a
callback can close the connection)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import HandshakeCompleted

from netsense.transport.channel import MessageProtocol
from netsense.transport.sensing.aioquic_private import connection_of


class _Transport:
    """A datagram transport that drops what it is given (no socket: no GSO)."""

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def sendto(self, data: bytes, addr: Any = None) -> None:
        pass

    def is_closing(self) -> bool:
        return False


def _protocol(*, handshake_done: bool = True) -> tuple[MessageProtocol, list[float]]:
    """A connected protocol and the list each of its transmits appends to."""
    protocol = MessageProtocol(QuicConnection(configuration=QuicConfiguration(is_client=True)))
    protocol.connection_made(_Transport())  # type: ignore[arg-type]
    quic = connection_of(protocol)
    quic.connect(("127.0.0.1", 9), now=time.monotonic())  # a path to send on (its Initial goes nowhere)
    passes: list[float] = []
    real = quic.datagrams_to_send

    def counted(now: float) -> list[tuple[bytes, Any]]:
        passes.append(now)
        return real(now=now)

    quic.datagrams_to_send = counted  # type: ignore[method-assign]
    if handshake_done:
        protocol.quic_event_received(HandshakeCompleted(alpn_protocol=None, early_data_accepted=False, session_resumed=False))
    return protocol, passes


async def test_a_burst_of_datagrams_is_answered_by_one_transmit() -> None:
    protocol, passes = _protocol()
    for _ in range(5):  # undecodable datagrams: aioquic drops them, as it would a stray packet
        protocol.datagram_received(b"\x00" * 40, ("127.0.0.1", 9))
    assert passes == []  # nothing transmitted inside the pass
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(passes) == 1
    protocol.datagram_received(b"\x00" * 40, ("127.0.0.1", 9))
    await asyncio.sleep(0)
    assert len(passes) == 2  # the next pass gets its own


async def test_a_transmit_meanwhile_replaces_the_coalesced_one() -> None:
    protocol, passes = _protocol()
    protocol.datagram_received(b"\x00" * 40, ("127.0.0.1", 9))
    protocol.transmit()  # e.g. a reply sent before the loop came round
    assert len(passes) == 1
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(passes) == 1


async def test_before_the_handshake_every_datagram_is_answered_at_once() -> None:
    protocol, passes = _protocol(handshake_done=False)
    for _ in range(3):
        protocol.datagram_received(b"\x00" * 40, ("127.0.0.1", 9))
    assert len(passes) == 3
    await asyncio.sleep(0)
    assert len(passes) == 3
