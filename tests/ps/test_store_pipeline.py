"""ParameterStore pipelined steps: keys applied ahead of the version for keyed pulls, with results
bit for bit those of the whole step, and the membership rules of a step that is partly applied."""

from __future__ import annotations

import pytest
import torch

from netsense.compression import make_codec
from netsense.ps.store import ParameterStore
from netsense.transport.wire import Params
from storehelp import two_worker_store as _store, step_grads as _grads, push_keys as _push

FP32 = make_codec("fp32")
KEYS = ("a", "b", "c")


def _decode(p: Params) -> dict[str, torch.Tensor]:
    return {k: make_codec(v.codec).decode(v) for k, v in p.tensors.items()}


def _run(downlink: str, optimizer: dict, pipelined: bool) -> tuple[ParameterStore, list[Params], list[Params]]:
    """Three steps of two workers; pipelined: keyed pulls want every key and the pushes come in
    pieces, so keys are applied ahead. Returns the store, each step's update and the early parts."""
    s = _store(downlink, optimizer)
    torch.manual_seed(1)  # stochastic downlink codecs draw from the global generator, in key order
    updates, early = [], []
    for step in range(3):
        g0, g1 = _grads(step, 0), _grads(step, 1)
        if not pipelined:
            _push(s, "w0", step, g0, KEYS, 3)
            _push(s, "w1", step, g1, KEYS, 5)
            updates.append(s.pull(step))
            continue
        assert s.want(["a"], step) == 0  # nobody pushed yet
        _push(s, "w0", step, g0, ("a", "b"), 3)
        assert s.applied_keys == 0  # w1 has not pushed "a"
        _push(s, "w1", step, g1, ("a",), 5)
        assert s.applied_keys == 1 and s.version == step  # "a" applied ahead, the version waits
        assert s.keys_ready(["a"], step + 1) and not s.keys_ready(["a", "b"], step + 1)
        early.append(s.pull_keys(step, ["a"]))
        assert early[-1].version == step + 1 and set(early[-1].tensors) == {"a"}
        whole_before = s.pull(-1)  # a full pull mid-step is still the previous version, whole
        assert whole_before.version == step
        for k, v in _decode(whole_before).items():
            assert torch.equal(v, s.shadow[k])
        _push(s, "w0", step, g0, ("c",), 3)
        result = _push(s, "w1", step, g1, ("b", "c"), 5)
        assert result is not None and result.version == step + 1 and result.samples == 8
        assert s.applied_keys == 0
        updates.append(s.pull(step))
    return s, updates, early


@pytest.mark.parametrize("downlink", ["fp16", "fp32", "qsgd:4"])
@pytest.mark.parametrize("optimizer", [{"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}, {"name": "adam", "lr": 0.01}])
def test_keys_applied_ahead_give_the_whole_steps_update(downlink: str, optimizer: dict) -> None:
    plain, reference, _ = _run(downlink, optimizer, pipelined=False)
    piped, updates, early = _run(downlink, optimizer, pipelined=True)
    for update, ref, part in zip(updates, reference, early):
        assert (update.version, update.full, update.base_version) == (ref.version, ref.full, ref.base_version)
        for k in KEYS:
            assert update.tensors[k] == ref.tensors[k]  # the same bytes down
        assert part.tensors["a"] == ref.tensors["a"]
    for k in KEYS:
        assert torch.equal(piped.params[k], plain.params[k]) and torch.equal(piped.shadow[k], plain.shadow[k])


def test_only_wanted_keys_go_ahead_and_plain_pushes_are_unchanged() -> None:
    s = _store()
    g0, g1 = _grads(0, 0), _grads(0, 1)
    _push(s, "w0", 0, g0, KEYS)
    _push(s, "w1", 0, g1, ("a", "b"))
    assert s.applied_keys == 0  # no keyed pull: the step applies whole, as before
    s.want(["b"], 0)
    assert s.applied_keys == 1 and s.pull_keys(0, ["b"]).version == 1
    assert _push(s, "w1", 0, g1, ("c",)) is not None and s.version == 1


def test_a_worker_joining_mid_step_sits_it_out() -> None:
    s = _store()
    g0, g1 = _grads(0, 0), _grads(0, 1)
    s.want(KEYS, 0)
    _push(s, "w0", 0, g0, ("a",))
    _push(s, "w1", 0, g1, ("a",))
    assert s.applied_keys == 1
    s.join("late")
    assert _push(s, "late", 0, _grads(0, 2), KEYS) is None  # ignored, not an error
    _push(s, "w0", 0, g0, ("b", "c"))
    result = _push(s, "w1", 0, g1, ("b", "c"))
    assert result is not None and result.workers == ("w0", "w1")
    assert "late" in s.live and s.pull_keys(0, ["a"]).base_version == 0  # its pull gets the step's update


def test_a_member_that_rejoins_repushes_and_the_step_stays_exact() -> None:
    plain, s = _store(), _store()
    g0, g1 = _grads(0, 0), _grads(0, 1)
    for w, g in (("w0", g0), ("w1", g1)):
        _push(plain, w, 0, g, KEYS)
    s.want(KEYS, 0)
    _push(s, "w0", 0, g0, ("a", "b"))
    _push(s, "w1", 0, g1, ("a",))
    s.join("w1")  # reconnected: it redoes the step from its start
    _push(s, "w1", 0, g1, KEYS)  # "a" again is skipped, not a duplicate
    assert _push(s, "w0", 0, g0, ("c",)) is not None
    for k in KEYS:
        assert torch.equal(s.params[k], plain.params[k])


def test_a_member_that_leaves_is_left_out_of_the_rest() -> None:
    s = _store()
    g0, g1 = _grads(0, 0), _grads(0, 1)
    s.want(KEYS, 0)
    _push(s, "w0", 0, g0, KEYS)
    _push(s, "w1", 0, g1, ("a",))
    assert s.applied_keys == 1
    before = {k: s.params[k].clone() for k in ("b", "c")}
    assert s.leave("w1") is not None and s.version == 1  # w0 had pushed every key: the step completes
    for k in ("b", "c"):  # w0's gradient alone: lr 0.1, first momentum step
        torch.testing.assert_close(s.params[k], before[k] - 0.1 * g0[k])


def test_the_barrier_timeout_drops_an_incomplete_member() -> None:
    s = _store()
    g0, g1 = _grads(0, 0), _grads(0, 1)
    s.want(KEYS, 0)
    _push(s, "w0", 0, g0, KEYS)
    _push(s, "w1", 0, g1, ("a",))
    dropped, result = s.drop_incomplete()
    assert dropped == ["w1"] and result is not None and result.version == 1 and result.workers == ("w0",)


def test_a_pull_for_an_old_step_gets_its_keys_of_the_last_update_or_everything() -> None:
    s = _store()
    for w, i in (("w0", 0), ("w1", 1)):
        _push(s, w, 0, _grads(0, i), KEYS)
    assert s.want(["a"], 0) == 0  # step 0 is done: nothing to apply
    part = s.pull_keys(0, ["a"])
    assert (part.version, part.base_version, set(part.tensors)) == (1, 0, {"a"})
    fallback = s.pull_keys(-1, ["a"])  # no delta from there: the full parameters
    assert fallback.full and set(fallback.tensors) == set(KEYS)


def _arrival(order: tuple[str, str], pipelined: bool) -> ParameterStore:
    """Two steps with the workers' pushes arriving in `order` (plain or pipelined)."""
    s = _store("fp32", {"name": "sgd", "lr": 0.1, "momentum": 0.9})
    samples = {"w0": 3, "w1": 5}
    for step in range(2):
        grads = {w: _grads(step, int(w[1])) for w in order}
        if pipelined:
            s.want(list(KEYS), step)
        for w in order:
            _push(s, w, step, grads[w], KEYS, samples[w])
        assert s.version == step + 1
    return s


@pytest.mark.parametrize("pipelined", [False, True], ids=["plain", "pipelined"])
def test_the_update_does_not_depend_on_which_worker_pushed_first(pipelined: bool) -> None:
    """The weighted sum runs in one fixed worker order (fp32 addition with weights is not
    commutative bit for bit), so two runs whose pushes race to the PS end with the same bits, and a
    pipelined step equals the plain one whatever the arrival order (tests/e2e/test_overlap_exact.py)."""
    first, second = _arrival(("w0", "w1"), pipelined), _arrival(("w1", "w0"), pipelined)
    plain = _arrival(("w1", "w0"), not pipelined)
    for k in KEYS:
        assert torch.equal(first.params[k], second.params[k]), k
        assert torch.equal(first.params[k], plain.params[k]), k


def test_a_deferred_downlink_choice_is_made_on_the_whole_update() -> None:
    """A choice deferred to the update (`ParameterStore.defer_downlink`, the downlink's update 0)
    keeps keyed pulls from applying keys ahead: the chooser is asked once, with every key's new
    value, the update goes out at its answer, and it equals the whole step's (nothing ran ahead)."""
    whole = _store("fp16")
    whole.set_downlink("qsgd:8")
    s = _store("fp16")
    asked: list[dict[str, torch.Tensor]] = []

    def chooser(params: dict[str, torch.Tensor]) -> str:
        asked.append({k: v.clone() for k, v in params.items()})
        return "qsgd:8"

    s.defer_downlink(chooser)
    torch.manual_seed(1)
    assert s.want(list(KEYS), 0) == 0
    g0, g1 = _grads(0, 0), _grads(0, 1)
    _push(s, "w0", 0, g0, KEYS, 3)
    _push(s, "w1", 0, g1, ("a",), 5)
    assert s.applied_keys == 0 and not asked  # "a" is pushed by both, but waits for the whole update
    assert _push(s, "w1", 0, g1, ("b", "c"), 5) is not None
    assert len(asked) == 1 and set(asked[0]) == set(KEYS)
    for k in KEYS:
        assert torch.equal(asked[0][k], s.params[k])  # the new parameters: the update is them less the shadow
    update = s.pull_keys(0, ["a", "b"])
    assert update.version == 1 and {p.codec for p in update.tensors.values()} == {"qsgd:8"}
    torch.manual_seed(1)
    _push(whole, "w0", 0, g0, KEYS, 3)
    _push(whole, "w1", 0, g1, KEYS, 5)
    for k in KEYS:
        assert torch.equal(s.shadow[k], whole.shadow[k])
    # the next step pipelines again
    assert s.want(["a"], 1) == 0
    _push(s, "w0", 1, _grads(1, 0), ("a",), 3)
    _push(s, "w1", 1, _grads(1, 1), ("a",), 5)
    assert s.applied_keys == 1


def test_a_chooser_that_fails_leaves_the_codec_and_the_step(caplog: pytest.LogCaptureFixture) -> None:
    s = _store("fp16")

    def broken(params: dict[str, torch.Tensor]) -> str:
        raise RuntimeError("policy bug")

    s.defer_downlink(broken)
    _push(s, "w0", 0, _grads(0, 0), KEYS, 3)
    assert _push(s, "w1", 0, _grads(0, 1), KEYS, 5) is not None
    assert s.version == 1 and "deferred downlink choice failed" in caplog.text
    assert {p.codec for k, p in s.pull(0).tensors.items() if k in KEYS} == {"fp16"}


def test_a_chooser_that_names_no_codec_leaves_the_codec_and_the_step(caplog: pytest.LogCaptureFixture) -> None:
    s = _store("fp16")
    s.defer_downlink(lambda params: "no-such-codec:3")
    _push(s, "w0", 0, _grads(0, 0), KEYS, 3)
    assert _push(s, "w1", 0, _grads(0, 1), KEYS, 5) is not None
    assert s.version == 1 and "deferred downlink choice failed" in caplog.text
    assert {p.codec for k, p in s.pull(0).tensors.items() if k in KEYS} == {"fp16"}
