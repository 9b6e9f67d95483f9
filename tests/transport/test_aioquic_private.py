"""transport/sensing/aioquic_private.py: the private aioquic state NetSense reads still exists on
the pinned aioquic, and no other module reads it.

An aioquic upgrade that moves an attribute fails here, naming it, before anything downstream
misbehaves. The connection tests drive a real in-memory client/server pair (`quic_pair.py`).
"""

from __future__ import annotations

import re
import time
import tomllib
from pathlib import Path
from types import SimpleNamespace

import aioquic
import pytest
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import QuicServer
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import StreamDataReceived, StreamReset

from quic_pair import MDS, Pair, loaded_pair
from netsense.transport.channel import abandon_stream
from netsense.transport.sensing import aioquic_private
from netsense.transport.sensing.aioquic_private import (
    PRIVATE_PATHS,
    PROTOCOL_PRIVATE_PATHS,
    SERVER_PRIVATE_PATHS,
    TESTED_AIOQUIC_VERSION,
    QuicInternalsError,
)
from netsense.transport.sensing.congestion import SensingReno

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("compression", "transport", "ps", "worker", "netsense")
"""The folders installed as netsense.* (pyproject.toml's package-dir)."""
PRIVATE_MODULE = REPO / "transport" / "sensing" / "aioquic_private.py"
PRIVATE_READ = re.compile(
    r"""(?:\.|["'])(_quic|_loss|_cc|_pacer|_network_paths|_streams|_close_event|_pacing_at"""
    r"""|_max_datagram_size|_pto_count|_rtt_\w+|_local_max_\w+|_transport)\b"""
)
"""An attribute read (``x._loss``) or a getattr name (``"_loss"``) of aioquic's private state
(``_transport`` of a protocol or server too; ``_loop`` is left out: the emulator has its own)."""


@pytest.fixture
def pair() -> Pair:
    return loaded_pair()


def test_aioquic_is_the_tested_version() -> None:
    """The installed and the pinned aioquic are the release the private paths were written for."""
    pins = [d for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"] if d.startswith("aioquic")]
    assert pins == [f"aioquic=={TESTED_AIOQUIC_VERSION}"], "re-check transport/sensing/aioquic_private.py, then the pin"
    assert aioquic.__version__ == TESTED_AIOQUIC_VERSION, (
        f"aioquic {aioquic.__version__} is installed, the private paths are for {TESTED_AIOQUIC_VERSION}"
    )


def test_private_paths_exist_on_a_real_connection(pair: Pair) -> None:
    """Fails naming the attribute if an aioquic upgrade moved any private path we read."""
    for quic in (pair.client, pair.server):
        for path in PRIVATE_PATHS:
            try:
                aioquic_private._resolve(quic, path)
            except QuicInternalsError as exc:
                pytest.fail(f"aioquic internals moved: {exc}")
        aioquic_private.check_internals(quic)


async def test_protocol_and_server_private_paths_exist() -> None:
    """The asyncio side: a protocol's connection, loop and transport, a server's transport."""
    quic = QuicConnection(configuration=QuicConfiguration(is_client=True))
    protocol = QuicConnectionProtocol(quic)
    for path in PROTOCOL_PRIVATE_PATHS:
        try:
            aioquic_private._resolve(protocol, path, "QuicConnectionProtocol")
        except QuicInternalsError as exc:
            pytest.fail(f"aioquic internals moved: {exc}")
    assert aioquic_private.connection_of(protocol) is quic
    assert aioquic_private.transport_of(protocol) is None  # not connected yet
    aioquic_private.use_monotonic_clock(protocol)
    assert abs(protocol._loop.time() - time.monotonic()) < 0.01
    server = QuicServer(configuration=QuicConfiguration(is_client=False))
    for path in SERVER_PRIVATE_PATHS:
        aioquic_private._resolve(server, path, "QuicServer")
    assert aioquic_private.transport_of(server) is None


def test_stream_unsent_follows_the_send_buffer() -> None:
    """The pipelined pushes' pacing reads a private per-stream flag: True while bytes wait to be
    sent once, False when all left; an unknown stream is not unsent; a moved flag is named."""
    p = Pair()
    stream = p.client.get_next_available_stream_id()
    p.client.send_stream_data(stream, b"x" * 50_000, end_stream=True)
    assert aioquic_private.stream_unsent(p.client, stream)
    p.exchange(rounds=20)
    assert not aioquic_private.stream_unsent(p.client, stream)
    assert not aioquic_private.stream_unsent(p.client, stream + 400)
    with pytest.raises(QuicInternalsError, match="buffer_is_empty"):
        aioquic_private._resolve(object(), aioquic_private.STREAM_UNSENT_PATH)


def test_stream_send_state_and_abandon_only_before_the_fin_left() -> None:
    """A withdrawn push reads a stream's acked prefix, highest sent offset and final size, and is
    reset only while its last byte has not left; the peer then sees a reset, never the message."""
    p = Pair()
    stream = p.client.get_next_available_stream_id()
    p.client.send_stream_data(stream, b"x" * 2_000_000, end_stream=True)
    p.exchange(rounds=3)
    state = aioquic_private.stream_send_state(p.client, stream)
    assert state is not None and state.final == 2_000_000
    assert 0 < state.acked <= state.sent < state.final and not state.fin_sent
    assert abandon_stream(p.client, stream)
    received: list[object] = []
    for _ in range(10):
        p.exchange(rounds=1)
        while (event := p.server.next_event()) is not None:
            received.append(event)
    assert any(isinstance(e, StreamReset) and e.stream_id == stream for e in received)
    assert not any(isinstance(e, StreamDataReceived) and e.end_stream for e in received)
    assert aioquic_private.stream_send_state(p.client, stream + 4) is None

    whole = p.client.get_next_available_stream_id()
    p.client.send_stream_data(whole, b"y" * 5_000, end_stream=True)
    p.exchange(rounds=1)
    assert aioquic_private.stream_send_state(p.client, whole).fin_sent  # type: ignore[union-attr]
    assert not abandon_stream(p.client, whole)
    open_stream = p.client.get_next_available_stream_id()
    p.client.send_stream_data(open_stream, b"z" * 10, end_stream=False)
    assert not abandon_stream(p.client, open_stream)  # no final size yet: not a request
    with pytest.raises(QuicInternalsError, match="_buffer_fin"):
        aioquic_private._resolve(SimpleNamespace(sender=SimpleNamespace(_buffer_start=0, highest_offset=0)), aioquic_private.STREAM_SEND_PATHS[2])


def test_receive_windows_are_raised_for_open_and_new_streams() -> None:
    """The PS's pre-authentication gate: the connection window and a stream's window grow on
    request (and only grow), and the peer learns the new limits (MAX_DATA / MAX_STREAM_DATA)."""
    p = Pair()
    stream = p.client.get_next_available_stream_id()
    p.client.send_stream_data(stream, b"x" * 1000)
    p.exchange(rounds=3)
    used = aioquic_private.received_stream_bytes(p.server)
    assert used == 1000
    before = p.server._local_max_data.value
    aioquic_private.raise_receive_window(p.server, before * 4, 1 << 30)
    aioquic_private.raise_receive_window(p.server, 1, 1)  # never shrinks
    assert p.server._local_max_data.value == before * 4
    assert aioquic_private._resolve(p.server._streams[stream], aioquic_private.STREAM_WINDOW_PATH) == 1 << 30
    p.exchange(rounds=3)
    assert p.client._remote_max_data == before * 4
    assert p.client._streams[stream].max_stream_data_remote == 1 << 30
    aioquic_private.raise_stream_window(p.server, stream + 400, 1 << 30)  # unknown stream: nothing


def test_recovery_state_has_plausible_values(pair: Pair) -> None:
    rec = aioquic_private.read_recovery(pair.client)
    assert rec.congestion_window >= 2 * MDS
    assert rec.bytes_in_flight >= 0
    assert rec.srtt_s == pytest.approx(2 * Pair.DELAY, rel=0.5)
    assert rec.min_rtt_s == pytest.approx(2 * Pair.DELAY, rel=0.2)
    assert rec.latest_rtt_s is not None and rec.rttvar_s is not None
    assert rec.pto_count == 0
    assert rec.pacing_rate_Bps and rec.pacing_rate_Bps > 0
    assert rec.bytes_sent > 200_000
    assert rec.max_datagram_size == MDS
    assert type(aioquic_private.congestion_control(pair.client)) is SensingReno


def test_missing_private_attribute_is_named() -> None:
    loss = SimpleNamespace(_cc=SimpleNamespace(congestion_window=1, bytes_in_flight=0, ssthresh=None))
    fake = SimpleNamespace(_loss=loss)
    with pytest.raises(QuicInternalsError, match=r"QuicConnection\._loss\._rtt_smoothed does not exist"):
        aioquic_private.check_internals(fake)  # type: ignore[arg-type]


def test_connection_reads_go_through_small_functions(pair: Pair) -> None:
    """The readers the rest of the repo calls return what aioquic holds."""
    assert aioquic_private.peer_host(pair.client) == "10.0.0.2"
    assert aioquic_private.smoothed_rtt(pair.client) == pytest.approx(2 * Pair.DELAY, rel=0.5)
    assert aioquic_private.smoothed_rtt(object()) is None
    assert not aioquic_private.is_closing(pair.client)
    pair.client.close()
    assert aioquic_private.is_closing(pair.client)


def test_no_other_module_reads_aioquic_privates() -> None:
    """Every private read sits in aioquic_private.py, so an upgrade changes one file."""
    files = sorted(f for package in PACKAGES for f in (REPO / package).rglob("*.py"))
    assert PRIVATE_MODULE in files and len(files) > 50, "the scan must see the packages"
    assert PRIVATE_READ.search(PRIVATE_MODULE.read_text()), "the pattern must match the private reads"
    offenders = [
        f"{f.relative_to(REPO)}:{number}: {line.strip()}"
        for f in files
        if f != PRIVATE_MODULE
        for number, line in enumerate(f.read_text().splitlines(), 1)
        if PRIVATE_READ.search(line)
    ]
    assert not offenders, "read aioquic's private state through transport/sensing/aioquic_private.py:\n" + "\n".join(offenders)
