"""The worker's side of model buffers: which tensors are state keys, how they travel (whole,
lossless, integers as float64), how PARAMS writes them, and the name map INIT sends."""

from __future__ import annotations

import pytest
import torch

from netsense.compression import make_codec
from netsense.errors import ProtocolError
from netsense.transport.wire import Params
from netsense.worker.layout import key_layout, state_layout
from netsense.worker.replica import Replica

FP32 = make_codec("fp32")


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(4, 6)
        self.bn = torch.nn.BatchNorm1d(6)
        self.frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
        self.register_buffer("scratch", torch.zeros(3), persistent=False)  # not state: not in state_dict


def test_state_keys_are_persistent_buffers_and_frozen_parameters() -> None:
    net = _Net()
    assert [s.key for s in key_layout(net)] == ["fc.weight", "fc.bias", "bn.weight", "bn.bias"]
    state = state_layout(net)
    assert [s.key for s in state] == ["frozen", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]
    assert all(s.buffer for s in state)
    plain = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh())
    assert state_layout(plain) == []  # no buffers: nothing extra on the wire


def test_large_buffers_are_chunked_like_parameters() -> None:
    m = torch.nn.Module()
    m.register_buffer("big", torch.arange(10, dtype=torch.float32))
    m.w = torch.nn.Parameter(torch.ones(1))
    slots = state_layout(m, chunk_elems=4)
    assert [(s.key, s.name, s.start, s.end) for s in slots] == [("big#0", "big", 0, 4), ("big#1", "big", 4, 8), ("big#2", "big", 8, 10)]


def test_state_travels_whole_and_lossless_on_shard_0() -> None:
    net = _Net()
    net.bn.num_batches_tracked.fill_(7)
    r = Replica(net, 1 << 22, 2)
    assert r.shard_state(1) == [] and len(r.shard_state(0)) == 4
    assert r.state_payloads(0) == {}  # until a full PARAMS shows that the PS holds them
    r.apply(Params(0, True, r.seed(0)), 0)
    payloads = r.state_payloads(0)
    nbt = payloads["bn.num_batches_tracked"]
    assert nbt.codec == "fp32" and nbt.dtype == "float64" and float(FP32.decode(nbt)) == 7.0  # integers as float64
    assert set(r.seed(0)) >= set(payloads) and not set(r.seed(1)) & set(payloads)
    info = r.model_info(0)
    assert info["bn.num_batches_tracked"].dtype == "int64" and info["bn.running_mean"].buffer
    assert all(i.name == k and not i.buffer for k, i in r.model_info(1).items())
    assert set(r.model_info(0)) | set(r.model_info(1)) == set(net.state_dict())


def test_params_write_state_whole_in_delta_messages_too() -> None:
    net = _Net()
    r = Replica(net, 1 << 22, 1)
    r.versions[0] = 3
    tensors = {
        "bn.running_mean": FP32.encode(torch.full((6,), 2.0)),
        "bn.num_batches_tracked": FP32.encode(torch.tensor(5.0, dtype=torch.float64)),
    }
    r.apply(Params(4, False, tensors, base_version=3), 0)
    assert torch.equal(net.bn.running_mean, torch.full((6,), 2.0))  # written, not added to
    assert net.bn.num_batches_tracked.dtype == torch.int64 and int(net.bn.num_batches_tracked) == 5
    with pytest.raises(ProtocolError) as err:  # a PS must send state lossless
        r.apply(Params(5, False, {"bn.running_mean": make_codec("fp16").encode(torch.ones(6))}, base_version=4), 0)
    assert err.value.code == "bad-payload"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_state_on_the_gpu_goes_to_the_host_once_and_comes_back_there() -> None:
    net = _Net().cuda()
    r = Replica(net, 1 << 22, 1)
    payloads = r.state_payloads(0)
    assert isinstance(payloads["bn.running_var"].parts[0], bytes)
    r.versions[0] = 0
    r.apply(Params(1, False, {"bn.running_var": FP32.encode(torch.full((6,), 3.0))}, base_version=0), 0)
    assert net.bn.running_var.is_cuda and torch.equal(net.bn.running_var.cpu(), torch.full((6,), 3.0))


def test_no_state_is_pushed_to_a_ps_that_does_not_hold_it() -> None:
    net = _Net()
    r = Replica(net, 1 << 22, 1)
    params_only = {k: p for k, p in r.seed(0).items() if k in {s.key for s in r.slots}}
    r.apply(Params(2, True, params_only), 0)  # a PS initialized by an older rank 0: no state keys
    assert r.state_payloads(0) == {}  # pushing them would be refused as unknown keys
    r.apply(Params(3, True, r.seed(0)), 0)
    assert set(r.state_payloads(0)) == {s.key for s in r.state}
