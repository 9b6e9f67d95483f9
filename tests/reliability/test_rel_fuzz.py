"""Adversarial input, >= 10,000 messages per run: the wire decoder, the store's message handling,
and a live PS over QUIC. Nothing crashes, every bad message gets ERROR, parameters stay unchanged.

`NETSENSE_FUZZ_SCALE=20 pytest -m reliability tests/reliability/test_rel_fuzz.py` is the long run.
"""

from __future__ import annotations

import asyncio
import os

import msgpack
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netsense.compression import make_codec
from netsense.errors import NetSenseError, ProtocolError
from netsense.ps.store import ParameterStore
from netsense.transport.tls import TransportSettings, client_configuration
from netsense.transport.wire import Limits, Push, decode_message, encode_message
from netsense.worker.client import Identity, PSClient

pytestmark = pytest.mark.reliability
SCALE = int(os.environ.get("NETSENSE_FUZZ_SCALE", "1"))
FP32 = make_codec("fp32")
def FAST(n: int) -> settings:
    return settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), database=None)

COUNT = {"decoder": 0, "store": 0}

# Fields a real message may carry, so mutations reach deep validation, not just the type check.
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=True), st.text(max_size=20),
    st.binary(max_size=64),
)  # fmt: skip
_payload = st.fixed_dictionaries(
    {"c": st.sampled_from(["fp32", "fp16", "bf16", "qsgd:8", "topk:0.5", "nope", ""]),
     "s": st.lists(st.integers(-2, 1 << 40), max_size=9),
     "d": st.sampled_from(["float32", "float16", "bfloat16", "int64", "object", ""]),
     "p": st.lists(st.binary(max_size=64), max_size=10),
     "m": st.lists(_scalars, max_size=10)},
)  # fmt: skip
_keys = st.sampled_from(["w", "b", "x", "", "../etc", "a" * 300])
_message = st.fixed_dictionaries(
    {"v": st.sampled_from([1, 1, 1, 0, 2, "1"]),
     "t": st.sampled_from(["push", "pull", "init", "hello", "auth", "bye", "params", "ack", "error", "x"])},
    optional={"step": _scalars, "samples": _scalars, "total_keys": _scalars, "have_version": _scalars,
              "wait_for": _scalars, "worker_id": _scalars, "rank": _scalars, "client_nonce": _scalars, "mac": _scalars,
              "grads": st.dictionaries(_keys, _payload, max_size=3), "tensors": st.dictionaries(_keys, _payload, max_size=3),
              "optimizer": st.dictionaries(st.text(max_size=8), _scalars, max_size=3), "reason": _scalars},
)  # fmt: skip


@FAST(5000 * SCALE)
@given(st.binary(max_size=256))
def test_decoder_random_bytes(data: bytes) -> None:
    COUNT["decoder"] += 1
    try:
        decode_message(data, Limits(max_message_bytes=1 << 16))
    except ProtocolError:
        pass


@FAST(1500 * SCALE)
@given(_message)
def test_decoder_structured_adversarial_maps(body: dict) -> None:
    COUNT["decoder"] += 1
    try:
        msg = decode_message(msgpack.packb(body), Limits())
    except ProtocolError:
        return
    assert decode_message(encode_message(msg)) == msg  # what decodes re-encodes to itself


def _store() -> ParameterStore:
    s = ParameterStore()
    s.initialize({"w": FP32.encode(torch.ones(2, 3)), "b": FP32.encode(torch.zeros(3))}, {"name": "sgd", "lr": 0.1})
    s.join("a")
    return s


STORE = _store()
BEFORE = {k: v.clone() for k, v in STORE.params.items()}
_tensor_payload = st.one_of(
    st.builds(lambda v: FP32.encode(torch.full((2, 3), v)), st.floats(allow_nan=True, allow_infinity=True, width=32)),
    st.builds(lambda v: FP32.encode(torch.full((3,), v)), st.floats(allow_nan=True, allow_infinity=True, width=32)),
    st.builds(lambda n: FP32.encode(torch.zeros(n)), st.integers(0, 7)),
    st.builds(lambda v: make_codec("fp16").encode(torch.full((2, 3), v)), st.floats(allow_nan=True, width=16)),
    # float64 values past float32's range: finite on the wire, Inf in the parameters' dtype
    st.builds(lambda v: FP32.encode(torch.full((3,), v, dtype=torch.float64)), st.sampled_from([1e300, -1e39, 3e38, 1.0])),
)


@FAST(3600 * SCALE)
@given(
    step=st.integers(-3, 3), samples=st.integers(1, 1 << 20), total=st.integers(0, 4),
    grads=st.dictionaries(_keys, _tensor_payload, max_size=3), worker=st.sampled_from(["a", "b", "c"]),
)  # fmt: skip
def test_store_push_adversarial(step: int, samples: int, total: int, grads: dict, worker: str) -> None:
    """Every push is refused (keys missing, stale, bad shape, NaN/Inf ...) or is a valid partial
    push that never completes a step: the parameters never change, whatever arrives."""
    COUNT["store"] += 1
    valid = False
    try:
        STORE.push(worker, Push(step, samples, total, grads))
        valid = True
    except ProtocolError as exc:
        assert exc.code in {"stale", "keys", "key", "duplicate", "shape", "non-finite", "malformed", "dtype", "bad-payload"}
    if valid:
        assert all(torch.isfinite(g).all() for g in STORE._core.pending[worker].grads.values())
        assert all(torch.isfinite(g.to(STORE.params[k].dtype)).all() for k, g in STORE._core.pending[worker].grads.items())
    # drop whatever was recorded so the next example starts from the same step, never applying
    STORE._core.pending.clear()
    STORE.live.clear()
    STORE.live.update({"a", "z"})  # "z" never pushes: no example can complete the barrier
    assert STORE.version == 0 and all(torch.equal(BEFORE[k], v) for k, v in STORE.params.items())


def test_fuzz_volume_is_at_least_ten_thousand() -> None:
    """Runs after the fuzzers in this module (file order)."""
    if COUNT["decoder"] == 0:
        pytest.skip("run with the fuzz tests")
    assert COUNT["decoder"] + COUNT["store"] >= 10_000 * SCALE, COUNT


def test_live_ps_answers_adversarial_messages_with_error(ps) -> None:  # type: ignore[no-untyped-def]
    from netsense.worker.optimizer import NetSenseOptimizer

    torch.manual_seed(0)
    opt = NetSenseOptimizer(torch.nn.Linear(3, 2), connect=ps.connect_settings(), rank=0, worker_id="w0")
    before = ps.call(lambda: {k: v.clone() for k, v in ps.server.store.params.items()})
    examples = [msgpack.packb(b) for b in _examples(_message, 300 * SCALE)]
    examples += [encode_message(Push(0, 1, 2, {"weight": FP32.encode(torch.full((2, 3), float(v)))})) for v in ("nan", "inf", "-inf")]

    async def go() -> list[object]:
        client = PSClient(
            "127.0.0.1", ps.port, client_configuration(TransportSettings(), ca=ps.certs.ca, server_name="127.0.0.1"),
            Identity("fuzzer", 3, ps.certs.secret.read_bytes().strip()),
        )  # fmt: skip
        await client.connect()
        out: list[object] = []
        for i in range(0, len(examples), 32):  # 32 streams in flight at a time
            batch = [client.conn.request(d, 10) for d in examples[i : i + 32]]
            out += await asyncio.gather(*batch, return_exceptions=True)
        await client.close()
        return out

    replies = asyncio.run(go())
    unexpected = [r for r in replies if not isinstance(r, (NetSenseError, Exception)) and type(r).__name__ not in ("Ack", "Params", "Challenge", "Welcome")]
    assert not unexpected
    assert sum(isinstance(r, NetSenseError) for r in replies) >= len(replies) // 2
    assert [getattr(r, "code", None) for r in replies[-3:]] == ["non-finite"] * 3
    after = ps.call(lambda: {k: v.clone() for k, v in ps.server.store.params.items()})
    assert all(torch.equal(before[k], after[k]) for k in before) and ps.server.store.version == 0
    opt.close()


def _examples(strategy: st.SearchStrategy, n: int) -> list:
    out: list = []

    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(x) -> None:  # type: ignore[no-untyped-def]
        out.append(x)

    collect()
    return out
