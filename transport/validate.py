"""Field checks and per-type parsers behind `decode_message`: every size, dtype, shape, index and
count of a peer's message is bounded here before anything uses it.

Each check raises `ProtocolError(code, reason)` naming the field and the value; `wire` calls
`PARSERS[type](body, limits)` on a msgpack map it has already unpacked within `Limits`.
"""

from __future__ import annotations

import math
import re
from typing import Any

from netsense.compression import DTYPES, Payload
from netsense.errors import ProtocolError

from .hparams import MAX_GROUPS, check_group
from .messages import (
    HELLO_ROLES, INTENT_RE, JOB_ID_RE, MAX_INTENTS, MAX_PULL_KEYS, MAX_SUM_TERMS, SITE_RE, STATE_DTYPES, Ack, Auth, Bye, Challenge, Error, Hello, Init,
    Limits, Params, Probe, Pull, Push, Sum, TensorInfo, Welcome,
)

_KEY_RE = re.compile(r"^[A-Za-z0-9_.\-/#:]{1,200}$")


def _fail(code: str, reason: str) -> ProtocolError:
    return ProtocolError(code, reason)


def _int(body: dict[str, Any], name: str, lo: int = -1, hi: int = 1 << 62) -> int:
    v = body.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise _fail("malformed", f"field {name!r} must be an int in [{lo}, {hi}], got {v!r}")
    return v


MAX_REPORTED_S = 3600.0
"""The longest duration a peer may report (`_seconds`)."""


def _seconds(body: dict[str, Any], name: str) -> float:
    v = body.get(name)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not (math.isfinite(v) and 0 <= v <= MAX_REPORTED_S):
        raise _fail("malformed", f"field {name!r} must be seconds in [0, {MAX_REPORTED_S:g}], got {v!r}")
    return float(v)


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


def _sums(body: dict[str, Any], limits: Limits) -> dict[str, Sum]:
    """`Params.sums`: per key, weights in (0, 1], the recipient's index among them or -1, and one
    payload of one shape per other weight."""
    raw = body.get("sums", {})  # absent: a PS that sends no forwarded pushes
    if not isinstance(raw, dict) or len(raw) > limits.max_keys:
        raise _fail("malformed", f"field 'sums' must be a map of <= {limits.max_keys} keys")
    out: dict[str, Sum] = {}
    for key, v in raw.items():
        if not isinstance(key, str) or not _KEY_RE.match(key):
            raise _fail("key", f"bad key name {key!r}: use 1-200 chars of [A-Za-z0-9_.-/#:]")
        if not isinstance(v, dict) or set(v) != {"w", "o", "p"}:
            raise _fail("malformed", f"sum {key!r}: must be a map with keys w,o,p")
        weights, own, pushes = v["w"], v["o"], v["p"]
        if not isinstance(weights, list) or not 1 <= len(weights) <= MAX_SUM_TERMS or not all(
            isinstance(w, float) and math.isfinite(w) and 0 < w <= 1 for w in weights
        ):
            raise _fail("malformed", f"sum {key!r}: weights must be 1-{MAX_SUM_TERMS} floats in (0, 1]")
        if not isinstance(own, int) or isinstance(own, bool) or not -1 <= own < len(weights):
            raise _fail("malformed", f"sum {key!r}: own index {own!r} is not -1 or an index into its {len(weights)} weights")
        others = len(weights) - (own >= 0)
        if not isinstance(pushes, list) or len(pushes) != others:
            got = len(pushes) if isinstance(pushes, list) else f"{pushes!r:.40}"
            raise _fail("malformed", f"sum {key!r}: {others} pushes expected, got {got}")
        payloads = tuple(_payload(key, p, limits) for p in pushes)
        if len({p.shape for p in payloads}) > 1:
            raise _fail("shape", f"sum {key!r}: its pushes differ in shape")
        out[key] = Sum(tuple(weights), own, payloads)
    return out


def _opt_map(body: dict[str, Any], name: str) -> dict[str, Any]:
    v = body.get(name, {})
    if not isinstance(v, dict) or len(v) > 32 or not all(isinstance(x, (int, float, str, bool)) for x in v.values()):
        raise _fail("malformed", f"field {name!r} must be a small map of scalars")
    return v


def _site(body: dict[str, Any]) -> str:
    v = body.get("site", "")  # absent: a peer that does not say (or from before sites)
    if not isinstance(v, str) or (v and not SITE_RE.fullmatch(v)):
        raise _fail("malformed", f"field 'site' must be empty or 1-32 chars of [A-Za-z0-9_.-], got {v!r:.40}")
    return v


def _role(body: dict[str, Any]) -> str:
    role = body.get("role", "worker")  # absent: a peer from before roles existed, i.e. a worker
    if role not in HELLO_ROLES:
        raise _fail("malformed", f"field 'role' must be one of {HELLO_ROLES}, got {role!r}")
    return role


def _filler(v: Any, name: str, what: str, limits: Limits) -> bytes:
    """Bytes the receiver drops (a PROBE's data, a PARAMS's pad), bounded by `max_probe_bytes`."""
    if not isinstance(v, (bytes, memoryview)):
        raise _fail("malformed", f"field {name!r} must be bin")
    if len(v) > limits.max_probe_bytes:
        raise _fail("oversize", f"{what} of {len(v)} bytes > limit {limits.max_probe_bytes}")
    return v


def _probe_data(body: dict[str, Any], limits: Limits) -> bytes:
    return _filler(body.get("data"), "data", "probe", limits)


def _pad(body: dict[str, Any], limits: Limits) -> bytes:
    return _filler(body.get("pad", b""), "pad", "pad", limits)  # a PARAMS without filler leaves it out


def _hparams(body: dict[str, Any]) -> tuple[dict[str, float], ...]:
    v = body.get("hparams", [])  # absent: a worker from before per-step hyper-parameters
    if not isinstance(v, list) or len(v) > MAX_GROUPS:
        raise _fail("hparams", f"field 'hparams' must be a list of <= {MAX_GROUPS} maps")
    return tuple(check_group(g) for g in v)


def _intent(raw: Any, name: str) -> str:
    if not isinstance(raw, str) or not INTENT_RE.match(raw):
        raise _fail("malformed", f"field {name!r} must be a codec spec of 1-64 chars of [A-Za-z0-9_.:+-], got {raw!r:.80}")
    return raw


def _intents(body: dict[str, Any]) -> tuple[str, ...]:
    v = body.get("intents", [])  # absent: none known, or a PS from before intents
    if not isinstance(v, list) or len(v) > MAX_INTENTS:
        raise _fail("malformed", f"field 'intents' must be a list of <= {MAX_INTENTS} codec specs")
    if v and not (body.get("gradient") is True and body.get("full") is False):
        raise _fail("malformed", "only a gradient-domain update (not full) carries intents")
    return tuple(_intent(i, "intents") for i in v)


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
    keeps = _bool(body, "keeps") if "keeps" in body else False  # absent: a relay or an older worker
    samples, total = _int(body, "samples", 1, 1 << 30), _int(body, "total_keys", 1, limits.max_keys)
    intent = _intent(body["intent"], "intent") if "intent" in body else ""  # absent: no such policy, or an older worker
    return Push(step, samples, total, grads, hparams, groups, skip, keeps, intent)


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


def _params_sums(body: dict[str, Any], limits: Limits) -> dict[str, Sum]:
    sums = _sums(body, limits)
    if sums and not (body.get("gradient") is True and body.get("full") is False):
        raise _fail("malformed", "only a gradient-domain update (not full) carries sums")
    if set(sums) & set(body.get("tensors", {})):
        raise _fail("malformed", "a key comes as a payload and as a sum")
    return sums


PARSERS: dict[str, Any] = {
    "hello": lambda b, lim: Hello(
        _str(b, "worker_id", 128), _int(b, "rank", 0, 1 << 20), _bin(b, "client_nonce", 32), _role(b),
        _job_id(b), _bool(b, "resume") if "resume" in b else False, _site(b),
    ),
    "challenge": lambda b, lim: Challenge(_bin(b, "server_nonce", 32)),
    "auth": lambda b, lim: Auth(_bin(b, "mac", 32)),
    "welcome": lambda b, lim: Welcome(
        _int(b, "version", 0), _bool(b, "initialized"), _int(b, "live_workers", 0),
        _int(b, "staleness", -1, 1 << 20) if "staleness" in b else -1,  # absent: a PS from before async mode
        _job_id(b), _site(b),
    ),
    "init": _init,
    "push": _push,
    "pull": lambda b, lim: Pull(_int(b, "have_version", -1), _int(b, "wait_for", 0), _pull_keys(b)),
    "params": lambda b, lim: Params(
        _int(b, "version", 0), _bool(b, "full"), _tensors(b, "tensors", lim), _int(b, "base_version", -1),
        _pad(b, lim), _bool(b, "gradient") if "gradient" in b else False,  # absent: a parameter-domain PS
        _opt_map(b, "optimizer"), _tensors(b, "optim_state", lim) if "optim_state" in b else {}, _params_sums(b, lim), _intents(b),
    ),
    "ack": lambda b, lim: Ack(
        _int(b, "version", 0), _int(b, "delivered_bytes", 0, lim.max_message_bytes) if "delivered_bytes" in b else 0,
        _seconds(b, "delivered_s") if "delivered_s" in b else 0.0,  # absent: a PS from before delivery reports
    ),
    "error": lambda b, lim: Error(_str(b, "code", 64), _str(b, "reason")),
    "bye": lambda b, lim: Bye(_str(b, "reason")),
    "probe": lambda b, lim: Probe(_probe_data(b, lim)),
}
