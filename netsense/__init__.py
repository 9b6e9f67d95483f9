"""NetSense: parameter-server training over QUIC with network-adaptive gradient compression.

Kept import-light on purpose: the subpackages (`netsense.compression`, `.transport`, `.ps`,
`.worker`) import `netsense.errors`, so this file must not import them back.
"""

from __future__ import annotations

from .errors import (
    AuthError,
    CompressionError,
    ConfigError,
    NetSenseError,
    PeerError,
    PeerTimeout,
    ProcessFailed,
    ProtocolError,
    RequestAbandoned,
)

__version__ = "0.1.0"

__all__ = [
    "AuthError",
    "CompressionError",
    "ConfigError",
    "NetSenseError",
    "PeerError",
    "PeerTimeout",
    "ProcessFailed",
    "ProtocolError",
    "RequestAbandoned",
    "__version__",
]
