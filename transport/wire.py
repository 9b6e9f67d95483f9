"""The wire schema: frozen message dataclasses, msgpack encoding, and strict validation.

One message per QUIC stream. A message is a msgpack map ``{"v": 2, "t": TYPE, ...}``; tensors
travel as codec payloads whose byte sections are msgpack ``bin`` (never pickle). A message with a
byte field over `INLINE_MAX` is framed: ``0xC1, u32 header length, header map, sections``, where
the header references each large field by length (msgpack ext type 1) and the fields follow in
order; neither side copies them (docs/PROTOCOL.md). Decoding never trusts the peer: msgpack's own
length limits bound every allocation before it happens, section references must tile the rest of
the message exactly, then each field's type, range and count is checked. Any failure raises
`ProtocolError(code, reason)`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack

from netsense.compression import DTYPES, Payload
from netsense.errors import ProtocolError

from .hparams import MAX_GROUPS, check_group

PROTOCOL_VERSION = 2
"""Version this side writes. 2 added framed messages (large byte fields after the map).
"""
SUPPORTED_VERSIONS = (1, 2)
"""Versions this side reads: a version 1 message is a plain map with the same fields."""
ALPN = "netsense/1"
_KEY_RE = re.compile(r"^[A-Za-z0-9_.\-/#:]{1,200}$")


@dataclass(frozen=True)
class Limits:
    """Bounds applied to every incoming message before its contents are used."""

    max_message_bytes: int = 512 * 1024 * 1024
    """Largest message accepted; the receiver stops buffering a stream past this."""
    max_keys: int = 4096
    """Most tensors one message may carry."""
    max_elems_per_key: int = 1 << 27
    """Most dense elements one tensor may claim (checked before decoding allocates)."""
    max_parts: int = 8
    """Most byte sections one payload may carry."""
    max_meta: int = 8
    """Most scalars one payload may carry."""
    max_dims: int = 8
    """Most dimensions a tensor shape may have."""
    max_probe_bytes: int = 16 * 1024 * 1024
    """Largest PROBE payload (path measurement bulk data, discarded by the PS)."""


# --- messages -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    """Base of every message; `TYPE` is the wire tag."""

    TYPE: ClassVar[str] = ""


@dataclass(frozen=True)
class Hello(Message):
    """Worker -> PS: who I am, and a fresh nonce for the challenge."""

    TYPE: ClassVar[str] = "hello"
    worker_id: str
    """Stable name of the worker (survives restarts, so a rejoin is recognised)."""
    rank: int
    """Rank in the job; rank 0 provides the initial parameters."""
    client_nonce: bytes
    """32 random bytes chosen by the worker, mixed into the MAC."""
    role: str = "worker"
    """``worker`` joins the training barrier; ``probe`` (`netsense probe --ps`) only measures the path
    with PROBE messages and is never counted as a worker."""
    job_id: str = ""
    """The job this worker belongs to (`JOB_ID_RE`; empty: unknown, a peer from before job ids). A PS
    that holds another job's state refuses it (`error(job)`) unless `resume` is set."""
    resume: bool = False
    """Continue the job whose state the PS holds, whatever its id (docs/ARCHITECTURE.md, "Job identity")."""


HELLO_ROLES = ("worker", "probe")
"""Roles a HELLO may claim."""


@dataclass(frozen=True)
class Challenge(Message):
    """PS -> worker: the server's nonce to be signed with the shared secret."""

    TYPE: ClassVar[str] = "challenge"
    server_nonce: bytes
    """32 random bytes, fresh per connection, so a recorded AUTH cannot be replayed."""


@dataclass(frozen=True)
class Auth(Message):
    """Worker -> PS: HMAC-SHA256 over both nonces and the worker id."""

    TYPE: ClassVar[str] = "auth"
    mac: bytes
    """The MAC (32 bytes)."""


@dataclass(frozen=True)
class Welcome(Message):
    """PS -> worker: accepted; the state of the store."""

    TYPE: ClassVar[str] = "welcome"
    version: int
    """Current parameter version (number of applied updates)."""
    initialized: bool
    """False until rank 0 has sent INIT."""
    live_workers: int
    """Workers currently in the sync barrier."""
    staleness: int = -1
    """-1: the PS is synchronous (BSP); s >= 0: asynchronous, a worker may run s versions ahead of
    the slowest (SSP), so pulls return full parameters at whatever version is current."""
    job_id: str = ""
    """The job whose state the PS holds (empty: none yet, or unknown)."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one key lives in the model's `state_dict` (INIT's `model` map; `netsense export`)."""

    name: str
    """The `state_dict` entry the key belongs to."""
    shape: tuple[int, ...]
    """Shape of the whole entry (a chunk key covers part of it)."""
    dtype: str
    """The entry's dtype (`STATE_DTYPES`), which may differ from the wire's (integers travel as float64)."""
    offset: int
    """First flat element of the entry that the key covers."""
    buffer: bool
    """A state key (buffer, frozen parameter): averaged from pushed values, never optimized."""


STATE_DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
"""Dtypes a `TensorInfo` may name."""
JOB_ID_RE = re.compile(r"^[A-Za-z0-9_.\-:]{0,128}$")
"""Job ids: up to 128 characters of ``[A-Za-z0-9_.-:]`` (empty: unknown)."""


@dataclass(frozen=True)
class Init(Message):
    """Rank 0 -> PS: the initial parameters (lossless), one payload per key, in key order."""

    TYPE: ClassVar[str] = "init"
    tensors: dict[str, Payload]
    """Key -> lossless payload."""
    optimizer: dict[str, Any] = field(default_factory=dict)
    """Optimizer settings the PS should use (name, lr, ...); validated by the store."""
    world_size: int = 1
    """Workers the first step waits for (until the barrier timeout), so none misses step 0."""
    model: dict[str, TensorInfo] = field(default_factory=dict)
    """Key -> its place in the model's `state_dict`, for every key of `tensors` (empty: a worker from
    before the map; then the PS has no state keys and cannot export)."""


@dataclass(frozen=True)
class Push(Message):
    """Worker -> PS: gradients of step `step` for some keys (one bucket)."""

    TYPE: ClassVar[str] = "push"
    step: int
    """Parameter version the gradients were computed on."""
    samples: int
    """Samples in the worker's batch: weights the average so it equals one big batch."""
    total_keys: int
    """Keys the worker pushes for this step in all buckets (lets the PS know when it is done)."""
    grads: dict[str, Payload]
    """Key -> encoded gradient."""
    hparams: tuple[dict[str, float], ...] = ()
    """The worker's optimizer hyper-parameters for this step, one map per parameter group (names
    and bounds: `netsense.transport.hparams`); the PS applies them to this step. Empty: the PS's
    own settings (a worker from before per-step hyper-parameters)."""
    groups: dict[str, int] = field(default_factory=dict)
    """Key -> index into `hparams` for keys of this push outside group 0 (absent: group 0)."""
    skip: bool = False
    """The worker sits this step out (its AMP grad scaler found Inf/NaN): no gradients, but it
    counts as done for the barrier."""


@dataclass(frozen=True)
class Pull(Message):
    """Worker -> PS: send parameters once the version reaches `wait_for`."""

    TYPE: ClassVar[str] = "pull"
    have_version: int
    """Version of the worker's replica, or -1 for a full download."""
    wait_for: int
    """Block until the PS version is at least this."""
    keys: tuple[str, ...] = ()
    """Empty: every key. Otherwise a pipelined pull (sync PS, overlap): only these keys, answered
    as soon as the PS has applied them for version `wait_for` (before the whole step is done), as a
    delta from `have_version` = `wait_for` - 1; at most `MAX_PULL_KEYS`."""


MAX_PULL_KEYS = 64
"""Most keys one PULL may name (msgpack's array bound in `decode_message`)."""


@dataclass(frozen=True)
class Params(Message):
    """PS -> worker: parameters; `full` is a replacement, otherwise a delta to add."""

    TYPE: ClassVar[str] = "params"
    version: int
    """Version these parameters correspond to."""
    full: bool
    """True: replace the replica; False: add the decoded deltas to it."""
    tensors: dict[str, Payload]
    """Key -> payload."""
    base_version: int = -1
    """For a delta: the version it applies to."""


@dataclass(frozen=True)
class Ack(Message):
    """PS -> worker: request handled."""

    TYPE: ClassVar[str] = "ack"
    version: int
    """PS version when handled."""


@dataclass(frozen=True)
class Error(Message):
    """Either way: the request was refused; nothing was applied."""

    TYPE: ClassVar[str] = "error"
    code: str
    """Machine-readable code (``malformed``, ``auth``, ``shape`` ...)."""
    reason: str
    """What was wrong, with the value."""


@dataclass(frozen=True)
class Probe(Message):
    """Probe -> PS: bulk bytes to measure the path; answered with ACK once received, then dropped."""

    TYPE: ClassVar[str] = "probe"
    data: bytes
    """Filler, at most `Limits.max_probe_bytes`."""


@dataclass(frozen=True)
class Bye(Message):
    """Worker -> PS: leaving on purpose (removed from the barrier at once)."""

    TYPE: ClassVar[str] = "bye"
    reason: str = ""
    """Why, for the log."""


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls for cls in (Hello, Challenge, Auth, Welcome, Init, Push, Pull, Params, Ack, Error, Bye, Probe)
}

# --- encoding -------------------------------------------------------------------------------


def _payload_to_wire(p: Payload) -> dict[str, Any]:
    return {"c": p.codec, "s": list(p.shape), "d": p.dtype, "p": list(p.parts), "m": list(p.meta)}


_OMIT_DEFAULT = {"hello": ("job_id", "resume"), "welcome": ("job_id",), "init": ("model",)}
"""Optional fields left out at their default, so a message without them is byte-identical to an older peer's."""


def _body(msg: Message) -> dict[str, Any]:
    body: dict[str, Any] = {"v": PROTOCOL_VERSION, "t": msg.TYPE}
    omit = _OMIT_DEFAULT.get(msg.TYPE, ())
    for name, f in msg.__dataclass_fields__.items():
        value = getattr(msg, name)
        if name in omit and value == (f.default_factory() if callable(f.default_factory) else f.default):
            continue
        if name in ("tensors", "grads"):
            value = {k: _payload_to_wire(p) for k, p in value.items()}
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


def _fail(code: str, reason: str) -> ProtocolError:
    return ProtocolError(code, reason)


def _int(body: dict[str, Any], name: str, lo: int = -1, hi: int = 1 << 62) -> int:
    v = body.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise _fail("malformed", f"field {name!r} must be an int in [{lo}, {hi}], got {v!r}")
    return v


def _str(body: dict[str, Any], name: str, max_len: int = 4096) -> str:
    v = body.get(name)
    if not isinstance(v, str) or len(v) > max_len:
        raise _fail("malformed", f"field {name!r} must be a string of <= {max_len} chars, got {type(v).__name__}")
    return v


def _bin(body: dict[str, Any], name: str, size: int) -> bytes:
    v = body.get(name)
    if not isinstance(v, bytes) or len(v) != size:
        raise _fail("malformed", f"field {name!r} must be {size} bytes")
    return v


def _bool(body: dict[str, Any], name: str) -> bool:
    v = body.get(name)
    if not isinstance(v, bool):
        raise _fail("malformed", f"field {name!r} must be a bool, got {v!r}")
    return v


def _payload(key: str, raw: Any, limits: Limits) -> Payload:
    if not isinstance(raw, dict) or set(raw) != {"c", "s", "d", "p", "m"}:
        raise _fail("malformed", f"tensor {key!r}: payload must be a map with keys c,s,d,p,m")
    codec, shape, dtype, parts, meta = raw["c"], raw["s"], raw["d"], raw["p"], raw["m"]
    if not isinstance(codec, str) or not 0 < len(codec) <= 64:
        raise _fail("malformed", f"tensor {key!r}: codec must be a short string, got {codec!r}")
    if dtype not in DTYPES:
        raise _fail("dtype", f"tensor {key!r}: dtype {dtype!r} not allowed; allowed: {sorted(DTYPES)}")
    if (
        not isinstance(shape, list)
        or len(shape) > limits.max_dims
        or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < (1 << 40) for d in shape)
    ):
        raise _fail("shape", f"tensor {key!r}: shape {shape!r} must be <= {limits.max_dims} non-negative ints")
    numel = math.prod(shape)
    if numel > limits.max_elems_per_key:
        raise _fail("oversize", f"tensor {key!r}: {numel} elements > limit {limits.max_elems_per_key}")
    if not isinstance(parts, list) or len(parts) > limits.max_parts or not all(isinstance(b, (bytes, memoryview)) for b in parts):
        raise _fail("malformed", f"tensor {key!r}: parts must be a list of <= {limits.max_parts} bin")
    if (
        not isinstance(meta, list)
        or len(meta) > limits.max_meta
        or not all(isinstance(m, (int, float)) and not isinstance(m, bool) for m in meta)
    ):
        raise _fail("malformed", f"tensor {key!r}: meta must be a list of <= {limits.max_meta} numbers")
    return Payload(codec, tuple(shape), dtype, tuple(parts), tuple(float(m) for m in meta))


def _tensors(body: dict[str, Any], name: str, limits: Limits) -> dict[str, Payload]:
    raw = body.get(name)
    if not isinstance(raw, dict):
        raise _fail("malformed", f"field {name!r} must be a map of key -> payload")
    if len(raw) > limits.max_keys:
        raise _fail("oversize", f"{len(raw)} keys > limit {limits.max_keys}")
    out: dict[str, Payload] = {}
    for key, p in raw.items():
        if not isinstance(key, str) or not _KEY_RE.match(key):
            raise _fail("key", f"bad key name {key!r}: use 1-200 chars of [A-Za-z0-9_.-/#:]")
        out[key] = _payload(key, p, limits)
    return out


class _Sections:
    """The section area of a framed message, handed out in order as references are parsed."""

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.pos = 0

    def take(self, code: int, data: bytes) -> memoryview:
        """msgpack `ext_hook`: the next section, a slice of the message (no copy)."""
        if code != SECTION_EXT or len(data) != 8:
            raise _fail("malformed", f"unknown msgpack ext type {code} ({len(data)} bytes) in a framed header")
        size = int.from_bytes(data, "big")
        if size > len(self.view) - self.pos:
            raise _fail("malformed", f"section of {size} bytes but only {len(self.view) - self.pos} left in the message")
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
        raise _fail("malformed", f"not a valid msgpack message: {exc}") from None


def _body_of(data: bytes | bytearray | memoryview, limits: Limits) -> Any:
    """The message map: plain msgpack, or a framed header whose references become slices of `data`."""
    if not len(data) or data[0] != FRAMED:
        return _unpack(data, limits, None)
    view = memoryview(data)
    if len(view) < _FRAME_PREFIX:
        raise _fail("malformed", f"framed message of {len(view)} bytes has no header length")
    header_len = int.from_bytes(view[1:_FRAME_PREFIX], "big")
    if header_len > len(view) - _FRAME_PREFIX:
        raise _fail("malformed", f"framed header of {header_len} bytes but the message has {len(view) - _FRAME_PREFIX}")
    end = _FRAME_PREFIX + header_len
    sections = _Sections(view[end:])
    body = _unpack(view[_FRAME_PREFIX:end], limits, sections)
    if sections.pos != len(sections.view):
        raise _fail("malformed", f"{len(sections.view) - sections.pos} bytes after the framed sections")
    return body


def decode_message(data: bytes | bytearray | memoryview, limits: Limits = Limits()) -> Message:
    """Parse and validate one message (any bytes-like buffer, read in place; byte fields of a framed
    message are memoryview slices of it); raise `ProtocolError` with a code and reason on any defect."""
    if len(data) > limits.max_message_bytes:
        raise _fail("oversize", f"message of {len(data)} bytes > limit {limits.max_message_bytes}")
    body = _body_of(data, limits)
    if not isinstance(body, dict):
        raise _fail("malformed", f"message must be a map, got {type(body).__name__}")
    if body.get("v") not in SUPPORTED_VERSIONS or isinstance(body.get("v"), bool):
        raise _fail("version", f"protocol version {body.get('v')!r} not supported; this side reads {SUPPORTED_VERSIONS}")
    kind = body.get("t")
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise _fail("type", f"unknown message type {kind!r}")
    return _PARSERS[kind](body, limits)


def _opt_map(body: dict[str, Any], name: str) -> dict[str, Any]:
    v = body.get(name, {})
    if not isinstance(v, dict) or len(v) > 32 or not all(isinstance(x, (int, float, str, bool)) for x in v.values()):
        raise _fail("malformed", f"field {name!r} must be a small map of scalars")
    return v


def _role(body: dict[str, Any]) -> str:
    role = body.get("role", "worker")  # absent: a peer from before roles existed, i.e. a worker
    if role not in HELLO_ROLES:
        raise _fail("malformed", f"field 'role' must be one of {HELLO_ROLES}, got {role!r}")
    return role


def _probe_data(body: dict[str, Any], limits: Limits) -> bytes:
    v = body.get("data")
    if not isinstance(v, (bytes, memoryview)):
        raise _fail("malformed", "field 'data' must be bin")
    if len(v) > limits.max_probe_bytes:
        raise _fail("oversize", f"probe of {len(v)} bytes > limit {limits.max_probe_bytes}")
    return v


def _hparams(body: dict[str, Any]) -> tuple[dict[str, float], ...]:
    v = body.get("hparams", [])  # absent: a worker from before per-step hyper-parameters
    if not isinstance(v, list) or len(v) > MAX_GROUPS:
        raise _fail("hparams", f"field 'hparams' must be a list of <= {MAX_GROUPS} maps")
    return tuple(check_group(g) for g in v)


def _push(body: dict[str, Any], limits: Limits) -> Push:
    grads = _tensors(body, "grads", limits)
    hparams = _hparams(body)
    groups = body.get("groups", {})
    if not isinstance(groups, dict):
        raise _fail("malformed", "field 'groups' must be a map of key -> group index")
    for key, g in groups.items():
        if key not in grads:
            raise _fail("key", f"field 'groups' names {key!r}, which this push does not carry")
        if not isinstance(g, int) or isinstance(g, bool) or not 0 <= g < len(hparams):
            raise _fail("hparams", f"key {key!r}: group {g!r} is not an index into the {len(hparams)} groups of 'hparams'")
    skip = _bool(body, "skip") if "skip" in body else False
    if skip and grads:
        raise _fail("malformed", "a skipped step's PUSH carries no gradients")
    step = _int(body, "step", 0)
    return Push(step, _int(body, "samples", 1, 1 << 30), _int(body, "total_keys", 1, limits.max_keys), grads, hparams, groups, skip)


def _pull_keys(body: dict[str, Any]) -> tuple[str, ...]:
    v = body.get("keys", [])  # absent: a worker from before pipelined pulls, i.e. every key
    if not isinstance(v, list) or len(v) > MAX_PULL_KEYS:
        raise _fail("malformed", f"field 'keys' must be a list of <= {MAX_PULL_KEYS} key names")
    for key in v:
        if not isinstance(key, str) or not _KEY_RE.match(key):
            raise _fail("key", f"bad key name {key!r}: use 1-200 chars of [A-Za-z0-9_.-/#:]")
    if len(set(v)) != len(v):
        raise _fail("malformed", "field 'keys' names a key twice")
    return tuple(v)


def _job_id(body: dict[str, Any]) -> str:
    v = body.get("job_id", "")  # absent: a peer from before job ids
    if not isinstance(v, str) or not JOB_ID_RE.match(v):
        raise _fail("malformed", f"field 'job_id' must be <= 128 chars of [A-Za-z0-9_.-:], got {v!r:.140}")
    return v


def _model(body: dict[str, Any], tensors: dict[str, Payload], limits: Limits) -> dict[str, TensorInfo]:
    """INIT's key -> state_dict map: every key of `tensors` exactly once, each inside its entry."""
    raw = body.get("model", {})
    if not isinstance(raw, dict):
        raise _fail("malformed", "field 'model' must be a map of key -> tensor info")
    if raw and set(raw) != set(tensors):
        raise _fail("key", "field 'model' must describe exactly the keys of 'tensors'")
    out: dict[str, TensorInfo] = {}
    for key, info in raw.items():
        if not isinstance(info, dict) or set(info) != {"n", "s", "d", "o", "b"}:
            raise _fail("malformed", f"model info of {key!r} must be a map with keys n,s,d,o,b")
        name, shape, dtype, offset, buffer = info["n"], info["s"], info["d"], info["o"], info["b"]
        if not isinstance(name, str) or not _KEY_RE.match(name):
            raise _fail("key", f"model info of {key!r}: bad state_dict name {name!r:.210}")
        if not isinstance(shape, list) or len(shape) > limits.max_dims or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < (1 << 40) for d in shape
        ):
            raise _fail("shape", f"model info of {key!r}: shape {shape!r:.100} must be <= {limits.max_dims} non-negative ints")
        if dtype not in STATE_DTYPES or not isinstance(buffer, bool):
            raise _fail("dtype", f"model info of {key!r}: dtype {dtype!r:.40} not one of {STATE_DTYPES}, or 'b' not a bool")
        numel = math.prod(tensors[key].shape)
        if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset <= math.prod(shape) - numel:
            raise _fail("shape", f"model info of {key!r}: {numel} elements at offset {offset!r:.30} do not fit in {shape}")
        out[key] = TensorInfo(name, tuple(shape), dtype, offset, buffer)
    return out


def _init(b: dict[str, Any], lim: Limits) -> Init:
    tensors = _tensors(b, "tensors", lim)
    return Init(tensors, _opt_map(b, "optimizer"), _int(b, "world_size", 1, 1 << 20), _model(b, tensors, lim))


_PARSERS: dict[str, Any] = {
    "hello": lambda b, lim: Hello(
        _str(b, "worker_id", 128), _int(b, "rank", 0, 1 << 20), _bin(b, "client_nonce", 32), _role(b),
        _job_id(b), _bool(b, "resume") if "resume" in b else False,
    ),
    "challenge": lambda b, lim: Challenge(_bin(b, "server_nonce", 32)),
    "auth": lambda b, lim: Auth(_bin(b, "mac", 32)),
    "welcome": lambda b, lim: Welcome(
        _int(b, "version", 0), _bool(b, "initialized"), _int(b, "live_workers", 0),
        _int(b, "staleness", -1, 1 << 20) if "staleness" in b else -1,  # absent: a PS from before async mode
        _job_id(b),
    ),
    "init": _init,
    "push": _push,
    "pull": lambda b, lim: Pull(_int(b, "have_version", -1), _int(b, "wait_for", 0), _pull_keys(b)),
    "params": lambda b, lim: Params(
        _int(b, "version", 0), _bool(b, "full"), _tensors(b, "tensors", lim), _int(b, "base_version", -1)
    ),
    "ack": lambda b, lim: Ack(_int(b, "version", 0)),
    "error": lambda b, lim: Error(_str(b, "code", 64), _str(b, "reason")),
    "bye": lambda b, lim: Bye(_str(b, "reason")),
    "probe": lambda b, lim: Probe(_probe_data(b, lim)),
}
