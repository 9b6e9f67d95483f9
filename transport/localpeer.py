"""Peers on this host get loopback-sized QUIC datagrams (docs/ARCHITECTURE.md, "Datagram size per peer").

aioquic's Python work is per packet, so a connection's CPU scales with its datagram count, and
traffic to an address of this host never leaves it (the kernel routes it over `lo`, MTU 64 KiB):
a worker, relay and shard that share a host move their bytes in 8952-byte datagrams while their
peers across a network keep `transport.max_datagram_size`. Only *this host* is decided here, never
a path's MTU: a larger first hop says nothing about the hops after it.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass, replace

from aioquic.quic.configuration import QuicConfiguration


@dataclass
class PeerQuicConfiguration(QuicConfiguration):
    """aioquic's configuration plus what NetSense's endpoints add: the datagram size for peers on
    this host (0: no other size) and whether sends use UDP segmentation offload."""

    local_max_datagram_size: int = 0
    udp_gso: bool = True


@functools.lru_cache(maxsize=1024)
def on_this_host(host: str) -> bool:
    """True when `host` (an IP address, IPv6 scope and IPv4-mapped forms included) is loopback or
    one of this host's own addresses (a socket can bind to it); names and unparsable input: False."""
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr.is_loopback:
        return True
    if addr.is_unspecified or addr.is_multicast:
        return False
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.bind((str(addr), 0))
    except OSError:
        return False
    return True


def _local(configuration: QuicConfiguration) -> QuicConfiguration:
    """`configuration` with its local datagram size, or itself when that is not larger."""
    local = getattr(configuration, "local_max_datagram_size", 0)
    if local <= configuration.max_datagram_size:
        return configuration
    return replace(configuration, max_datagram_size=local)


def for_peer(configuration: QuicConfiguration, host: str) -> QuicConfiguration:
    """`configuration` for a connection with `host`: its local datagram size when `host` is on this
    host and that size is larger, else `configuration` itself."""
    return _local(configuration) if on_this_host(host) else configuration


def peer_picker(configuration: QuicConfiguration) -> Callable[[str], QuicConfiguration]:
    """`for_peer` for a server, called on every datagram: two configurations built once."""
    local = _local(configuration)
    if local is configuration:
        return lambda host: configuration
    return lambda host: local if on_this_host(host) else configuration
