"""`PSClient`: the worker's connection to one PS shard (handshake, init, push, pull).

Async and byte-level only; it knows messages, not models. Training code lives in `sync.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from aioquic.quic.configuration import QuicConfiguration

from netsense.compression import Payload
from netsense.errors import AuthError, ProtocolError
from netsense.transport.channel import ClientConnection, open_connection
from netsense.transport.handshake import authenticate
from netsense.transport.sensing.aioquic_private import StreamSendState, stream_send_state, stream_unsent, transport_of
from netsense.transport.wire import Ack, Bye, Init, Limits, Params, Probe, Pull, Push, TensorInfo, Welcome

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Identity:
    """Who a worker is and how it proves it."""

    worker_id: str
    """Stable name (a restarted worker reuses it, so the PS sees a rejoin)."""
    rank: int
    """Rank; 0 provides the initial parameters."""
    secret: bytes | None
    """Shared secret for the HMAC challenge; None only against an --insecure PS."""
    job_id: str = ""
    """The job (docs/ARCHITECTURE.md, "Job identity"); a PS holding another job's state refuses it."""
    resume: bool = False
    """Continue whatever job the PS holds, even under another id."""
    site: str = ""
    """The site this worker (or relay) runs at, sent in HELLO ("" : not said)."""


@dataclass
class PushHandle:
    """Where one PUSH travels: its connection and stream, set when it is written."""

    conn: ClientConnection | None = None
    stream_id: int | None = None

    def send_state(self) -> StreamSendState | None:
        """How far the push's bytes have got (None before it started or once aioquic dropped it)."""
        if self.conn is None or self.stream_id is None:
            return None
        return stream_send_state(self.conn.quic, self.stream_id)


def handshake_fix(reason: str, configuration: QuicConfiguration) -> str:
    """What to do about a failed TLS handshake, from its reason: the two mistakes of a two-host set-up
    are a certificate made for another name and a CA copied from another `netsense certs` run."""
    if "match" in reason:
        return (
            f"; the PS certificate does not name {configuration.server_name!r}: pass --server-name with a name "
            "it carries, or re-make it on the PS with `netsense certs --host <the name or IP workers dial>`"
        )
    if "certificate" in reason.lower() or "issuer" in reason.lower():
        return (
            f"; the PS certificate does not verify against the CA {configuration.cafile}: copy ca.pem from the "
            "PS's `netsense certs` folder into this worker's --certs folder"
        )
    return ""


@dataclass(frozen=True)
class StepFields:
    """What every PUSH of the current step carries besides its gradients: the optimizer's
    hyper-parameters (one map per param group) and the skip flag. The optimizer sets them on the
    training thread before the step's first push leaves; retries of the step resend the same."""

    hparams: tuple[dict[str, float], ...] = ()
    key_groups: dict[str, int] = field(default_factory=dict)
    """Key -> param group, for keys outside group 0."""
    skip: bool = False
    keeps: bool = False
    """The pusher keeps its pushes until the update (`Push.keeps`): a worker, never a relay."""
    intent: str = ""
    """The level the uplink policy is heading for (`Push.intent`; empty: none)."""

    def push(self, step: int, samples: int, total_keys: int, grads: dict[str, Payload]) -> Push:
        groups = {k: self.key_groups[k] for k in grads if k in self.key_groups}
        return Push(step, samples, total_keys, grads, self.hparams, groups, self.skip, self.keeps, self.intent)


class PSClient:
    """A connected, authenticated channel to one PS."""

    def __init__(
        self,
        host: str,
        port: int,
        configuration: QuicConfiguration,
        identity: Identity,
        *,
        limits: Limits = Limits(),
        request_timeout_s: float = 600.0,
        socket_buffer_bytes: int = 8 << 20,
    ) -> None:
        self.host, self.port = host, port
        self.configuration = configuration
        self.identity = identity
        self.limits = limits
        self.timeout = request_timeout_s
        self.socket_buffer_bytes = socket_buffer_bytes
        self._stack = contextlib.AsyncExitStack()
        self.conn: ClientConnection | None = None
        self.welcome: Welcome | None = None
        self._bytes_base = (0, 0)  # traffic of connections closed by `reconnect`
        self._keepalive: asyncio.Future[None] | None = None
        self.step_fields = StepFields()
        """Extra fields of this step's PUSHes (`StepFields`)."""
        self.delivered: tuple[int, float] | None = None
        """The latest (wire bytes, seconds) a PUSH's ACK reported for an update's return, until
        `take_delivered`: one copy's bytes, and the first write to the last delivery on the PS."""

    async def connect(self, connect_timeout_s: float = 10.0) -> Welcome:
        """Open the QUIC connection (TLS verified per the configuration) and authenticate."""
        try:
            cm = open_connection(
                self.host, self.port, self.configuration, limits=self.limits, socket_buffer_bytes=self.socket_buffer_bytes
            )
            self.conn = await asyncio.wait_for(self._stack.enter_async_context(cm), connect_timeout_s)
        except ConnectionError as exc:
            await self._stack.aclose()
            raise AuthError(
                f"QUIC/TLS handshake with {self.host}:{self.port} failed: {exc or 'connection closed'}"
                f"{handshake_fix(str(exc), self.configuration)}"
            ) from None
        except asyncio.TimeoutError:
            await self._stack.aclose()
            raise AuthError(
                f"no QUIC handshake with {self.host}:{self.port} within {connect_timeout_s:.3g} s "
                f"(PS down, wrong address or port, or a firewall dropping UDP: QUIC runs over UDP, so UDP port "
                f"{self.port} must be open from this host to the PS)"
            ) from None
        ident = self.identity
        self.welcome = await authenticate(
            self.conn, client_id=ident.worker_id, rank=ident.rank, secret=ident.secret,
            timeout_s=self.timeout, refused=f"PS {self.host}:{self.port} refused worker {ident.worker_id!r}",
            job_id=ident.job_id, resume=ident.resume, site=ident.site,
        )  # fmt: skip
        w = self.welcome
        if w.initialized and w.version > 0 and w.job_id:
            log.warning("resuming job %s at version %d (PS %s:%d)", w.job_id, w.version, self.host, self.port)
        self._keepalive = asyncio.ensure_future(self._keep_alive(self.conn))
        return self.welcome

    async def _keep_alive(self, conn: ClientConnection) -> None:
        """PING a third of the idle timeout after the last ping, so a worker waiting at the barrier
        is not idle-closed; a dead PS still is (pings go unanswered), which triggers a reconnect."""
        interval = max(0.2, (self.configuration.idle_timeout or 60.0) / 3)
        while conn.closed_reason is None:
            await asyncio.sleep(interval)
            if conn.closed_reason is None:
                conn.quic.send_ping(0)
                conn.transmit()

    async def _request(self, msg: Any, expect: type, handle: PushHandle | None = None) -> Any:
        assert self.conn is not None, "connect() first"
        on_stream = None
        if handle is not None:
            handle.conn = self.conn

            def on_stream(sid: int) -> None:
                handle.stream_id = sid

        reply = await self.conn.request(msg, self.timeout, on_stream=on_stream)
        if not isinstance(reply, expect):
            raise ProtocolError("type", f"expected {expect.__name__.upper()}, got {type(reply).__name__.upper()}")
        return reply

    async def init(
        self, tensors: dict[str, Payload], optimizer: dict[str, Any], world_size: int = 1, model: dict[str, TensorInfo] | None = None
    ) -> int:
        """Rank 0: hand the PS its initial parameters (and `model`, their state_dict names); returns the PS version."""
        return (await self._request(Init(tensors, optimizer, world_size, model or {}), Ack)).version

    async def probe(self, nbytes: int) -> None:
        """Send `nbytes` of filler the PS acknowledges and drops (PROBE): a path measurement."""
        await self._request(Probe(bytes(nbytes)), Ack)

    async def push(
        self,
        step: int,
        samples: int,
        total_keys: int,
        grads: dict[str, Payload],
        *,
        sent: asyncio.Future[None] | None = None,
        handle: PushHandle | None = None,
    ) -> int:
        """Send one bucket of gradients for `step`; returns the PS version after it. `sent` is set
        once every byte of the PUSH has left (before the ACK: pipelined pushes pace on it);
        `handle` names the push's stream, so that `abandon(handle)` can withdraw it."""
        if sent is None or self.conn is None:
            return self._acked(await self._request(self.step_fields.push(step, samples, total_keys, grads), Ack, handle))
        # `request` opens this stream id without yielding first, so the watcher follows the right stream.
        watcher = asyncio.ensure_future(_until_sent(self.conn, self.conn.quic.get_next_available_stream_id(), sent))
        try:
            return self._acked(await self._request(self.step_fields.push(step, samples, total_keys, grads), Ack, handle))
        finally:
            watcher.cancel()
            if not sent.done():
                sent.set_result(None)

    def _acked(self, ack: Ack) -> int:
        """A PUSH's ACK: keep its delivery report, if any; the PS version it names."""
        if ack.delivered_bytes > 0:
            self.delivered = (ack.delivered_bytes, ack.delivered_s)
        return ack.version

    def take_delivered(self) -> tuple[int, float] | None:
        """The delivery report kept since the last call (`delivered`), then None."""
        delivered, self.delivered = self.delivered, None
        return delivered

    def abandon(self, handle: PushHandle) -> bool:
        """Withdraw the push of `handle` if its last byte has not left (see `ClientConnection.abandon`):
        its `push()` raises `RequestAbandoned` and the PS drops the partial message. False once
        it was sent whole, on another (older) connection, or not started."""
        conn = handle.conn
        return conn is not None and conn is self.conn and handle.stream_id is not None and conn.abandon(handle.stream_id)

    async def pull(self, have_version: int, wait_for: int, keys: tuple[str, ...] = ()) -> Params:
        """Parameters at version >= `wait_for` (a delta when `have_version` allows it); with `keys`,
        only those, as soon as the PS has applied them for `wait_for` (a pipelined pull)."""
        return await self._request(Pull(have_version, wait_for, keys), Params)

    async def reconnect(self, connect_timeout_s: float = 10.0) -> Welcome:
        """Drop the current connection (no BYE: it is presumed dead) and connect + authenticate afresh."""
        old = self.conn
        if self._keepalive is not None:
            self._keepalive.cancel()
        if old is not None:
            self._bytes_base = (self.bytes_sent, self.bytes_received)
            self.conn = None
            try:
                await asyncio.wait_for(self._stack.aclose(), 1.0)
            except (asyncio.TimeoutError, Exception) as exc:  # noqa: BLE001 - a dead connection may fail to close
                log.debug("closing the old connection: %r", exc)
            transport = transport_of(old)
            if transport is not None:
                transport.close()  # an interrupted close would leak the UDP socket
        self._stack = contextlib.AsyncExitStack()
        return await self.connect(connect_timeout_s)

    @property
    def bytes_sent(self) -> int:
        return self._bytes_base[0] + (self.conn.bytes_out if self.conn else 0)

    @property
    def bytes_received(self) -> int:
        return self._bytes_base[1] + (self.conn.bytes_in if self.conn else 0)

    async def close(self, reason: str = "done") -> None:
        """Say BYE (best effort) and close the connection."""
        if self.conn is not None and self.conn.closed_reason is None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._request(Bye(reason), Ack), 2.0)
        if self._keepalive is not None:
            self._keepalive.cancel()
        await self._stack.aclose()
        self.conn = None


async def _until_sent(conn: ClientConnection, stream_id: int, sent: asyncio.Future[None], poll_s: float = 0.002) -> None:
    """Resolve `sent` once `stream_id` has no unsent bytes (polled: aioquic has no event for it)."""
    await asyncio.sleep(0)  # the request writes the stream first
    while stream_unsent(conn.quic, stream_id):
        await asyncio.sleep(poll_s)
    if not sent.done():
        sent.set_result(None)
