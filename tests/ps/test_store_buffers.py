"""State keys (model buffers) in the store: averaged by samples from what the workers push
(integers: the largest), never optimized, sent whole in every update, kept in checkpoints."""

from __future__ import annotations

import pytest
import torch

from netsense.compression import make_codec
from netsense.errors import ProtocolError
from netsense.ps.store import ParameterStore
from netsense.transport.wire import Init, Push, TensorInfo, decode_message, encode_message

FP32 = make_codec("fp32")
MODEL = {
    "w": TensorInfo("0.weight", (3,), "float32", 0, False),
    "rm": TensorInfo("1.running_mean", (3,), "float32", 0, True),
    "nbt": TensorInfo("1.num_batches_tracked", (), "int64", 0, True),
}


def _store(downlink: str = "fp32", staleness: int | None = None, clip: float = 0.0) -> ParameterStore:
    s = ParameterStore(downlink_codec=downlink, staleness=staleness)
    tensors = {"w": torch.ones(3), "rm": torch.zeros(3), "nbt": torch.zeros((), dtype=torch.float64)}
    optimizer = {"name": "sgd", "lr": 0.1, **({"clip_grad_norm": clip} if clip else {})}
    s.initialize({k: FP32.encode(v) for k, v in tensors.items()}, optimizer, 2, MODEL, "job-a")
    s.join("a")
    s.join("b")
    return s


def _push(s: ParameterStore, worker: str, samples: int, rm: list[float], nbt: float, step: int = 0):  # type: ignore[no-untyped-def]
    grads = {"w": FP32.encode(torch.ones(3)), "rm": FP32.encode(torch.tensor(rm)), "nbt": FP32.encode(torch.tensor(nbt, dtype=torch.float64))}
    return s.push(worker, Push(step, samples, 1, grads))


def test_state_is_the_sample_weighted_mean_and_never_optimized() -> None:
    s = _store()
    assert set(s.params) == {"w"} and set(s.state_keys) == {"rm", "nbt"}
    assert _push(s, "a", 1, [1.0, 2.0, 3.0], 1) is None
    assert _push(s, "b", 3, [5.0, 6.0, 7.0], 2) is not None
    torch.testing.assert_close(s.state_keys["rm"], torch.tensor([4.0, 5.0, 6.0]))  # (1*a + 3*b) / 4
    assert float(s.state_keys["nbt"]) == 2.0  # integer state: the largest
    torch.testing.assert_close(s.params["w"], torch.full((3,), 0.9))  # only the parameter took the SGD step


def test_updates_carry_the_state_whole_even_as_deltas() -> None:
    s = _store(downlink="fp16")
    _push(s, "a", 1, [1.0, 1.0, 1.0], 1)
    _push(s, "b", 1, [3.0, 3.0, 3.0], 1)
    delta = s.pull(0)
    assert not delta.full and delta.tensors["rm"].codec == "fp32"
    assert torch.equal(FP32.decode(delta.tensors["rm"]), torch.full((3,), 2.0))  # the value, not a delta
    full = s.pull(-1)
    assert full.full and set(full.tensors) == {"w", "rm", "nbt"}


def test_async_mode_takes_the_applied_pushs_state() -> None:
    s = _store(staleness=1)
    _push(s, "a", 1, [1.0, 2.0, 3.0], 4)
    assert torch.equal(s.state_keys["rm"], torch.tensor([1.0, 2.0, 3.0])) and float(s.state_keys["nbt"]) == 4


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (make_codec("fp16").encode(torch.ones(3)), "bad-payload"),  # state must come lossless
        (FP32.encode(torch.tensor([1.0, float("nan"), 0.0])), "non-finite"),
        (FP32.encode(torch.ones(3, dtype=torch.float64)), "dtype"),
        (FP32.encode(torch.ones(4)), "shape"),
    ],
)
def test_bad_state_in_a_push_is_refused_and_changes_nothing(payload, code: str) -> None:  # type: ignore[no-untyped-def]
    s = _store()
    with pytest.raises(ProtocolError) as err:
        s.push("a", Push(0, 1, 1, {"w": FP32.encode(torch.ones(3)), "rm": payload}))
    assert err.value.code == code
    assert not s.step_started and torch.equal(s.state_keys["rm"], torch.zeros(3))


def test_a_step_without_pushed_state_keeps_it() -> None:
    s = _store()
    s.push("a", Push(0, 1, 1, {"w": FP32.encode(torch.ones(3))}))
    s.push("b", Push(0, 1, 1, {"w": FP32.encode(torch.ones(3))}))
    assert s.version == 1 and torch.equal(s.state_keys["rm"], torch.zeros(3))


def test_checkpoint_keeps_state_map_and_job() -> None:
    s = _store()
    _push(s, "a", 1, [1.0, 2.0, 3.0], 1)
    _push(s, "b", 1, [1.0, 2.0, 3.0], 1)
    r = ParameterStore()
    r.restore(s.state())
    assert torch.equal(r.state_keys["rm"], s.state_keys["rm"]) and r.model == s.model and r.job_id == "job-a"
    assert set(r.pull(-1).tensors) == {"w", "rm", "nbt"}


def test_init_model_map_is_validated() -> None:
    tensors = {"w": FP32.encode(torch.ones(3))}
    ok = Init(tensors, {}, 1, {"w": TensorInfo("0.weight", (3,), "float32", 0, False)})
    assert decode_message(encode_message(ok)) == ok
    assert b"model" not in encode_message(Init(tensors, {}, 1))  # no map: the bytes of before
    for bad in (
        {"x": TensorInfo("0.weight", (3,), "float32", 0, False)},  # not the keys of `tensors`
        {"w": TensorInfo("0.weight", (2,), "float32", 0, False)},  # does not fit its entry
        {"w": TensorInfo("0.weight", (3,), "complex64", 0, False)},
        {"w": TensorInfo("bad name!", (3,), "float32", 0, False)},
    ):
        with pytest.raises(ProtocolError):
            decode_message(encode_message(Init(tensors, {}, 1, bad)))
    s = ParameterStore()
    with pytest.raises(ProtocolError):  # state alone: nothing to train
        s.initialize(tensors, {"name": "sgd", "lr": 0.1}, 1, {"w": TensorInfo("b", (3,), "float32", 0, True)})


def test_export_joins_shards_and_chunks_into_a_state_dict() -> None:
    from netsense.errors import ConfigError
    from netsense.ps.checkpoint import export_state_dict
    from netsense.ps.store.state import info_to_dict

    def st(params: dict, state: dict, model: dict) -> dict:  # type: ignore[type-arg]
        return {"version": 3, "params": params, "state": state, "model": {k: info_to_dict(i) for k, i in model.items()}, "job_id": "j"}

    shard0 = st(
        {"w#0": torch.arange(4.0)},
        {"nbt": torch.tensor(6.0, dtype=torch.float64)},
        {"w#0": TensorInfo("w", (2, 3), "float32", 0, False), "nbt": TensorInfo("bn.nbt", (), "int64", 0, True)},
    )
    shard1 = st({"w#1": torch.tensor([4.0, 5.0])}, {}, {"w#1": TensorInfo("w", (2, 3), "float32", 4, False)})
    out = export_state_dict([shard0, shard1])
    assert torch.equal(out["w"], torch.arange(6.0).reshape(2, 3))
    assert out["bn.nbt"].dtype == torch.int64 and int(out["bn.nbt"]) == 6
    with pytest.raises(ConfigError, match="missing"):
        export_state_dict([shard0])  # a shard's checkpoint is missing
    with pytest.raises(ConfigError, match="name map"):
        export_state_dict([{"version": 1, "params": {"w": torch.ones(1)}}])  # from before the map
    with pytest.raises(ConfigError, match="different jobs"):
        export_state_dict([shard0, {**shard1, "job_id": "other"}])


@pytest.mark.parametrize(("downlink", "clip"), [("fp32", 0.0), ("fp16", 0.0), ("fp32", 10.0)], ids=["fp32", "fp16", "clipping"])
def test_a_pipelined_step_averages_the_state_and_a_keyed_pull_of_it_waits_for_the_version(downlink: str, clip: float) -> None:
    """Overlap's path (keyed pulls): a state key may be pulled by key, is never applied ahead, and
    comes back averaged once the step is whole, from the step's update as a whole step's would
    (a clipping PS applies the step whole: the same reply)."""
    s = _store(downlink, clip=clip)
    assert s.want(("w",), 0) == 0 and s.want(("rm", "nbt"), 0) == 0  # state keys are no unknown keys
    assert not s.keys_ready(("rm", "nbt"), 1)
    _push(s, "a", 1, [1.0, 2.0, 3.0], 1)
    _push(s, "b", 3, [5.0, 6.0, 7.0], 2)
    assert s.version == 1 and s.keys_ready(("rm", "nbt"), 1)
    reply = s.pull_keys(0, ("rm", "nbt"))
    assert reply.version == 1 and set(reply.tensors) == {"rm", "nbt"} and reply.tensors["rm"].codec == "fp32"
    torch.testing.assert_close(FP32.decode(reply.tensors["rm"]), torch.tensor([4.0, 5.0, 6.0]))
    assert set(s.pull(0).tensors) == {"w", "rm", "nbt"}  # a whole pull of the step holds them too


def test_keys_applied_ahead_leave_the_state_for_the_whole_step() -> None:
    s = _store()
    s.want(("w", "rm"), 0)
    s.push("a", Push(0, 1, 1, {"w": FP32.encode(torch.ones(3)), "rm": FP32.encode(torch.tensor([2.0, 2.0, 2.0]))}))
    s.push("b", Push(0, 1, 1, {"w": FP32.encode(torch.ones(3))}))  # b pushes no state: a's is the mean
    assert s.version == 1 and torch.equal(s.state_keys["rm"], torch.full((3,), 2.0))
    assert torch.equal(FP32.decode(s.pull_keys(0, ("rm",)).tensors["rm"]), torch.full((3,), 2.0))
