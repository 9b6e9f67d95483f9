"""Reaching a PS shard: where it is, how the worker proves who it is, and getting back after a drop.

`ConnectSettings` is what a user passes; `make_client` turns it into a `PSClient`; `connect_first`
and `reconnect` are the backoff loops the exchange runs (on the network thread) when the worker
starts and when a connection is lost.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from aioquic.quic.configuration import QuicConfiguration

from netsense.errors import AuthError, ConfigError, PeerError, PeerTimeout
from netsense.transport.auth import load_secret
from netsense.transport.tls import TransportSettings, client_configuration
from netsense.transport.wire import Params, Welcome

from .client import Identity, PSClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectSettings:
    """Where the PS is and how to trust it / be trusted by it."""

    host: str = "127.0.0.1"
    """PS address."""
    port: int = 4433
    """PS UDP port."""
    ca: str | None = None
    """CA certificate to verify the PS against (from `netsense certs`)."""
    secret_file: str | None = None
    """Shared secret for the HMAC challenge."""
    insecure: bool = False
    """Skip TLS verification and authentication: local experiments only."""
    server_name: str | None = None
    """Name to verify in the PS certificate (default: `host`)."""
    transport: TransportSettings = field(default_factory=TransportSettings)
    """QUIC knobs."""
    connect_timeout_s: float = 10.0
    """One connection attempt (QUIC + TLS handshake) gives up after this long."""
    connect_deadline_s: float = 60.0
    """The first connect keeps trying (with the reconnect backoff) for this long, so a PS that is
    not up yet, or briefly full, does not stop the worker; a handshake the PS or TLS rejects is
    retried for `connect_timeout_s` only (a wrong CA fails the same way every time)."""
    reconnect_deadline_s: float = 300.0
    """After a dropped connection, keep reconnecting (with backoff) for this long, then fail."""
    reconnect_backoff_s: float = 0.2
    """First wait between reconnect attempts; doubles per attempt (with jitter) up to the cap."""
    reconnect_backoff_max_s: float = 5.0
    """Cap of the wait between reconnect attempts."""
    job_id: str = ""
    """The job this worker belongs to (docs/ARCHITECTURE.md, "Job identity"); sent in HELLO."""
    resume: bool = False
    """Continue the job the PS holds even if its id differs (``--resume``)."""
    site: str = ""
    """The site this process runs at (``--site``), sent in HELLO: a PS at another site answers its
    pulls first (docs/ARCHITECTURE.md, "WAN-first release"). "": not said."""
    wan_first: bool = True
    """Push the shards at other sites before this site's own (a worker's step, when the PSs say
    their sites; docs/ARCHITECTURE.md, "WAN pushes first"); the job's ``server.wan_first``."""


def make_client(settings: ConnectSettings, worker_id: str, rank: int) -> PSClient:
    """A (not yet connected) client for one PS shard; a missing CA or secret fails here, before any I/O."""
    return PSClient(
        settings.host,
        settings.port,
        _client_config(settings),
        Identity(worker_id, rank, _secret(settings), settings.job_id, settings.resume, settings.site),
        socket_buffer_bytes=settings.transport.socket_buffer_bytes,
    )


async def connect_first(client: PSClient, settings: ConnectSettings) -> Welcome:
    """Connect + authenticate, retrying with capped exponential backoff and jitter until
    `connect_deadline_s`: workers are often started before their PS listens (the launcher, a
    scheduler), and a PS at its bound of connections mid-handshake refuses a newcomer for a moment."""
    started = time.monotonic()
    deadline = started + settings.connect_deadline_s
    rejected_deadline = started + settings.connect_timeout_s
    delay, attempt = settings.reconnect_backoff_s, 0
    while True:
        attempt += 1
        left = max(0.1, deadline - time.monotonic())
        try:
            connecting = client.connect if attempt == 1 else client.reconnect  # reconnect drops a half-open try
            welcome = await connecting(min(settings.connect_timeout_s, left))
        except (AuthError, PeerTimeout, PeerError, OSError) as exc:
            # `PSClient.connect` words a handshake the peer or TLS ended this way (an unanswered one
            # is "no QUIC handshake ... within"); matched on the words, as errors.py has one AuthError.
            rejected = isinstance(exc, AuthError) and str(exc).startswith("QUIC/TLS handshake with")
            if isinstance(exc, AuthError) and "refused" in str(exc):
                raise  # wrong secret: retrying cannot help
            if time.monotonic() + delay >= (rejected_deadline if rejected else deadline):
                raise
            if attempt == 1:
                log.warning("PS at %s:%d not reachable yet (%s); retrying for up to %.0f s", client.host, client.port, exc,
                            settings.connect_deadline_s)  # fmt: skip
            else:
                log.info("connect attempt %d failed (%s); next in %.2f s", attempt, exc, delay)
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(2 * delay, settings.reconnect_backoff_max_s)
            continue
        if attempt > 1:
            log.warning("connected to the PS at %s:%d after %.2f s (%d attempts)", client.host, client.port,
                        time.monotonic() - started, attempt)  # fmt: skip
        return welcome


async def reconnect(
    client: PSClient, settings: ConnectSettings, cause: Exception, seed: Callable[[], Awaitable[None]] | None
) -> Params:
    """Reconnect with capped exponential backoff, re-authenticate, pull the full parameters.

    `seed` (rank 0 only) re-initializes a PS that restarted without a checkpoint."""
    deadline = time.monotonic() + settings.reconnect_deadline_s
    delay, attempt, started = settings.reconnect_backoff_s, 0, time.monotonic()
    log.warning("connection to the PS lost (%s); reconnecting", cause)
    while True:
        attempt += 1
        try:
            welcome = await client.reconnect(min(settings.connect_timeout_s, max(0.1, deadline - time.monotonic())))
            if not welcome.initialized and seed is not None:
                await seed()  # a PS restarted without a checkpoint: rank 0 seeds it with the current replica
            params = await client.pull(-1, 0)
        except (AuthError, PeerTimeout, PeerError, OSError) as exc:
            if isinstance(exc, AuthError) and "refused" in str(exc):
                raise  # wrong secret: retrying cannot help
            if time.monotonic() + delay >= deadline:
                raise PeerTimeout(
                    f"could not reconnect to the PS within {settings.reconnect_deadline_s} s ({attempt} attempts): {exc}"
                ) from None
            log.info("reconnect attempt %d failed (%s); next in %.2f s", attempt, exc, delay)
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(2 * delay, settings.reconnect_backoff_max_s)
            continue
        log.warning("reconnected to the PS after %.2f s (%d attempts), version %d", time.monotonic() - started, attempt, params.version)
        return params


def _secret(settings: ConnectSettings) -> bytes | None:
    if settings.secret_file:
        return load_secret(settings.secret_file)
    if settings.insecure:
        return None
    raise ConfigError("no shared secret: pass --secret FILE (from `netsense certs`) or --insecure for local experiments")


def _client_config(settings: ConnectSettings) -> QuicConfiguration:
    if settings.ca is not None and not Path(settings.ca).exists():
        raise ConfigError(f"CA file {settings.ca} does not exist; create it with `netsense certs --out DIR`")
    return client_configuration(
        settings.transport, ca=settings.ca, server_name=settings.server_name or settings.host, insecure=settings.insecure
    )
