"""The wire format: msgpack encoding and framing of the schema's messages, and strict decoding.

One message per QUIC stream. A message is a msgpack map ``{"v": 2, "t": TYPE, ...}``; tensors
travel as codec payloads whose byte sections are msgpack ``bin`` (never pickle). A message with a
byte field over `INLINE_MAX` is framed: ``0xC1, u32 header length, header map, sections``, where
the header references each large field by length (msgpack ext type 1) and the fields follow in
order; neither side copies them (docs/PROTOCOL.md). Decoding never trusts the peer: msgpack's own
length limits bound every allocation before it happens, section references must tile the rest of
the message exactly, then each field's type, range and count is checked (`validate`). Any failure
raises `ProtocolError(code, reason)`. The message types themselves live in `messages`.
"""

from __future__ import annotations

from typing import Any

import msgpack

from netsense.compression import Payload
from netsense.errors import ProtocolError

from .messages import (
    HELLO_ROLES, JOB_ID_RE, MAX_PULL_KEYS, MESSAGE_TYPES, STATE_DTYPES, Ack, Auth, Bye, Challenge, Error, Hello, Init, Limits,
    MAX_INTENTS, MAX_SUM_TERMS, Message, Params, Probe, Pull, Push, Sum, TensorInfo, Welcome,
)
from .validate import PARSERS

# The message types are re-exported: `from netsense.transport.wire import Push` is their public spelling.
__all__ = [
    "ALPN", "FRAMED", "HELLO_ROLES", "INLINE_MAX", "JOB_ID_RE", "MAX_INTENTS", "MAX_PULL_KEYS", "MAX_SUM_TERMS", "MESSAGE_TYPES", "PROTOCOL_VERSION",
    "SECTION_EXT", "STATE_DTYPES", "SUPPORTED_VERSIONS", "Ack", "Auth", "Bye", "Challenge", "Chunk", "Error", "Hello",
    "Init", "Limits", "Message", "Params", "Probe", "Pull", "Push", "Sum", "TensorInfo", "Welcome", "decode_message",
    "encode_chunks", "encode_message",
]

PROTOCOL_VERSION = 2
"""Version this side writes. 2 added framed messages (large byte fields after the map).
"""
SUPPORTED_VERSIONS = (1, 2)
"""Versions this side reads: a version 1 message is a plain map with the same fields."""
ALPN = "netsense/1"

# --- encoding -------------------------------------------------------------------------------


def _payload_to_wire(p: Payload) -> dict[str, Any]:
    return {"c": p.codec, "s": list(p.shape), "d": p.dtype, "p": list(p.parts), "m": list(p.meta)}


_OMIT_DEFAULT = {
    "hello": ("job_id", "resume", "site"), "welcome": ("job_id", "site"), "init": ("model",), "push": ("keeps", "intent"),
    "params": ("pad", "gradient", "optimizer", "optim_state", "sums", "intents"), "ack": ("delivered_bytes", "delivered_s"),
}  # fmt: skip
"""Optional fields left out at their default, so a message without them is byte-identical to an older peer's."""


def _body(msg: Message) -> dict[str, Any]:
    body: dict[str, Any] = {"v": PROTOCOL_VERSION, "t": msg.TYPE}
    omit = _OMIT_DEFAULT.get(msg.TYPE, ())
    for name, f in msg.__dataclass_fields__.items():
        value = getattr(msg, name)
        if name == "intent_owners":  # the PS's own record: `Params.for_recipient` used it
            continue
        if name in omit and value == (f.default_factory() if callable(f.default_factory) else f.default):
            continue
        if name in ("tensors", "grads", "optim_state"):
            value = {k: _payload_to_wire(p) for k, p in value.items()}
        elif name == "sums":  # the PS's `owners` stay home: `Sum.for_recipient` used them
            value = {k: {"w": list(v.weights), "o": v.own, "p": [_payload_to_wire(p) for p in v.pushes]} for k, v in value.items()}
        elif name == "model":
            value = {k: {"n": i.name, "s": list(i.shape), "d": i.dtype, "o": i.offset, "b": i.buffer} for k, i in value.items()}
        body[name] = value
    return body


Chunk = bytes | bytearray | memoryview
"""A piece of an encoded message; the pieces in order are the message."""

FRAMED = 0xC1
"""First byte of a framed message. msgpack never uses it, so no plain message starts with it."""
SECTION_EXT = 1
"""msgpack ext type of a section reference in a framed header: 8 bytes, the section's length."""
_FRAME_PREFIX = 5  # FRAMED + 4-byte big-endian header length
INLINE_MAX = 64 * 1024
"""Byte fields up to this size stay inside the msgpack map; larger ones become sections."""


def _split(value: Any, sections: list[Chunk], inline_max: int) -> Any:
    """`value` with every byte field over `inline_max` replaced by a section reference (in msgpack's
    own order: maps by insertion, lists in order), the field itself appended to `sections`."""
    if isinstance(value, dict):
        return {k: _split(v, sections, inline_max) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_split(v, sections, inline_max) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)) and len(value) > inline_max:
        sections.append(value)
        return msgpack.ExtType(SECTION_EXT, len(value).to_bytes(8, "big"))
    return value


def encode_chunks(msg: Message, inline_max: int = INLINE_MAX) -> list[Chunk]:
    """Serialize `msg` as pieces to write in order: one plain msgpack map, or, when a byte field
    is larger than `inline_max`, a framed header followed by the fields themselves.

    Large fields are referenced, not copied: packing a 32 MB gradient into one msgpack buffer cost
    ~25 ms (a fresh buffer's page faults plus the copy) on a push that moves at ~50 MB/s, and the
    receiver reads framed sections in place instead of msgpack copying each `bin` out.
    """
    sections: list[Chunk] = []
    header = msgpack.packb(_split(_body(msg), sections, inline_max), use_bin_type=True)
    if not sections:
        return [header]
    return [bytes((FRAMED,)) + len(header).to_bytes(4, "big") + header, *sections]


def encode_message(msg: Message, inline_max: int = INLINE_MAX) -> bytes:
    """Serialize `msg` to bytes (see `encode_chunks`)."""
    return b"".join(encode_chunks(msg, inline_max))


# --- decoding -------------------------------------------------------------------------------


class _Sections:
    """The section area of a framed message, handed out in order as references are parsed."""

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.pos = 0

    def take(self, code: int, data: bytes) -> memoryview:
        """msgpack `ext_hook`: the next section, a slice of the message (no copy)."""
        if code != SECTION_EXT or len(data) != 8:
            raise ProtocolError("malformed", f"unknown msgpack ext type {code} ({len(data)} bytes) in a framed header")
        size = int.from_bytes(data, "big")
        if size > len(self.view) - self.pos:
            raise ProtocolError("malformed", f"section of {size} bytes but only {len(self.view) - self.pos} left in the message")
        self.pos += size
        return self.view[self.pos - size : self.pos]


def _unpack(data: bytes | bytearray | memoryview, limits: Limits, sections: _Sections | None) -> Any:
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_bin_len=limits.max_message_bytes,
            max_str_len=1 << 16,
            max_array_len=max(limits.max_parts, limits.max_meta, limits.max_dims, 64),
            max_map_len=max(limits.max_keys, 16),
            max_ext_len=8 if sections is not None else 0,  # references only, only in a framed header
            ext_hook=sections.take if sections is not None else msgpack.ExtType,
        )
    except ProtocolError:
        raise
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, TypeError) as exc:
        raise ProtocolError("malformed", f"not a valid msgpack message: {exc}") from None


def _body_of(data: bytes | bytearray | memoryview, limits: Limits) -> Any:
    """The message map: plain msgpack, or a framed header whose references become slices of `data`."""
    if not len(data) or data[0] != FRAMED:
        return _unpack(data, limits, None)
    view = memoryview(data)
    if len(view) < _FRAME_PREFIX:
        raise ProtocolError("malformed", f"framed message of {len(view)} bytes has no header length")
    header_len = int.from_bytes(view[1:_FRAME_PREFIX], "big")
    if header_len > len(view) - _FRAME_PREFIX:
        raise ProtocolError("malformed", f"framed header of {header_len} bytes but the message has {len(view) - _FRAME_PREFIX}")
    end = _FRAME_PREFIX + header_len
    sections = _Sections(view[end:])
    body = _unpack(view[_FRAME_PREFIX:end], limits, sections)
    if sections.pos != len(sections.view):
        raise ProtocolError("malformed", f"{len(sections.view) - sections.pos} bytes after the framed sections")
    return body


def decode_message(data: bytes | bytearray | memoryview, limits: Limits = Limits()) -> Message:
    """Parse and validate one message (any bytes-like buffer, read in place; byte fields of a framed
    message are memoryview slices of it); raise `ProtocolError` with a code and reason on any defect."""
    if len(data) > limits.max_message_bytes:
        raise ProtocolError("oversize", f"message of {len(data)} bytes > limit {limits.max_message_bytes}")
    body = _body_of(data, limits)
    if not isinstance(body, dict):
        raise ProtocolError("malformed", f"message must be a map, got {type(body).__name__}")
    if body.get("v") not in SUPPORTED_VERSIONS or isinstance(body.get("v"), bool):
        raise ProtocolError("version", f"protocol version {body.get('v')!r} not supported; this side reads {SUPPORTED_VERSIONS}")
    kind = body.get("t")
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError("type", f"unknown message type {kind!r}")
    return PARSERS[kind](body, limits)

