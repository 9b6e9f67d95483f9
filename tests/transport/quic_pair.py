"""A real aioquic client/server `QuicConnection` pair in memory: sans-I/O, a simulated clock,
deterministic, no sockets (shared by the private-state and congestion-control tests)."""

from __future__ import annotations

import ssl

from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from quic_certs import self_signed
from netsense.transport.sensing.congestion import SENSING_CC

CLIENT_ADDR = ("10.0.0.1", 1234)
SERVER_ADDR = ("10.0.0.2", 4433)
MDS = 1200


class Pair:
    """A client and a server connection exchanging datagrams over a 5 ms one-way simulated link."""

    DELAY = 0.005

    def __init__(self, cc: str = SENSING_CC) -> None:
        cert, key = self_signed()
        server_cfg = QuicConfiguration(is_client=False, congestion_control_algorithm=cc)
        server_cfg.certificate, server_cfg.private_key = cert, key
        client_cfg = QuicConfiguration(
            is_client=True, congestion_control_algorithm=cc, verify_mode=ssl.CERT_NONE,
            max_data=1 << 26, max_stream_data=1 << 26,
        )
        server_cfg.max_data = server_cfg.max_stream_data = 1 << 26
        self.now = 1000.0
        self.client = QuicConnection(configuration=client_cfg)
        self.server = QuicConnection(
            configuration=server_cfg,
            original_destination_connection_id=self.client.original_destination_connection_id,
        )
        self.client.connect(SERVER_ADDR, now=self.now)
        self.exchange(rounds=6)

    def exchange(self, rounds: int) -> None:
        """Deliver every pending datagram each way, `rounds` times, one link delay per hop."""
        for _ in range(rounds):
            for data, _ in self.client.datagrams_to_send(now=self.now):
                self.server.receive_datagram(data, CLIENT_ADDR, now=self.now + self.DELAY)
            self.now += self.DELAY
            for data, _ in self.server.datagrams_to_send(now=self.now):
                self.client.receive_datagram(data, SERVER_ADDR, now=self.now + self.DELAY)
            self.now += self.DELAY


def loaded_pair() -> Pair:
    """A pair after the client sent 200 kB on one stream (RTT, window and delivery samples are set)."""
    p = Pair()
    stream = p.client.get_next_available_stream_id()
    p.client.send_stream_data(stream, b"x" * 200_000)
    p.exchange(rounds=20)
    return p
