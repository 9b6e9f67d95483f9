"""Authentication, TLS verification and malformed messages against a live PS."""

from __future__ import annotations

import asyncio

import msgpack
import pytest
import torch

from netsense.errors import AuthError, ConfigError
from netsense.transport.auth import write_secret
from netsense.transport.tls import TransportSettings, client_configuration, make_dev_certs
from netsense.transport.wire import Error, Hello
from netsense.worker.client import Identity, PSClient
from netsense.worker.connect import ConnectSettings
from netsense.worker.optimizer import NetSenseOptimizer

from ..conftest import RunningPS


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


def _params(ps: RunningPS) -> dict[str, torch.Tensor]:
    return ps.call(lambda: {k: v.clone() for k, v in ps.server.store.params.items()})


def test_wrong_secret_is_refused_and_ps_keeps_running(ps: RunningPS, tmp_path) -> None:
    good = NetSenseOptimizer(_model(), connect=ps.connect_settings(), rank=0, worker_id="good")
    before = _params(ps)
    bad_secret = tmp_path / "secret"
    write_secret(bad_secret)
    with pytest.raises(AuthError, match="wrong shared secret"):
        NetSenseOptimizer(
            _model(), connect=ConnectSettings("127.0.0.1", ps.port, ca=str(ps.certs.ca), secret_file=str(bad_secret)), rank=1
        )
    assert "good" in ps.server.sessions and len(ps.server.sessions) == 1
    # the PS still serves the good worker, and nothing changed
    x = torch.randn(2, 3)
    good.zero_grad()
    good.model(x).sum().backward()
    assert good.step(samples=2).version == 1
    good.close()
    assert all(not torch.equal(before[k], v) for k, v in _params(ps).items())


def test_client_that_does_not_trust_the_server_certificate_fails_clearly(ps: RunningPS, tmp_path) -> None:
    other = make_dev_certs(tmp_path / "other")
    with pytest.raises(AuthError, match="handshake"):
        NetSenseOptimizer(
            _model(),
            connect=ConnectSettings(
                "127.0.0.1", ps.port, ca=str(other.ca), secret_file=str(ps.certs.secret), connect_timeout_s=3
            ),
        )


def test_wrong_server_name_fails(ps: RunningPS) -> None:
    with pytest.raises(AuthError):
        NetSenseOptimizer(_model(), connect=ps.connect_settings(server_name="not-the-ps.example", connect_timeout_s=3))


def test_missing_secret_or_ca_are_config_errors(ps: RunningPS, tmp_path) -> None:
    with pytest.raises(ConfigError, match="secret"):
        NetSenseOptimizer(_model(), connect=ConnectSettings("127.0.0.1", ps.port, ca=str(ps.certs.ca)))
    with pytest.raises(ConfigError, match="does not exist"):
        NetSenseOptimizer(
            _model(), connect=ConnectSettings("127.0.0.1", ps.port, ca=str(tmp_path / "x.pem"), secret_file=str(ps.certs.secret))
        )


async def _raw_exchange(ps: RunningPS, payloads: list[bytes]) -> list[object]:
    """Send raw byte messages (one per stream) on a fresh connection; return the replies."""
    client = PSClient(
        "127.0.0.1",
        ps.port,
        client_configuration(TransportSettings(), ca=ps.certs.ca, server_name="127.0.0.1"),
        Identity("raw", 5, ps.certs.secret.read_bytes().strip()),
    )
    await client.connect()
    replies = []
    for data in payloads:
        try:
            replies.append(await client.conn.request(data, 5))
        except Exception as exc:  # PeerError carries the ERROR code
            replies.append(exc)
    await client.close()
    return replies


def test_malformed_messages_get_errors_and_change_nothing(ps: RunningPS) -> None:
    opt = NetSenseOptimizer(_model(), connect=ps.connect_settings(), rank=0, worker_id="w0")
    before = _params(ps)
    good_push = {"v": 1, "t": "push", "step": 0, "samples": 1, "total_keys": 2}
    fp = lambda shape, dtype="float32", n=None: {  # noqa: E731
        "c": "fp32", "s": list(shape), "d": dtype, "p": [bytes(n if n is not None else 4 * max(1, int(torch.tensor(shape).prod())))], "m": []
    }  # fmt: skip
    bad = [
        msgpack.packb({**good_push, "grads": {"weight": fp([2, 3])}})[:-5],  # truncated
        msgpack.packb({**good_push, "grads": {"weight": fp([2, 3], dtype="int32")}}),  # wrong dtype
        msgpack.packb({**good_push, "grads": {"weight": fp([3, 2])}}),  # shape mismatch
        msgpack.packb({**good_push, "grads": {"weight": fp([2, 3], n=7)}}),  # bytes do not match shape
        msgpack.packb({**good_push, "grads": {"nokey": fp([2])}}),  # unknown key
        msgpack.packb({**good_push, "v": 9, "grads": {}}),  # wrong version
        msgpack.packb({**good_push, "grads": {"weight": fp([1 << 16, 1 << 16], n=8)}}),  # oversize claim
    ]
    replies = asyncio.run(_raw_exchange(ps, bad))
    codes = [getattr(r, "code", None) for r in replies]
    assert codes == ["malformed", "dtype", "shape", "bad-payload", "key", "version", "oversize"], replies
    assert all(torch.equal(before[k], v) for k, v in _params(ps).items())
    assert ps.server.store.version == 0 and not ps.server.store.step_started
    opt.close()


def test_requests_before_auth_are_refused(ps: RunningPS) -> None:
    async def go() -> list[object]:
        client = PSClient(
            "127.0.0.1",
            ps.port,
            client_configuration(TransportSettings(), ca=ps.certs.ca, server_name="127.0.0.1"),
            Identity("x", 0, None),
        )
        from netsense.transport.channel import open_connection

        async with open_connection("127.0.0.1", ps.port, client.configuration) as conn:
            out = []
            for msg in (msgpack.packb({"v": 1, "t": "pull", "have_version": -1, "wait_for": 0}),):
                try:
                    out.append(await conn.request(msg, 5))
                except Exception as exc:
                    out.append(exc)
            # a replayed AUTH without a fresh challenge is refused too
            await conn.request(Hello("x", 0, bytes(32)), 5)
            try:
                await conn.request(msgpack.packb({"v": 1, "t": "auth", "mac": bytes(32)}), 5)
            except Exception as exc:
                out.append(exc)
            try:
                await conn.request(msgpack.packb({"v": 1, "t": "auth", "mac": bytes(32)}), 5)
            except Exception as exc:
                out.append(exc)
            return out

    out = asyncio.run(go())
    assert [getattr(e, "code", None) for e in out] == ["auth", "auth", "auth"]
    assert not isinstance(out[0], Error)
