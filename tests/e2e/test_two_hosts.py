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
                    "127.0.0.1", port, ca=str(certs.ca), secret_file=str(certs.secret), connect_timeout_s=1,
                    connect_deadline_s=2,  # the default retries for 60 s (a PS that starts late): same error, later
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


def _netsense() -> list[str]:
    """The console script an operator types (it does not put the current folder on sys.path)."""
    script = Path(sys.executable).with_name("netsense")
    return [str(script)] if script.exists() else [sys.executable, "-m", "netsense"]


@pytest.mark.slow
def test_ps_and_workers_in_different_namespaces_with_only_ca_and_secret(tmp_path: Path, repo_root: Path) -> None:
    """The README's "Across two machines", literally: certificates made for the PS's own address,
    the workers given only ca.pem, secret and the example config, the PS and the workers in
    different network namespaces (different addresses, routed through a third), no --server-name."""
    from netsense.transport.emulation.netns import NetnsTopology, netns_available

    ok, reason = netns_available()
    if not ok:
        pytest.skip(reason)
    steps = 6
    with NetnsTopology() as topo:
        # Site A, the PS host: certificates that name the address workers dial.
        ps_dir = tmp_path / "site-a"
        ps_dir.mkdir()
        made = subprocess.run(
            [*_netsense(), "certs", "--out", str(ps_dir / "certs"), "--host", topo.server_ip],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        # Site B, the worker host: the two files and the job's config, nothing else.
        site_b = tmp_path / "site-b"
        site_b.mkdir()
        _worker_copy(ps_dir / "certs", site_b / "certs")
        shutil.copy(repo_root / "examples" / "two-site-wan.toml", site_b / "job.toml")
        shutil.copy(repo_root / "examples" / "two-site-wan.toml", ps_dir / "job.toml")
        assert sorted(p.name for p in (site_b / "certs").iterdir()) == ["ca.pem", "secret"]

        ps = topo.popen(
            "server",
            [*_netsense(), "ps", "--config", "job.toml", "--host", topo.server_ip, "--port", "4433", "--certs", "certs"],
            cwd=ps_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert ps.stdout is not None
        ready = json.loads(ps.stdout.readline() or "{}")
        assert ready.get("event") == "ready" and ready["port"] == 4433, ps.stderr.read() if ps.stderr else ""
        workers = [
            topo.popen(
                "client",
                [
                    *_netsense(), "worker", "--config", "job.toml", "--ps", f"{topo.server_ip}:4433", "--rank", str(rank),
                    "--world-size", "2", "--certs", "certs", "--steps", str(steps), "--eval-every", "0",
                    "--summary-json", f"summary-{rank}.json",
                ],
                cwd=site_b, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            for rank in range(2)
        ]
        # Two hosts: the worker side does not hold the PS's address, and the reverse.
        assert topo.server_ip not in _addresses(topo, "client") and topo.client_ip not in _addresses(topo, "server")
        outputs = [w.communicate(timeout=300) for w in workers]
        for rank, (w, (_, err)) in enumerate(zip(workers, outputs)):
            assert w.returncode == 0, f"worker {rank}: {err[-3000:]}"
        ps.terminate()
        out, err = ps.communicate(timeout=30)
    summaries = [json.loads((site_b / f"summary-{rank}.json").read_text()) for rank in range(2)]
    assert all(s["steps"] == steps and s["workers"] == 2 for s in summaries)
    assert 0.0 <= summaries[0]["test_accuracy"] <= 1.0
    stopped = json.loads(out.strip().splitlines()[-1])
    assert stopped["event"] == "stopped" and stopped["version"] == steps and stopped["errors_sent"] == 0
    assert err is not None


def _addresses(topo: object, role: str) -> str:
    return topo.run(role, ["ip", "-o", "-4", "addr", "show"]).stdout  # type: ignore[attr-defined]
