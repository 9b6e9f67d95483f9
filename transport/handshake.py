"""The client side of the PS handshake: HELLO -> CHALLENGE -> AUTH -> WELCOME.

Workers and `netsense probe --ps` authenticate the same way (the MAC of `auth.py` over the server's
and the client's nonce and the client's id); only their role and what they do afterwards differ,
so the exchange is written once, here. The server side is `ps/session.py` (`WorkerSession`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from netsense.errors import AuthError, ConfigError, PeerError, ProtocolError

from .auth import auth_mac, new_nonce
from .wire import Auth, Challenge, Hello, Message, Welcome

if TYPE_CHECKING:
    from .channel import ClientConnection

M = TypeVar("M", bound=Message)


def expect_reply(reply: Message, expect: type[M]) -> M:
    """`reply` if it is an `expect`, else a `ProtocolError` naming both message types."""
    if not isinstance(reply, expect):
        raise ProtocolError("type", f"expected {expect.__name__.upper()}, got {type(reply).__name__.upper()}")
    return reply


async def authenticate(
    conn: ClientConnection,
    *,
    client_id: str,
    rank: int,
    secret: bytes | None,
    timeout_s: float | None,
    refused: str,
    role: str = "worker",
    job_id: str = "",
    resume: bool = False,
    site: str = "",
) -> Welcome:
    """Prove `client_id` to the PS on `conn` and return its WELCOME.

    `secret` None sends an all-zero MAC, which only an --insecure PS accepts. A PS that refuses
    (ERROR ``auth``) raises `AuthError` with `refused` before its reason; one that holds another
    job (ERROR ``job``: `job_id` differs and `resume` is not set) a `ConfigError`, which no retry
    can mend; `timeout_s` bounds each of the two requests."""

    async def request(msg: Any, expect: type[M]) -> M:
        try:
            reply = await conn.request(msg, timeout_s)
        except PeerError as exc:
            if exc.code == "auth":
                raise AuthError(f"{refused}: {exc.reason}") from None
            if exc.code == "job":
                raise ConfigError(f"{refused}: {exc.reason}") from None
            raise
        return expect_reply(reply, expect)

    nonce = new_nonce()
    challenge = await request(Hello(client_id, rank, nonce, role=role, job_id=job_id, resume=resume, site=site), Challenge)
    mac = (
        bytes(32)
        if secret is None
        else auth_mac(secret, server_nonce=challenge.server_nonce, client_nonce=nonce, worker_id=client_id)
    )
    return await request(Auth(mac), Welcome)
