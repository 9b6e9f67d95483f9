"""The exception tree. Every component raises one of these; library errors are mapped at the boundary.

This module imports nothing from the project so that every layer (compression, transport, ps,
worker) may depend on it without breaking the one-way dependency direction of docs/ARCHITECTURE.md
("Layers"); tests/test_layering.py checks that direction. `netsense.__all__` exports every class here.
"""

from __future__ import annotations


class NetSenseError(Exception):
    """Root of every error NetSense raises on purpose."""


class ConfigError(NetSenseError):
    """A setting, flag or config file is invalid; the message names the field and the value."""


class CompressionError(NetSenseError):
    """A codec spec is unknown or an encoded payload is malformed (untrusted bytes failed checks)."""


class ProtocolError(NetSenseError):
    """A peer sent a message that violates the wire protocol (size, type, dtype, shape, version)."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        """Machine-readable error code, sent back to the peer in ERROR."""
        self.reason = reason
        """Human-readable explanation with the offending value."""


class AuthError(NetSenseError):
    """A peer failed authentication (wrong secret, replay) or TLS verification failed."""


class PeerTimeout(NetSenseError):
    """A peer did not answer within the configured time."""


class RequestAbandoned(NetSenseError):
    """This side withdrew a request before its last byte left (a push re-encoded mid-flight)."""


class PeerError(NetSenseError):
    """The remote side answered with an ERROR message."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"peer refused: {code}: {reason}")
        self.code = code
        self.reason = reason


class ProcessFailed(NetSenseError):
    """A process started by the launcher exited with an error; the others were stopped."""
