"""QUIC channel, wire schema, TLS, auth and the client handshake; the network signal (`sensing/`)
and the link emulator (`emulation/`) are subpackages, their main names re-exported here."""

from __future__ import annotations

from .auth import auth_mac, load_secret, verify_mac
from .emulation.emulator import LinkEmulator
from .emulation.linkspec import DuplexSpec, LinkSpec, parse_link
from .sensing.signal import NetworkSignal, SignalReader
from .tls import CertPaths, TransportSettings, client_configuration, make_dev_certs, server_configuration
from .wire import ALPN, PROTOCOL_VERSION, Limits, decode_message, encode_message

__all__ = [
    "ALPN",
    "PROTOCOL_VERSION",
    "CertPaths",
    "DuplexSpec",
    "Limits",
    "LinkEmulator",
    "LinkSpec",
    "NetworkSignal",
    "SignalReader",
    "TransportSettings",
    "auth_mac",
    "client_configuration",
    "decode_message",
    "encode_message",
    "load_secret",
    "make_dev_certs",
    "parse_link",
    "server_configuration",
    "verify_mac",
]
