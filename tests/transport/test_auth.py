"""HMAC challenge-response and secret-file handling."""

from __future__ import annotations

import os

import pytest

from netsense.errors import AuthError, ConfigError
from netsense.transport.auth import auth_mac, load_secret, new_nonce, verify_mac, write_secret


def test_mac_binds_both_nonces_and_the_worker_id() -> None:
    s, sn, cn = b"k" * 32, new_nonce(), new_nonce()
    mac = auth_mac(s, server_nonce=sn, client_nonce=cn, worker_id="w1")
    verify_mac(s, mac, server_nonce=sn, client_nonce=cn, worker_id="w1")
    for kwargs in (
        {"server_nonce": new_nonce(), "client_nonce": cn, "worker_id": "w1"},  # replay on a new challenge
        {"server_nonce": sn, "client_nonce": new_nonce(), "worker_id": "w1"},
        {"server_nonce": sn, "client_nonce": cn, "worker_id": "w2"},
    ):
        with pytest.raises(AuthError):
            verify_mac(s, mac, **kwargs)
    with pytest.raises(AuthError):
        verify_mac(b"x" * 32, mac, server_nonce=sn, client_nonce=cn, worker_id="w1")


def test_secret_files(tmp_path, caplog) -> None:
    p = tmp_path / "secret"
    write_secret(p)
    assert oct(p.stat().st_mode & 0o777) == "0o600"
    assert len(load_secret(p)) == 64
    with pytest.raises(ConfigError, match="does not exist"):
        load_secret(tmp_path / "missing")
    (tmp_path / "short").write_text("abc")
    with pytest.raises(ConfigError, match="at least 16"):
        load_secret(tmp_path / "short")
    os.chmod(p, 0o644)
    load_secret(p)
    assert "readable by group or others" in caplog.text
    assert p.read_text().strip() not in caplog.text  # the secret itself never reaches the log
