"""Wire schema: round trips, and every kind of malformed input becomes a ProtocolError."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netsense.compression import Payload
from netsense.errors import ProtocolError
from netsense.transport.wire import (
    Ack,
    Auth,
    Bye,
    Challenge,
    Error,
    Hello,
    Init,
    Limits,
    Params,
    Pull,
    Push,
    Sum,
    Welcome,
    decode_message,
    encode_message,
)

P = Payload("fp32", (2, 3), "float32", (bytes(24),))
MESSAGES = [
    Hello("w0", 0, bytes(32)),
    Hello("w1", 1, bytes(32), job_id="j", site="site-b.2"),
    Welcome(3, True, 2, job_id="j", site="b"),
    Challenge(bytes(range(32))),
    Auth(bytes(32)),
    Welcome(3, True, 2),
    Init({"a": P}, {"name": "sgd", "lr": 0.1}),
    Push(4, 16, 2, {"a": P, "b/c#0": Payload("qsgd:8", (5,), "float32", (b"x", b"yz"), (1.0, 2.5))}),
    Pull(-1, 0),
    Params(5, False, {"a": P}, base_version=4),
    Push(4, 16, 2, {"a": P}, keeps=True),
    Params(5, False, {"a": P}, base_version=4, gradient=True, sums={"b": Sum((0.25, 0.75), 1, (P,)), "c": Sum((1.0,), -1, (P,))}),
    Push(4, 16, 2, {"a": P}, keeps=True, intent="topk:0.01+fp16"),
    Params(5, False, {"a": P}, base_version=4, gradient=True, intents=("powersgd:2", "qsgd:4")),
    Ack(7),
    Ack(8, delivered_bytes=14_700, delivered_s=0.031),
    Error("shape", "bad"),
    Bye("done"),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(msg: object) -> None:
    assert decode_message(encode_message(msg)) == msg  # type: ignore[arg-type]


def _raw(**fields: object) -> bytes:
    return msgpack.packb({"v": 1, **fields}, use_bin_type=True)


def _payload(**over: object) -> dict[str, object]:
    return {"c": "fp32", "s": [2], "d": "float32", "p": [bytes(8)], "m": [], **over}


def _sums(*, full: bool = False, gradient: bool = True, tensors: dict | None = None, **entry: object) -> bytes:
    """A PARAMS carrying one forwarded key "k" (`Params.sums`), `entry` overriding its fields."""
    body = {"w": [0.5, 0.5], "o": 0, "p": [_payload()], **entry}
    return _raw(t="params", version=1, full=full, tensors=tensors or {}, base_version=0, gradient=gradient, sums={"k": body})


SUMS_BAD = [
    ({"w": [0.5, 0.5, 0.5], "p": [_payload(), _payload()]}, "malformed"),  # more terms than MAX_SUM_TERMS
    ({"w": []}, "malformed"),
    ({"w": [0.5, float("nan")]}, "malformed"),
    ({"w": [0.5, 1.5]}, "malformed"),
    ({"w": [0.5, 0.0]}, "malformed"),
    ({"w": [1, 1]}, "malformed"),  # integers: weights are floats
    ({"o": 2}, "malformed"),
    ({"o": True}, "malformed"),
    ({"o": -1}, "malformed"),  # then both pushes must come
    ({"p": [_payload(), _payload()]}, "malformed"),
    ({"o": -1, "p": [_payload(), _payload(s=[3])]}, "shape"),
    ({"p": [_payload(d="int64")]}, "dtype"),
    ({"x": 1}, "malformed"),
    ({"full": True}, "malformed"),  # only a gradient-domain delta carries sums
    ({"gradient": False}, "malformed"),
    ({"tensors": {"k": _payload()}}, "malformed"),  # a key as a payload and as a sum
]


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (encode_message(MESSAGES[6])[:-3], "malformed"),  # truncated
        (b"\xc1", "malformed"),  # msgpack's never-used byte
        (msgpack.packb([1, 2]), "malformed"),
        (msgpack.packb({"v": 3, "t": "ack", "version": 1}), "version"),
        (msgpack.packb({"v": True, "t": "ack", "version": 1}), "version"),
        (msgpack.packb({"t": "ack", "version": 1}), "version"),
        (_raw(t="nope"), "type"),
        (_raw(t="ack", version="x"), "malformed"),
        (_raw(t="ack", version=1, delivered_bytes=-1, delivered_s=0.1), "malformed"),
        (_raw(t="ack", version=1, delivered_bytes=1 << 40, delivered_s=0.1), "malformed"),
        (_raw(t="ack", version=1, delivered_bytes=10, delivered_s=float("nan")), "malformed"),
        (_raw(t="ack", version=1, delivered_bytes=10, delivered_s=-0.5), "malformed"),
        (_raw(t="ack", version=1, delivered_bytes=10, delivered_s=1e9), "malformed"),
        (_raw(t="ack", version=1, delivered_bytes=10, delivered_s=True), "malformed"),
        (_raw(t="ack", version=1, delivered_bytes=10, delivered_s="1"), "malformed"),
        (_raw(t="hello", worker_id="w", rank=0, client_nonce=b"short"), "malformed"),
        (_raw(t="hello", worker_id="w", rank=0, client_nonce=bytes(32), site="a b"), "malformed"),
        (_raw(t="hello", worker_id="w", rank=0, client_nonce=bytes(32), site="x" * 33), "malformed"),
        (_raw(t="hello", worker_id="w", rank=0, client_nonce=bytes(32), site=7), "malformed"),
        (_raw(t="welcome", version=0, initialized=True, live_workers=0, site="a/b"), "malformed"),
        (_raw(t="push", step=0, samples=1, total_keys=1, grads={"a": _payload(d="int64")}), "dtype"),
        (_raw(t="push", step=0, samples=1, total_keys=1, grads={"a": _payload(s=[-1])}), "shape"),
        (_raw(t="push", step=0, samples=1, total_keys=1, grads={"a": _payload(s=[1 << 20, 1 << 20])}), "oversize"),
        (_raw(t="push", step=0, samples=1, total_keys=1, grads={"a b": _payload()}), "key"),
        (_raw(t="push", step=0, samples=1, total_keys=1, grads={"a": _payload(p="notalist")}), "malformed"),
        (_raw(t="push", step=0, samples=0, total_keys=1, grads={"a": _payload()}), "malformed"),
        (_raw(t="push", step=0, samples=1, total_keys=1, grads={"a": {"c": "fp32"}}), "malformed"),
        (_raw(t="push", step=0, samples=1, total_keys=1, grads={}, keeps=1), "malformed"),
        *[(_sums(**bad), code) for bad, code in SUMS_BAD],
        (_raw(t="push", step=0, samples=1, total_keys=1, grads={}, intent=""), "malformed"),
        (_raw(t="push", step=0, samples=1, total_keys=1, grads={}, intent="x" * 65), "malformed"),
        (_raw(t="push", step=0, samples=1, total_keys=1, grads={}, intent="qsgd 4"), "malformed"),
        (_raw(t="push", step=0, samples=1, total_keys=1, grads={}, intent=4), "malformed"),
        (_raw(t="params", version=1, full=False, tensors={}, base_version=0, gradient=True, intents="fp16"), "malformed"),
        (_raw(t="params", version=1, full=False, tensors={}, base_version=0, gradient=True, intents=["fp16"] * 17), "malformed"),
        (_raw(t="params", version=1, full=False, tensors={}, base_version=0, gradient=True, intents=["fp16", None]), "malformed"),
        (_raw(t="params", version=1, full=False, tensors={}, base_version=0, intents=["fp16"]), "malformed"),  # not gradient
        (_raw(t="params", version=1, full=True, tensors={}, base_version=0, gradient=True, intents=["fp16"]), "malformed"),
    ],
)
def test_malformed_messages_raise_protocol_error(data: bytes, code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_message(data)
    assert info.value.code == code
    assert info.value.reason  # a clear reason, never empty


def test_hello_without_a_site_is_the_bytes_of_a_peer_from_before_sites() -> None:
    assert b"site" not in encode_message(Hello("w0", 0, bytes(32)))
    assert b"site" not in encode_message(Welcome(0, True, 0))  # nor a PS's that says none
    assert decode_message(_raw(t="welcome", version=0, initialized=True, live_workers=0)).site == ""  # type: ignore[attr-defined]
    assert decode_message(_raw(t="hello", worker_id="w", rank=0, client_nonce=bytes(32))).site == ""  # type: ignore[attr-defined]


def test_oversize_message_refused_before_parsing() -> None:
    with pytest.raises(ProtocolError, match="oversize"):
        decode_message(bytes(1025), Limits(max_message_bytes=1024))


def test_too_many_keys_refused() -> None:
    grads = {f"k{i}": _payload() for i in range(10)}
    with pytest.raises(ProtocolError) as info:
        decode_message(_raw(t="push", step=0, samples=1, total_keys=1, grads=grads), Limits(max_keys=4))
    assert info.value.code in ("oversize", "malformed")


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_never_crash(data: bytes) -> None:
    try:
        decode_message(data)
    except ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_valid_messages_never_crash(data: st.DataObject) -> None:
    raw = bytearray(encode_message(data.draw(st.sampled_from(MESSAGES))))
    for _ in range(data.draw(st.integers(1, 8))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        decode_message(bytes(raw))
    except ProtocolError:
        pass


def test_params_filler_is_optional_bounded_and_round_trips() -> None:
    """`Params.pad` (a padded downlink probe): absent when empty, so such a PARAMS is byte-identical
    to one from before the field; a framed section when large; bounded like a PROBE's data."""
    plain = Params(5, False, {"a": P}, base_version=4)
    assert b"pad" not in encode_message(plain)
    padded = Params(5, False, {"a": P}, base_version=4, pad=bytes(200_000))
    back = decode_message(encode_message(padded))
    assert isinstance(back, Params) and len(back.pad) == 200_000 and back.tensors == plain.tensors
    with pytest.raises(ProtocolError, match="pad of 200000 bytes") as info:
        decode_message(encode_message(padded), Limits(max_probe_bytes=100_000))
    assert info.value.code == "oversize"
    bad = _raw(t="params", version=5, full=False, tensors={}, base_version=4, pad="text")
    with pytest.raises(ProtocolError, match="'pad' must be bin"):
        decode_message(bad)


def test_an_ack_without_a_delivery_is_the_bytes_of_a_peer_from_before_reports() -> None:
    """`Ack.delivered_*` (the update's return): left out at 0, and a PS that never sends them is read as 0."""
    assert b"delivered" not in encode_message(Ack(3))
    back = decode_message(_raw(t="ack", version=3))
    assert isinstance(back, Ack) and (back.delivered_bytes, back.delivered_s) == (0, 0.0)


def test_intents_are_left_out_when_none_and_the_ps_keeps_whose_they_are() -> None:
    """`Push.intent` and `Params.intents` (docs/PROTOCOL.md): absent at their defaults, so a worker
    or PS that says none sends an older peer's bytes; `intent_owners` never leaves the PS, and each
    recipient is sent the others' intents alone."""
    assert b"intent" not in encode_message(Push(4, 16, 2, {"a": P}, keeps=True))
    update = Params(5, False, {"a": P}, base_version=4, gradient=True, intents=("fp16", "qsgd:4"), intent_owners=("w0", "w1"))
    assert b"w1" not in encode_message(update)
    for worker, others in (("w0", ("qsgd:4",)), ("w1", ("fp16",)), ("w2", ("fp16", "qsgd:4"))):
        sent = decode_message(encode_message(update.for_recipient(worker)))
        assert isinstance(sent, Params) and sent.intents == others and sent.intent_owners == ()
    back = decode_message(_raw(t="push", step=0, samples=1, total_keys=1, grads={}))
    assert isinstance(back, Push) and back.intent == ""
