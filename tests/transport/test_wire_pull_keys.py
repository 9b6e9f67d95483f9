"""PULL's optional `keys` (pipelined pulls): round trip, absence, and refusal of bad key lists."""

from __future__ import annotations

import msgpack
import pytest

from netsense.errors import ProtocolError
from netsense.transport.wire import MAX_PULL_KEYS, Pull, decode_message, encode_message


def _raw(**fields: object) -> bytes:
    return msgpack.packb({"v": 1, "t": "pull", "have_version": 3, "wait_for": 4, **fields}, use_bin_type=True)


def test_keys_round_trip_and_default_to_every_key() -> None:
    msg = Pull(3, 4, ("layer.0.weight", "fc.bias#1"))
    assert decode_message(encode_message(msg)) == msg
    assert decode_message(_raw()) == Pull(3, 4)  # a worker from before pipelined pulls
    assert decode_message(encode_message(Pull(3, 4))).keys == ()


@pytest.mark.parametrize(
    ("keys", "code"),
    [
        ("w", "malformed"),
        ([f"k{i}" for i in range(MAX_PULL_KEYS + 1)], "malformed"),
        (["a", "a"], "malformed"),
        (["bad key"], "key"),
        ([7], "key"),
    ],
)
def test_bad_key_lists_are_refused(keys: object, code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_message(_raw(keys=keys))
    assert info.value.code == code
