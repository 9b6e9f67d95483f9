"""ParameterStore's sync barrier: a step applies when every live worker pushed every key, a leaver's
partial push is discarded, the timeout drops the incomplete, the first step waits for the job."""

from __future__ import annotations

import torch

from netsense.compression import make_codec
from netsense.ps.store import ParameterStore
from storehelp import push_grads as _push, store  # noqa: F401 (a fixture)

FP32 = make_codec("fp32")


def test_applies_only_when_every_live_worker_pushed_every_key(store: ParameterStore) -> None:
    g = {"w": torch.ones(2, 3), "b": torch.ones(3)}
    assert _push(store, "a", 0, g) is None
    assert _push(store, "b", 0, {"w": g["w"]}) is None
    result = _push(store, "b", 0, {"b": g["b"]})
    assert result is not None and result.version == 1 and result.workers == ("a", "b")
    assert store.version == 1


def test_leave_discards_partial_step_and_completes_barrier(store: ParameterStore) -> None:
    g = {"w": torch.ones(2, 3), "b": torch.ones(3)}
    _push(store, "b", 0, {"w": g["w"]})  # b half done
    _push(store, "a", 0, g)
    result = store.leave("b")
    assert result is not None and result.workers == ("a",)
    torch.testing.assert_close(store.params["b"], torch.full((3,), -0.1))  # a's gradient only


def test_barrier_timeout_drops_only_incomplete_workers(store: ParameterStore) -> None:
    assert store.drop_incomplete() == ([], None)  # nobody finished: nothing to drop yet
    _push(store, "a", 0, {"w": torch.ones(2, 3), "b": torch.ones(3)})
    dropped, result = store.drop_incomplete()
    assert dropped == ["b"] and result is not None and result.version == 1
    # b rejoins by pushing the current step
    _push(store, "b", 1, {"w": torch.ones(2, 3), "b": torch.ones(3)})
    assert "b" in store.live


def test_first_step_waits_for_the_whole_job_until_the_timeout() -> None:
    s = ParameterStore()
    s.initialize({"b": FP32.encode(torch.zeros(3))}, {"name": "sgd", "lr": 0.1}, world_size=2)
    s.join("a")
    assert _push(s, "a", 0, {"b": torch.ones(3)}) is None  # b has not even connected yet
    s.join("b")
    result = _push(s, "b", 0, {"b": torch.ones(3)})
    assert result is not None and result.workers == ("a", "b")
    # a second job where b never comes: the barrier timeout lets a go alone
    s2 = ParameterStore()
    s2.initialize({"b": FP32.encode(torch.zeros(3))}, {"name": "sgd", "lr": 0.1}, world_size=2)
    s2.join("a")
    _push(s2, "a", 0, {"b": torch.ones(3)})
    dropped, result = s2.drop_incomplete()
    assert dropped == [] and result is not None and result.workers == ("a",)


def test_the_first_step_after_every_worker_left_waits_for_the_last_steps_workers() -> None:
    # A whole-job restart against a running PS: the first worker back must not step alone (its
    # peers' first pushes would then come a version late, with the schedule's step before).
    s = ParameterStore()
    s.initialize({"b": FP32.encode(torch.zeros(3))}, {"name": "sgd", "lr": 0.1}, world_size=2)
    ones = {"b": torch.ones(3)}

    def both_step(version: int) -> None:
        for w in ("a", "b"):
            s.join(w)
            _push(s, w, version, ones)
        assert s.version == version + 1

    both_step(0)
    s.leave("a")
    s.leave("b")
    s.join("a")
    assert _push(s, "a", 1, ones) is None  # back first: waits for the job
    s.join("b")
    result = _push(s, "b", 1, ones)
    assert result is not None and result.workers == ("a", "b") and s.version == 2
    s.leave("a")
    s.leave("b")
    s.join("a")
    _push(s, "a", 2, ones)
    dropped, result = s.drop_incomplete()  # b never comes back: the barrier timeout lets a go alone
    assert dropped == [] and result is not None and result.workers == ("a",)
    s.leave("a")  # a job down to one worker: that one's reconnect goes on at once
    s.join("a")
    result = _push(s, "a", 3, ones)
    assert result is not None and result.workers == ("a",)
    s.join("b")  # one leaving is no restart: the others go on without it
    both_step(4)
    s.leave("a")
    assert _push(s, "b", 5, ones) is not None
