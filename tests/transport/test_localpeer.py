"""Peers on this host get loopback-sized datagrams; every other peer keeps `max_datagram_size`."""

from __future__ import annotations

import socket
from dataclasses import replace

import pytest

from netsense.errors import ConfigError
from netsense.transport import localpeer
from netsense.transport.channel import open_connection
from netsense.transport.listener import start_server
from netsense.transport.localpeer import for_peer, on_this_host, peer_picker
from netsense.transport.sensing.aioquic_private import connection_of, read_recovery
from netsense.transport.tls import (
    LOOPBACK_MAX_DATAGRAM_SIZE,
    TransportSettings,
    client_configuration,
    make_dev_certs,
    server_configuration,
)
from netsense.transport.wire import Ack, Message


def _own_address() -> str | None:
    """A non-loopback address of this host: the source the kernel picks towards TEST-NET-3."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("203.0.113.7", 9))  # UDP connect sends nothing
        except OSError:
            return None
        addr = sock.getsockname()[0]
    return None if addr.startswith("127.") else addr


def test_on_this_host_knows_loopback_and_own_addresses_only() -> None:
    assert on_this_host("127.0.0.1") and on_this_host("127.3.4.5") and on_this_host("::ffff:127.0.0.1")
    for other in ("203.0.113.7", "0.0.0.0", "::", "224.0.0.1", "localhost", "not an address", ""):
        assert not on_this_host(other), other
    own = _own_address()
    if own is None:
        pytest.skip("no route off loopback: no own address to check")
    assert on_this_host(own)


def test_for_peer_raises_the_size_for_this_host_only() -> None:
    cfg = client_configuration(TransportSettings(), ca=None, server_name="x", insecure=True)
    assert cfg.max_datagram_size == 1200
    local = for_peer(cfg, "127.0.0.1")
    assert local.max_datagram_size == LOOPBACK_MAX_DATAGRAM_SIZE and local.verify_mode == cfg.verify_mode
    assert for_peer(cfg, "203.0.113.7") is cfg
    off = client_configuration(TransportSettings(local_max_datagram_size=0), ca=None, server_name="x", insecure=True)
    assert for_peer(off, "127.0.0.1") is off
    big = client_configuration(TransportSettings(max_datagram_size=16_000), ca=None, server_name="x", insecure=True)
    assert for_peer(big, "127.0.0.1") is big  # never smaller than the configured size
    pick = peer_picker(replace(cfg, is_client=False))
    assert pick("127.0.0.1") is pick("::1") and pick("127.0.0.1").max_datagram_size == LOOPBACK_MAX_DATAGRAM_SIZE
    assert pick("203.0.113.7").max_datagram_size == 1200


@pytest.mark.parametrize("bad", [1, 1199, 65508, -5])
def test_a_bad_local_size_is_refused(bad: int) -> None:
    with pytest.raises(ConfigError, match="local_max_datagram_size"):
        TransportSettings(local_max_datagram_size=bad)


class _Echo:
    def __init__(self, conn: object) -> None:
        pass

    async def handle(self, msg: Message) -> Message:
        return Ack(0)


async def _sizes(tmp_path: object, settings: TransportSettings) -> tuple[int, int]:
    """Datagram sizes of both ends of one loopback connection, after a request crossed it."""
    certs = make_dev_certs(str(tmp_path), hosts=["127.0.0.1"], force=True)
    listener = await start_server("127.0.0.1", 0, server_configuration(certs.cert, certs.key, settings), _Echo)
    try:
        cfg = client_configuration(settings, ca=certs.ca, server_name="127.0.0.1")
        async with open_connection("127.0.0.1", listener.port, cfg) as conn:
            await conn.request(Ack(0), 10)
            (server_conn,) = listener.accepted
            return (
                read_recovery(connection_of(conn)).max_datagram_size,
                read_recovery(connection_of(server_conn)).max_datagram_size,
            )
    finally:
        await listener.stop()


async def test_both_ends_of_a_loopback_connection_use_the_local_size(tmp_path: object) -> None:
    assert await _sizes(tmp_path, TransportSettings()) == (LOOPBACK_MAX_DATAGRAM_SIZE,) * 2
    assert await _sizes(tmp_path, TransportSettings(local_max_datagram_size=0)) == (1200, 1200)


async def test_a_peer_elsewhere_keeps_the_configured_size(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a peer across a network gets, on loopback: the predicate says "not this host"."""
    monkeypatch.setattr(localpeer, "on_this_host", lambda host: False)
    assert await _sizes(tmp_path, TransportSettings()) == (1200, 1200)


@pytest.mark.parametrize("command", ["ps", "worker", "relay"])
def test_the_datagram_size_flag_holds_for_peers_on_this_host_too(command: str) -> None:
    """`--max-datagram-size N` is the size asked for every peer; a config file's `max_datagram_size`
    (a WAN's MTU) leaves this host's peers at the local size."""
    from netsense.cli import build_parser
    from netsense.cli.flags import resolve_config

    extra = ["--ps", "127.0.0.1:1", "--site", "a", "--site-workers", "2"] if command == "relay" else []
    transport = resolve_config(build_parser().parse_args([command, *extra, "--max-datagram-size", "1400"])).transport
    assert transport.max_datagram_size == 1400 and transport.local_max_datagram_size == 1400
    cfg = client_configuration(transport, ca=None, server_name="x", insecure=True)
    assert for_peer(cfg, "127.0.0.1") is cfg
    default = resolve_config(build_parser().parse_args([command, *extra])).transport
    assert default.local_max_datagram_size == LOOPBACK_MAX_DATAGRAM_SIZE
