"""merge_parts: the keyed replies of a pipelined step become the step's update, or None (resync)."""

from __future__ import annotations

import torch

from netsense.compression import make_codec
from netsense.transport.wire import Params
from netsense.worker.overlap import merge_parts

P = make_codec("fp16").encode(torch.ones(3))


def test_deltas_of_every_key_merge_into_one_update_in_layout_order() -> None:
    parts = [Params(5, False, {"b": P}, base_version=4), Params(5, False, {"a": P, "c": P}, base_version=4)]
    merged = merge_parts(parts, ["a", "b", "c"], 4)
    assert merged == Params(5, False, {"a": P, "b": P, "c": P}, base_version=4)
    assert list(merged.tensors) == ["a", "b", "c"]
    assert merge_parts([Params(5, True, {"a": P}), Params(5, True, {"b": P})], ["a", "b"], 4) == Params(5, True, {"a": P, "b": P})


def test_replies_that_are_not_one_update_from_the_step_ask_for_a_resync() -> None:
    ok = Params(5, False, {"a": P}, base_version=4)
    assert merge_parts([], ["a"], 4) is None
    assert merge_parts([ok], ["a", "b"], 4) is None  # a key missing
    assert merge_parts([ok, Params(6, False, {"b": P}, base_version=5)], ["a", "b"], 4) is None  # the PS moved on
    assert merge_parts([ok, Params(5, True, {"b": P})], ["a", "b"], 4) is None  # mixed full and delta
    assert merge_parts([Params(5, False, {"a": P}, base_version=3)], ["a"], 4) is None  # a delta from elsewhere
