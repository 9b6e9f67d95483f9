"""Two hosts for real: a worker holds only ``ca.pem`` and ``secret``, TLS failures say why and how to
fix them, and a PS and its workers in different network namespaces train over their own addresses."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from netsense.cli.worker import connect_settings
from netsense.config import JobConfig, override
from netsense.errors import AuthError
from netsense.transport.tls import make_dev_certs
from netsense.worker.connect import ConnectSettings
from netsense.worker.optimizer import NetSenseOptimizer

from ..conftest import RunningPS


def _worker_copy(certs_dir: Path, dest: Path) -> Path:
    """What the README tells an operator to copy to a worker machine: the CA and the secret."""
    dest.mkdir()
    for name in ("ca.pem", "secret"):
        shutil.copy(certs_dir / name, dest / name)
    return dest


def test_a_worker_needs_only_the_ca_and_the_secret(tmp_path: Path) -> None:
    certs = make_dev_certs(tmp_path / "certs")
    worker_dir = _worker_copy(certs.ca.parent, tmp_path / "workercerts")
    config = override(JobConfig(), security__certs_dir=str(worker_dir))
    settings = connect_settings(config, "10.0.0.5", 4433)
    assert settings.ca == str(worker_dir / "ca.pem") and settings.secret_file == str(worker_dir / "secret")


def test_a_worker_missing_its_ca_says_what_to_copy(tmp_path: Path) -> None:
    from netsense.errors import ConfigError

    certs = make_dev_certs(tmp_path / "certs")
    worker_dir = tmp_path / "workercerts"
    worker_dir.mkdir()
    shutil.copy(certs.secret, worker_dir / "secret")
    with pytest.raises(ConfigError, match="ca.pem") as info:
        connect_settings(override(JobConfig(), security__certs_dir=str(worker_dir)), "10.0.0.5", 4433)
    assert "server.key" not in str(info.value)  # never ask a worker for the PS's private key


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


def test_tls_name_mismatch_gives_the_reason_and_the_fix(ps: RunningPS) -> None:
    with pytest.raises(AuthError) as info:
        NetSenseOptimizer(_model(), connect=ps.connect_settings(server_name="not-the-ps.example", connect_timeout_s=5))
    text = str(info.value)
    assert "not-the-ps.example" in text  # the real reason: the name that did not match
    assert not text.rstrip().endswith("failed:")
    assert "--server-name" in text and "--host" in text


def test_no_answer_says_the_port_is_udp(tmp_path: Path) -> None:
    import socket

    certs = make_dev_certs(tmp_path / "certs")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # a UDP port that nobody answers on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(AuthError) as info:
            NetSenseOptimizer(
                _model(),
                connect=ConnectSettings(
                    "127.0.0.1", port, ca=str(certs.ca), secret_file=str(certs.secret), connect_timeout_s=1
                ),
            )
    assert "UDP" in str(info.value) and str(port) in str(info.value)


def test_tls_unknown_ca_gives_the_reason_and_the_ca_path(ps: RunningPS, tmp_path: Path) -> None:
    other = make_dev_certs(tmp_path / "other")
    with pytest.raises(AuthError) as info:
        NetSenseOptimizer(
            _model(),
            connect=ConnectSettings(
                "127.0.0.1", ps.port, ca=str(other.ca), secret_file=str(ps.certs.secret), connect_timeout_s=5
            ),
        )
    text = str(info.value)
    assert str(other.ca) in text and "certificate" in text.lower()
