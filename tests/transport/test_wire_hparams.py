"""PUSH's per-step fields (hyper-parameters, key groups, skip): optional, bounded, finite, known
names only; a message that breaks them is refused with a code, and an old-style PUSH still parses."""

from __future__ import annotations

import msgpack
import pytest
import torch

from netsense.compression import make_codec
from netsense.errors import ProtocolError
from netsense.transport.hparams import MAX_GROUPS
from netsense.transport.wire import Push, decode_message, encode_message

P = make_codec("fp32").encode(torch.ones(3))
SGD = {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0}


def test_round_trip() -> None:
    msg = Push(2, 4, 2, {"a": P, "b": P}, (SGD, {**SGD, "lr": 0.0}), {"b": 1})
    out = decode_message(encode_message(msg))
    assert isinstance(out, Push) and out.hparams == msg.hparams and out.groups == {"b": 1} and not out.skip
    skip = decode_message(encode_message(Push(2, 4, 2, {}, (SGD,), {}, True)))
    assert isinstance(skip, Push) and skip.skip and skip.grads == {}


def test_a_push_without_the_fields_is_an_old_workers_push() -> None:
    body = {"v": 2, "t": "push", "step": 0, "samples": 1, "total_keys": 1,
            "grads": {"a": {"c": P.codec, "s": list(P.shape), "d": P.dtype, "p": list(P.parts), "m": list(P.meta)}}}  # fmt: skip
    out = decode_message(msgpack.packb(body, use_bin_type=True))
    assert isinstance(out, Push) and out.hparams == () and out.groups == {} and out.skip is False


@pytest.mark.parametrize(
    ("hparams", "groups", "skip", "code"),
    [
        (({"lr": float("nan")},), {}, False, "hparams"),
        (({"lr": float("inf")},), {}, False, "hparams"),
        (({"lr": -1e-3},), {}, False, "hparams"),
        (({"lr": 1e3},), {}, False, "hparams"),
        (({"momentum": 1.0},), {}, False, "hparams"),
        (({"eps": 0.0},), {}, False, "hparams"),
        (({"lr": True},), {}, False, "hparams"),
        (({"lr": "0.1"},), {}, False, "hparams"),
        (({"dampening": 0.1},), {}, False, "hparams"),
        (({"lr": 0.1},) * (MAX_GROUPS + 1), {}, False, "malformed"),  # msgpack's array bound refuses it first
        ((SGD,), {"a": 1}, False, "hparams"),  # group index out of range
        ((SGD, SGD), {"zz": 1}, False, "key"),  # a key this push does not carry
        ((SGD, SGD), {"a": True}, False, "hparams"),
        ((), {}, True, "malformed"),  # a skip with gradients
    ],
)
def test_bad_fields_are_refused(hparams: tuple, groups: dict, skip: bool, code: str) -> None:
    with pytest.raises(ProtocolError) as err:
        decode_message(encode_message(Push(0, 1, 1, {"a": P}, hparams, groups, skip)))
    assert err.value.code == code


def test_a_group_map_that_is_not_a_map_is_refused() -> None:
    body = {"v": 2, "t": "push", "step": 0, "samples": 1, "total_keys": 1, "grads": {}, "hparams": [[0.1]]}
    with pytest.raises(ProtocolError) as err:
        decode_message(msgpack.packb(body, use_bin_type=True))
    assert err.value.code == "hparams"
