"""ParameterStore in async mode (SSP): pushes apply on arrival, clocks bound how far a worker runs ahead."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from netsense.compression import make_codec
from netsense.errors import ProtocolError
from storehelp import ssp_store as _store, push_ssp as _push

FP32 = make_codec("fp32")


def test_a_complete_push_applies_alone_weighted_by_its_own_batch() -> None:
    store = _store(2)
    assert _push(store, "fast", 0, ("w",), samples=3) is None  # incomplete: nothing applies
    result = _push(store, "fast", 0, ("b",), samples=3)
    assert result is not None and (result.version, result.workers, result.samples, result.staleness) == (1, ("fast",), 3, 0)
    torch.testing.assert_close(store.params["w"], torch.full((2, 3), 0.9))  # lr 0.1 * the worker's own mean gradient
    assert store.clocks == {"fast": 1, "slow": 0}


def test_staleness_is_versions_applied_since_the_gradient_was_computed() -> None:
    store = _store(5)
    _push(store, "fast", 0)
    _push(store, "fast", 1)
    result = _push(store, "slow", 0)  # computed on version 0, two updates ago
    assert result is not None and result.staleness == 2 and result.version == 3
    assert store.max_staleness == 2


def test_a_push_from_the_future_or_with_a_changing_step_is_refused() -> None:
    store = _store(1)
    with pytest.raises(ProtocolError) as exc:
        _push(store, "fast", 1)
    assert exc.value.code == "stale"
    _push(store, "fast", 0)
    _push(store, "slow", 0, ("w",))
    with pytest.raises(ProtocolError):
        _push(store, "slow", 1, ("b",))  # the rest of a step must name the same version
    assert store.version == 1


def test_may_proceed_is_the_ssp_rule() -> None:
    store = _store(1)
    _push(store, "fast", 0)
    assert store.may_proceed("fast") and not store.blocked  # 1 ahead, s = 1
    _push(store, "fast", 1)
    assert not store.may_proceed("fast") and store.may_proceed("slow") and store.blocked
    _push(store, "slow", 0)
    assert store.may_proceed("fast")


def test_a_newcomer_starts_at_the_slowest_clock_and_a_leaver_stops_holding_back() -> None:
    store = _store(0)
    for step in range(3):
        _push(store, "fast", store.version)
        _push(store, "slow", store.version)
    store.join("late")
    assert store.clocks["late"] == 3 and store.may_proceed("fast")
    _push(store, "fast", store.version)
    assert not store.may_proceed("fast")
    store.leave("slow")
    store.leave("late")
    assert store.may_proceed("fast")


def test_timeout_drops_the_slowest_only_when_they_block_someone() -> None:
    store = _store(1)
    assert store.drop_incomplete() == ([], None)
    _push(store, "fast", 0)
    _push(store, "fast", 1)
    dropped, result = store.drop_incomplete()
    assert dropped == ["slow"] and result is None and store.live == {"fast"} and store.may_proceed("fast")
    _push(store, "slow", 0)  # a dropped worker re-enters with its next push, at the slowest live clock
    assert "slow" in store.live and store.clocks["slow"] == 3


@settings(max_examples=200, deadline=None)
@given(
    staleness=st.integers(0, 3),
    speeds=st.lists(st.integers(1, 4), min_size=2, max_size=4),
    schedule=st.lists(st.integers(0, 3), min_size=1, max_size=80),
)
def test_no_worker_runs_more_than_s_versions_ahead(staleness: int, speeds: list[int], schedule: list[int]) -> None:
    """Workers of different speeds in any interleaving: a worker starts a step (pulls) only when
    `may_proceed`; then no worker's clock ever exceeds the slowest live one's by more than s + 1
    (s ahead when it starts the step, +1 for the push that completes it), and at every start
    the SSP rule c - min <= s holds."""
    names = [f"w{i}" for i in range(len(speeds))]
    store = _store(staleness, tuple(names))
    have = {w: 0 for w in names}  # version each worker computed its current gradient on
    # One tick of the schedule picks a worker; a worker of speed k needs k ticks per gradient.
    work = {w: 0 for w in names}
    for pick in schedule:
        w = names[pick % len(names)]
        work[w] += 1
        if work[w] < speeds[pick % len(speeds)]:
            continue
        work[w] = 0
        # Two buckets: a partial push never applies.
        assert _push(store, w, have[w], ("w",), value=0.01) is None
        result = _push(store, w, have[w], ("b",), value=0.01)
        assert result is not None and result.staleness == store.version - 1 - have[w]
        clocks = [store.clocks[x] for x in store.live]
        assert max(clocks) - min(clocks) <= staleness + 1
        if store.may_proceed(w):  # the pull returns: the next gradient is on the current version
            assert store.clocks[w] - store.min_live_clock <= staleness
            have[w] = store.version
        else:  # held at the pull until the slowest catch up: it computes nothing meanwhile
            work[w] = -(10**9)
        for x in names:  # a held worker resumes once the rule allows it
            if work[x] < 0 and store.may_proceed(x):
                work[x], have[x] = 0, store.version
    assert store.applied_steps == sum(store.clocks.values())
