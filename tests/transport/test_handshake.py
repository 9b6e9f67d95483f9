"""transport/handshake.py: the one client handshake that workers and the PS probe share.

A scripted connection stands in for the PS, so the exchange itself is checked without sockets;
tests/e2e/test_security.py and test_probe_ps.py run it against a real PS.
"""

from __future__ import annotations

from typing import Any

import pytest

from netsense.errors import AuthError, PeerError, ProtocolError
from netsense.transport.auth import verify_mac
from netsense.transport.handshake import authenticate, expect_reply
from netsense.transport.wire import Ack, Auth, Challenge, Hello, Welcome

SERVER_NONCE = bytes(range(32))
SECRET = b"s" * 32


class ScriptedConn:
    """Answers each request with the next scripted reply (an exception is raised instead)."""

    def __init__(self, *replies: Any) -> None:
        self.replies = list(replies)
        self.sent: list[tuple[Any, float | None]] = []

    async def request(self, msg: Any, timeout: float | None = None) -> Any:
        self.sent.append((msg, timeout))
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply


async def test_hello_then_an_auth_the_ps_can_verify() -> None:
    welcome = Welcome(version=3, initialized=True, live_workers=1)
    conn = ScriptedConn(Challenge(SERVER_NONCE), welcome)
    got = await authenticate(conn, client_id="w7", rank=2, secret=SECRET, timeout_s=5.0, refused="no")  # type: ignore[arg-type]
    assert got is welcome
    (hello, t1), (auth, t2) = conn.sent
    assert isinstance(hello, Hello) and (hello.worker_id, hello.rank, hello.role) == ("w7", 2, "worker")
    assert isinstance(auth, Auth) and t1 == t2 == 5.0
    verify_mac(SECRET, auth.mac, server_nonce=SERVER_NONCE, client_nonce=hello.client_nonce, worker_id="w7")


async def test_probe_role_and_no_secret_send_a_zero_mac() -> None:
    conn = ScriptedConn(Challenge(SERVER_NONCE), Welcome(version=0, initialized=False, live_workers=0))
    await authenticate(conn, client_id="p", rank=0, secret=None, timeout_s=None, refused="no", role="probe")  # type: ignore[arg-type]
    (hello, _), (auth, _) = conn.sent
    assert hello.role == "probe" and auth.mac == bytes(32)


async def test_refusal_is_an_auth_error_with_the_callers_words() -> None:
    conn = ScriptedConn(Challenge(SERVER_NONCE), PeerError("auth", "bad MAC"))
    with pytest.raises(AuthError, match=r"^PS refused worker 'w1': bad MAC$"):
        await authenticate(conn, client_id="w1", rank=1, secret=SECRET, timeout_s=1.0, refused="PS refused worker 'w1'")  # type: ignore[arg-type]
    other = ScriptedConn(PeerError("busy", "later"))
    with pytest.raises(PeerError, match="busy"):
        await authenticate(other, client_id="w1", rank=1, secret=SECRET, timeout_s=1.0, refused="x")  # type: ignore[arg-type]


async def test_unexpected_reply_is_a_protocol_error() -> None:
    conn = ScriptedConn(Ack(0))
    with pytest.raises(ProtocolError, match="expected CHALLENGE, got ACK"):
        await authenticate(conn, client_id="w1", rank=1, secret=SECRET, timeout_s=1.0, refused="x")  # type: ignore[arg-type]
    assert expect_reply(Ack(1), Ack) == Ack(1)
