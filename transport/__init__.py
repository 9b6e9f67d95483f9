"""QUIC channel, wire schema, TLS, auth and the client handshake; the network signal (`sensing/`)
and the link emulator (`emulation/`) are subpackages, their main names re-exported here.

The re-exports are lazy (PEP 562 `__getattr__`): importing any submodule runs this file first, and
`wire` and `sensing.signal` import `netsense.compression`, hence torch (~2 s of CPU). Eager, they
made `netsense emulate`, which only moves datagrams, pay for torch on every emulated job's
critical path (the launcher waits for the emulator's port before it starts the workers).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .auth import auth_mac, load_secret, verify_mac
    from .emulation.emulator import LinkEmulator
    from .emulation.linkspec import DuplexSpec, LinkSpec, parse_link
    from .sensing.signal import NetworkSignal, SignalReader
    from .tls import CertPaths, TransportSettings, client_configuration, make_dev_certs, server_configuration
    from .wire import ALPN, PROTOCOL_VERSION, Limits, decode_message, encode_message

_LAZY: dict[str, str] = {
    **dict.fromkeys(("auth_mac", "load_secret", "verify_mac"), ".auth"),
    "LinkEmulator": ".emulation.emulator",
    **dict.fromkeys(("DuplexSpec", "LinkSpec", "parse_link"), ".emulation.linkspec"),
    **dict.fromkeys(("NetworkSignal", "SignalReader"), ".sensing.signal"),
    **dict.fromkeys(("CertPaths", "TransportSettings", "client_configuration", "make_dev_certs", "server_configuration"), ".tls"),
    **dict.fromkeys(("ALPN", "PROTOCOL_VERSION", "Limits", "decode_message", "encode_message"), ".wire"),
}
"""Re-exported name -> the submodule that defines it."""

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


def __getattr__(name: str) -> Any:
    """A re-export, imported from its submodule on first use and then cached here."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The re-exports too, as before they became lazy (tab completion, `dir()`)."""
    return sorted({*globals(), *__all__})
