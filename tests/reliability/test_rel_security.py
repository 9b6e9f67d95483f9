"""Security and resource bounds against a live PS: handshake timeout, connection limits, stream
floods, oversize messages, replayed handshakes, secrets kept out of logs, --insecure warnings."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from netsense.errors import AuthError, PeerError, PeerTimeout
from netsense.ps.server import ServerSettings
from netsense.transport.auth import auth_mac, new_nonce
from netsense.transport.channel import open_connection
from netsense.transport.tls import TransportSettings, client_configuration
from netsense.transport.wire import Auth, Challenge, Hello, Limits, Pull, Push
from netsense.worker.client import Identity, PSClient
from netsense.worker.optimizer import NetSenseOptimizer

import relhelp
from inproc import connect, start_ps

pytestmark = pytest.mark.reliability


def _config(certs):  # type: ignore[no-untyped-def]
    return client_configuration(TransportSettings(), ca=certs.ca, server_name="127.0.0.1")


async def _hold_raw(certs, port: int, n: int, wait_s: float) -> list[str | None]:  # type: ignore[no-untyped-def]
    """Open `n` QUIC connections that never authenticate; their close reasons after `wait_s`."""
    async with asyncio.TaskGroup() as tg:
        conns = []
        for _ in range(n):
            cm = open_connection("127.0.0.1", port, _config(certs))
            conns.append((cm, await cm.__aenter__()))
            await asyncio.sleep(0.05)
        await asyncio.sleep(wait_s)
        reasons = [c.closed_reason for _, c in conns]
        for cm, _ in conns:
            tg.create_task(asyncio.wait_for(cm.__aexit__(None, None, None), 2))
    return reasons


def test_handshake_timeout_closes_silent_connections(certs) -> None:
    ps = start_ps(certs, ServerSettings(port=0, handshake_timeout_s=0.5))
    reasons = asyncio.run(_hold_raw(certs, ps.port, 2, 1.5))
    assert all(r and "not authenticated within" in r for r in reasons), reasons
    assert ps.server.refused_connections == 2 and not ps.server.connections
    ps.stop()


def test_connections_per_host_and_unauthenticated_are_bounded(certs) -> None:
    ps = start_ps(certs, ServerSettings(port=0, max_connections_per_host=3, max_unauthenticated=100))
    reasons = asyncio.run(_hold_raw(certs, ps.port, 5, 0.5))
    # Refused at the first datagram, before the TLS handshake: QUIC carries no reason phrase yet.
    assert reasons[:3] == [None] * 3 and all(r is not None for r in reasons[3:]), reasons
    assert ps.server.refused_connections == 2
    ps.stop()
    ps = start_ps(certs, ServerSettings(port=0, max_unauthenticated=2))
    reasons = asyncio.run(_hold_raw(certs, ps.port, 4, 0.5))
    assert reasons[:2] == [None] * 2 and all(r is not None for r in reasons[2:]), reasons
    assert ps.server.refused_connections == 2
    # a legitimate worker still gets in once the flood is gone
    opt = NetSenseOptimizer(torch.nn.Linear(2, 2), connect=connect(certs, ps.port), worker_id="ok")
    opt.close()
    ps.stop()


def test_stream_flood_from_one_peer_is_bounded_and_others_are_served(certs) -> None:
    ps = start_ps(certs, ServerSettings(port=0))
    good = NetSenseOptimizer(torch.nn.Linear(2, 2), connect=connect(certs, ps.port), worker_id="good")
    peak = {"tasks": 0}

    async def flood() -> list[object]:
        client = PSClient("127.0.0.1", ps.port, _config(certs), Identity("flood", 1, certs.secret.read_bytes().strip()))
        await client.connect()
        # 1000 PULLs that wait for a version that never comes: each holds a stream and a handler.
        reqs = [asyncio.ensure_future(client.conn.request(Pull(0, 10**9), 4)) for _ in range(1000)]
        await asyncio.sleep(2)
        conns = [s.conn for s in ps.server.connections if s.worker_id == "flood"]
        peak["tasks"] = max(len(c._tasks) for c in conns)
        out = await asyncio.gather(*reqs, return_exceptions=True)
        await client.close()
        return out

    t0 = time.monotonic()
    replies = asyncio.run(flood())
    # QUIC's stream credit (aioquic grants 128 concurrent streams) and max_concurrent (256) bound the handlers
    assert 0 < peak["tasks"] <= 256, peak
    assert all(isinstance(r, (PeerError, PeerTimeout)) for r in replies)
    x = torch.randn(4, 2)
    good.zero_grad()
    good.model(x).sum().backward()
    assert good.step(samples=4).version == 1  # the PS still serves the well-behaved worker
    good.close()
    ps.stop()
    print(f"stream flood: peak {peak['tasks']} handlers for 1000 requests, {time.monotonic() - t0:.1f} s")


def test_oversize_message_refused_before_it_is_buffered(certs) -> None:
    ps = start_ps(certs, ServerSettings(port=0), limits=Limits(max_message_bytes=64 * 1024))
    opt = NetSenseOptimizer(torch.nn.Linear(2, 2), connect=connect(certs, ps.port), worker_id="w")

    async def go() -> object:
        client = PSClient("127.0.0.1", ps.port, _config(certs), Identity("big", 1, certs.secret.read_bytes().strip()))
        await client.connect()
        try:
            return await client.conn.request(b"\x00" * (1 << 20), 5)
        except Exception as exc:  # noqa: BLE001
            return exc
        finally:
            await client.close()

    reply = asyncio.run(go())
    assert getattr(reply, "code", None) == "oversize", reply
    opt.close()
    ps.stop()


def test_replayed_handshake_is_refused_before_any_model_data(certs) -> None:
    ps = start_ps(certs, ServerSettings(port=0))
    opt = NetSenseOptimizer(torch.nn.Linear(2, 2), connect=connect(certs, ps.port), worker_id="w0")
    secret = certs.secret.read_bytes().strip()

    async def go() -> list[object]:
        async with open_connection("127.0.0.1", ps.port, _config(certs)) as conn:
            hello = Hello("w1", 1, new_nonce())
            ch = await conn.request(hello, 5)
            assert isinstance(ch, Challenge)
            recorded = Auth(auth_mac(secret, server_nonce=ch.server_nonce, client_nonce=hello.client_nonce, worker_id="w1"))
        out: list[object] = []
        async with open_connection("127.0.0.1", ps.port, _config(certs)) as conn:  # an eavesdropper replays both
            await conn.request(hello, 5)
            for msg in (recorded, Pull(-1, 0), Push(0, 1, 2, {})):
                try:
                    out.append(await conn.request(msg, 5))
                except PeerError as exc:
                    out.append(exc.code)
        return out

    assert asyncio.run(go()) == ["auth", "auth", "auth"]
    assert "w1" not in ps.server.sessions
    opt.close()
    ps.stop()


def test_wrong_secret_fails_clearly(certs, tmp_path) -> None:
    ps = start_ps(certs, ServerSettings(port=0))
    bad = tmp_path / "secret"
    bad.write_text("0" * 64)
    with pytest.raises(AuthError, match="refused"):
        NetSenseOptimizer(torch.nn.Linear(2, 2), connect=replace(connect(certs, ps.port), secret_file=str(bad)), worker_id="x")
    ps.stop()


@pytest.mark.slow
def test_secrets_never_appear_in_debug_logs_and_insecure_warns(certs, tmp_path: Path) -> None:
    c = Path(certs.ca).parent
    secret = certs.secret.read_text().strip()
    relhelp.VERBOSE[:] = ["-vv"]
    try:
        ps, port = relhelp.start_ps(tmp_path, c)
        w = relhelp.start_worker(tmp_path, c, port, 0, 1, "--steps", "3", "--eval-every", "0")
        assert w.wait(180) == 0, w.log()[-2000:]
        relhelp.stop_ps(ps)
        logs = (tmp_path / "ps.log").read_text() + (tmp_path / "w0.log").read_text()
        assert "DEBUG" in logs and len(logs) > 1000  # really at debug level
        for needle in {secret, secret[:16], secret[-16:], bytes.fromhex(secret).hex() if _is_hex(secret) else secret}:
            assert needle not in logs
        ins, _ = relhelp.start_ps(tmp_path, c, "--insecure", name="insecure")
        relhelp.stop_ps(ins)
        assert "INSECURE" in (tmp_path / "insecure.log").read_text()
    finally:
        relhelp.VERBOSE[:] = []


def _is_hex(s: str) -> bool:
    try:
        bytes.fromhex(s)
        return True
    except ValueError:
        return False
