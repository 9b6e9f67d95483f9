"""Security and resource bounds against a live PS: handshake timeout, connection limits, stream
floods, oversize messages, replayed handshakes, secrets kept out of logs, --insecure warnings."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from aioquic.quic.connection import QuicConnection

from netsense.errors import AuthError, PeerError, PeerTimeout
from netsense.ps.server import ServerSettings
from netsense.transport.auth import auth_mac, new_nonce
from netsense.transport.channel import ClientConnection, open_connection
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
    # Past the global cap the OLDEST unauthenticated connections are closed, not the newcomers
    # (issue #17: a flood must not keep a real worker out); still exactly two are closed.
    assert all(r is not None and "mid-handshake" in r for r in reasons[:2]) and reasons[2:] == [None] * 2, reasons
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


# --- issue #17: strangers before authentication ---------------------------------------------------


async def _raw_from(source: str, port: int, certs) -> tuple[Any, Any]:  # type: ignore[no-untyped-def]
    """A QUIC connection to the PS from local address `source` (127.0.0.x) that never authenticates;
    (transport, protocol) once connected. Raises ConnectionError if the PS closes it first."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((source, 0))
    quic = QuicConnection(configuration=_config(certs))
    transport, proto = await loop.create_datagram_endpoint(lambda: ClientConnection(quic), sock=sock)
    try:
        proto.connect(("127.0.0.1", port))
        await asyncio.wait_for(proto.wait_connected(), 5)
    except BaseException:
        transport.close()
        raise
    return transport, proto


async def _flood(certs, port: int, sources: tuple[str, ...], per_source: int, stop: asyncio.Event) -> int:  # type: ignore[no-untyped-def]
    """Hold `per_source` unauthenticated connections from each source, each reopened as it closes;
    returns how many connections were opened."""
    opened = 0

    async def hold(source: str) -> None:
        nonlocal opened
        while not stop.is_set():
            opened += 1
            try:
                transport, proto = await _raw_from(source, port, certs)
            except (ConnectionError, asyncio.TimeoutError):
                await asyncio.sleep(0.01)
                continue
            while not stop.is_set() and proto.closed_reason is None:
                await asyncio.sleep(0.02)
            proto.close()
            transport.close()

    async with asyncio.TaskGroup() as tg:
        for source in sources:
            for _ in range(per_source):
                tg.create_task(hold(source))
    return opened


@pytest.mark.parametrize("per_host", [None, 40], ids=["defaults", "eviction-only"])
def test_a_flood_from_two_addresses_does_not_keep_a_worker_out(certs, caplog, per_host: int | None) -> None:
    """The issue's experiment: 33 + 33 never-authenticating connections from 127.0.0.2 and
    127.0.0.3, reopened as they close, kept a worker out ("more than 64 connections are
    mid-handshake"). Now the per-address handshake cap (16) holds them to 32; with that cap
    lifted (40), the global cap closes the oldest handshake, never the worker's new one. Either
    way the worker authenticates within its connect deadline, and the refusals log a few lines."""
    settings = ServerSettings(port=0) if per_host is None else ServerSettings(port=0, max_unauthenticated_per_host=per_host)
    ps = start_ps(certs, settings)
    took: dict[str, float] = {}

    async def go() -> int:
        stop = asyncio.Event()
        flood = asyncio.ensure_future(_flood(certs, ps.port, ("127.0.0.2", "127.0.0.3"), 33, stop))
        await asyncio.sleep(2.0)  # the flood at full strength
        # On the PS's loop, admitted connections only: a new one is counted before its admission
        # runs (one loop iteration later), and under load the count read 65 of 64.
        pending = await asyncio.to_thread(ps.call, lambda: sum(1 for c in ps.server.connections if c.admitted and not c.authenticated))
        t0 = time.monotonic()
        opt = await asyncio.to_thread(NetSenseOptimizer, torch.nn.Linear(2, 2), connect=connect(certs, ps.port), worker_id="real")
        took["connect_s"] = time.monotonic() - t0
        await asyncio.to_thread(opt.close)
        stop.set()
        opened = await flood
        print(f"flood {settings.max_unauthenticated_per_host}/host: {pending} mid-handshake, {opened} opened, "
              f"{ps.server.refused_connections} refused; worker in after {took['connect_s']:.2f} s")
        return pending

    with caplog.at_level(logging.WARNING, logger="netsense.ps.server"):
        pending = asyncio.run(go())
    assert pending <= settings.max_unauthenticated
    assert took["connect_s"] < connect(certs, ps.port).connect_timeout_s
    assert ps.server.refused_connections > 0
    # one line per address per refusal_log_interval_s (10 s): the run lasts well under that
    refusals = [r for r in caplog.records if "closing connection" in r.getMessage()]
    assert 1 <= len(refusals) <= 4, [r.getMessage() for r in refusals]
    ps.stop()


def test_bytes_before_authentication_are_bounded(certs) -> None:
    """The issue's experiment: 3 connections each sending 60 MiB before any AUTH were buffered
    against the full 64 MiB window (RSS 378 -> 527 MB). Now each is closed once it used half the
    64 KiB pre-authentication window, and a worker afterwards still gets the full window."""
    ps = start_ps(certs, ServerSettings(port=0))
    window = ServerSettings().preauth_window_bytes
    received: list[int] = []

    async def one() -> str | None:
        async with open_connection("127.0.0.1", ps.port, _config(certs)) as conn:
            session = next(c for c in ps.server.connections if not c.authenticated)
            sid = conn.quic.get_next_available_stream_id()
            for _ in range(60):
                conn.quic.send_stream_data(sid, b"\0" * (1 << 20))
            conn.transmit()
            for _ in range(200):
                if conn.closed_reason is not None:
                    break
                await asyncio.sleep(0.05)
            received.append(session.conn.bytes_in)
            return conn.closed_reason

    async def three() -> list[str | None]:
        return list(await asyncio.gather(*(one() for _ in range(3))))

    reasons = asyncio.run(three())
    assert all(r is not None and "before authenticating" in r for r in reasons), reasons
    assert len(received) == 3 and all(n <= window for n in received), received
    # an authenticated worker is not held to the small window: 1 MiB of parameters go through
    opt = NetSenseOptimizer(torch.nn.Linear(512, 512), connect=connect(certs, ps.port), worker_id="w0")
    assert ps.server.sessions["w0"].conn.window_open
    opt.zero_grad()
    opt.model(torch.randn(4, 512)).sum().backward()
    assert opt.step(samples=4).version == 1
    opt.close()
    ps.stop()


FORGED = "w0' (rank 0) authenticated\n2026-01-01 00:00:00 INFO netsense.ps.server: worker 'admin"


def test_peer_strings_cannot_forge_log_lines(certs, caplog) -> None:
    """A HELLO whose worker_id holds a newline wrote a forged line (`... INFO worker 'w0' (rank 0)
    authenticated`): such an id is refused with a clear error, and no log line of the PS holds a
    raw newline or control character from the peer, whatever it sent."""
    ps = start_ps(certs, ServerSettings(port=0))
    secret = certs.secret.read_bytes().strip()

    async def go() -> list[object]:
        out: list[object] = []
        async with open_connection("127.0.0.1", ps.port, _config(certs)) as conn:
            for wid in (FORGED, "w\x1b[2Jx", "\u2028w"):
                try:
                    out.append(await conn.request(Hello(wid, 0, new_nonce()), 5))
                except PeerError as exc:
                    out.append(exc.code)
        async with open_connection("127.0.0.1", ps.port, _config(certs)) as conn:  # printable, but a wrong MAC
            hello = Hello("w0 authenticated\\nfake", 0, new_nonce())
            ch = await conn.request(hello, 5)
            assert isinstance(ch, Challenge)
            try:
                await conn.request(Auth(auth_mac(b"wrong" * 8, server_nonce=ch.server_nonce, client_nonce=hello.client_nonce, worker_id=hello.worker_id)), 5)
            except PeerError as exc:
                out.append(exc.code)
        return out

    with caplog.at_level(logging.DEBUG):
        assert asyncio.run(go()) == ["hello", "hello", "hello", "auth"]
    lines = [r.getMessage() for r in caplog.records]
    assert any("control characters" in m for m in lines), lines
    for m in lines:
        assert "\n" not in m and "\x1b" not in m and "\u2028" not in m, m
    assert not any("authenticated" in m and "admin" in m and "refused" not in m for m in lines), lines
    assert not ps.server.sessions
    ps.stop()


def test_malformed_streams_log_one_line_per_connection(certs, caplog) -> None:
    """2000 malformed streams logged 2000 WARNING lines; now one line per connection per 10 s
    (with a count of the rest), while every one of them is still answered with ERROR."""
    ps = start_ps(certs, ServerSettings(port=0))

    async def go() -> list[object]:
        client = PSClient("127.0.0.1", ps.port, _config(certs), Identity("noisy", 1, certs.secret.read_bytes().strip()))
        await client.connect()
        out: list[object] = []
        for _ in range(100):
            try:
                out.append(await client.conn.request(b"\xff\x00garbage\n forged line", 5))
            except PeerError as exc:
                out.append(exc.code)
        await client.close()
        return out

    with caplog.at_level(logging.WARNING):
        replies = asyncio.run(go())
    assert len(replies) == 100 and all(isinstance(r, str) for r in replies), replies[:3]
    dropped = [r.getMessage() for r in caplog.records if "dropped bad message" in r.getMessage()]
    assert len(dropped) == 1, dropped
    assert ps.server.errors_sent >= 100
    ps.stop()
