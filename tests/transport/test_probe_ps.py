"""`netsense probe --ps`: PROBE messages over an authenticated connection that never joins training."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from netsense.cli import main
from netsense.errors import AuthError
from netsense.transport.emulation.probe import probe_ps
from netsense.transport.tls import TransportSettings, client_configuration
from netsense.errors import ProtocolError
from netsense.transport.auth import load_secret
from netsense.transport.wire import Hello, Limits, Probe, decode_message, encode_message


def _config(ps):  # type: ignore[no-untyped-def]
    return client_configuration(TransportSettings(), ca=str(ps.certs.ca), server_name="127.0.0.1")


def test_probe_measures_the_ps_path_without_joining(ps) -> None:  # type: ignore[no-untyped-def]
    result = asyncio.run(probe_ps("127.0.0.1", ps.port, _config(ps), 1.0, secret=load_secret(ps.certs.secret)))
    assert result.goodput_mbit > 0 and result.samples > 0 and result.min_rtt_ms is not None
    assert ps.call(lambda: (dict(ps.server.sessions), set(ps.server.store.live))) == ({}, set())


def test_probe_with_a_wrong_secret_is_refused(ps) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(AuthError, match="refused"):
        asyncio.run(probe_ps("127.0.0.1", ps.port, _config(ps), 0.2, secret=b"x" * 32))


def test_cli_probe_ps_writes_json(ps, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "p.json"
    args = ["probe", "--ps", f"127.0.0.1:{ps.port}", "--ca", str(ps.certs.ca), "--secret", str(ps.certs.secret)]
    assert main([*args, "--seconds", "0.5", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["ps"] == f"127.0.0.1:{ps.port}" and doc["goodput_mbit"] > 0
    assert main(["probe", "--ps", "nohostport", "--insecure"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err


def test_wire_probe_and_role() -> None:
    hello = Hello("p", 0, bytes(32), role="probe")
    assert decode_message(encode_message(hello)) == hello
    assert decode_message(encode_message(Probe(b"abc"))) == Probe(b"abc")
    with pytest.raises(ProtocolError, match="oversize"):
        decode_message(encode_message(Probe(bytes(11))), Limits(max_probe_bytes=10))
    with pytest.raises(ProtocolError, match="role"):
        decode_message(encode_message(Hello("p", 0, bytes(32), role="admin")))
