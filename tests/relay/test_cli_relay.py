"""`netsense relay`: every flag checked up front (one line, exit 2), and a real relay process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from netsense.cli import main
from netsense.transport.tls import CertPaths

from .relayhelp import Worker, connect, digits, run_workers, start_ps

ROWS: list[tuple[list[str], str]] = [
    (["relay", "--insecure"], "--ps is required"),
    (["relay", "--ps", "nohost", "--insecure"], "must be HOST:PORT"),
    (["relay", "--ps", "unresolvable.invalid:1", "--insecure"], "--ps: host 'unresolvable.invalid' does not resolve"),
    (["relay", "--ps", "127.0.0.1:1", "--port", "70000", "--insecure"], "--port must be in 0..65535"),
    (["relay", "--ps", "127.0.0.1:1,127.0.0.1:2", "--port", "65535", "--insecure"], "runs past 65535"),
    (["relay", "--ps", "127.0.0.1:1", "--host", "999.1.1.1", "--insecure"], "--host must be an IP address or host name"),
    (["relay", "--ps", "127.0.0.1:1", "--site", "a b", "--insecure"], "--site must be 1-32 characters"),
    (["relay", "--ps", "127.0.0.1:1", "--site-workers", "-1", "--insecure"], "--site-workers must be >= 0, got -1"),
    (["relay", "--ps", "127.0.0.1:1", "--upstream-world", "-2", "--insecure"], "--upstream-world must be >= 0, got -2"),
    (["relay", "--ps", "127.0.0.1:1", "--upstream-codec", "fp17", "--insecure"], "--upstream-codec is not a valid codec"),
    (["relay", "--ps", "127.0.0.1:1", "--upstream-codec", "qsgd:1", "--insecure"], "--upstream-codec is not a valid codec"),
    (["relay", "--ps", "127.0.0.1:1", "--upstream-policy", "bogus", "--insecure"], "--upstream-policy: unknown policy 'bogus'"),
    (["relay", "--ps", "127.0.0.1:1", "--upstream-policy", "fixed", "--insecure"], "--upstream-policy: policy 'fixed' needs a codec"),
    (["relay", "--ps", "127.0.0.1:1", "--decision-log", "d.jsonl", "--insecure"], "--decision-log logs the adaptive push"),
    (["relay", "--ps", "127.0.0.1:1", "--upstream-policy", "netsense", "--decision-log", "{tmp}/no/d.jsonl", "--insecure"],
     "--decision-log"),
    (["relay", "--ps", "127.0.0.1:1", "--barrier-timeout", "0", "--insecure"], "--barrier-timeout must be > 0"),
    (["relay", "--ps", "127.0.0.1:1", "--max-datagram-size", "10", "--insecure"], "--max-datagram-size must be in 1200..65507"),
    (["relay", "--ps", "127.0.0.1:1", "--idle-timeout", "-1", "--insecure"], "--idle-timeout"),
    (["relay", "--ps", "127.0.0.1:1", "--job-id", "bad id!", "--insecure"], "--job-id"),
    (["relay", "--ps", "127.0.0.1:1", "--certs", "{tmp}"], "netsense certs"),
]


@pytest.mark.parametrize(("argv", "message"), ROWS, ids=[" ".join(a) for a, _ in ROWS])
def test_bad_relay_flag_is_one_line_and_exit_2(argv: list[str], message: str, tmp_path: Path, capsys) -> None:
    argv = [str(tmp_path / "none") if a == "{tmp}" else a.replace("{tmp}", str(tmp_path)) for a in argv]
    capsys.readouterr()
    try:
        status = main(argv)
    except SystemExit as exc:
        status = exc.code
    assert status == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert message in lines[0], lines[0]


@pytest.mark.slow
def test_relay_command_serves_a_site(certs: CertPaths, tmp_path: Path) -> None:
    """`netsense relay` as its own process: ready line, two workers train through it under the
    adaptive push (`--upstream-policy`), SIGTERM stops it with its WAN byte counts and levels.
    Slow: a fresh interpreter imports torch (9 s at load 13)."""
    ps = start_ps(certs)
    folder = Path(certs.ca).parent
    log = tmp_path / "relay.jsonl"
    cmd = [sys.executable, "-m", "netsense", "relay", "--ps", f"127.0.0.1:{ps.port}", "--port", "0", "--site", "b",
           "--site-workers", "2", "--certs", str(folder), "--upstream-policy", "netsense", "--decision-log", str(log)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        assert ready["event"] == "ready" and ready["site"] == "b", ready
        port = ready["ports"][0]
        run_workers([Worker(r, 2, connect(certs, port), 3, digits()) for r in range(2)])
        assert ps.call(lambda: ps.server.store.version) == 3
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        stopped = json.loads(out.strip().splitlines()[-1])
        assert proc.returncode == 0, err
        assert stopped["event"] == "stopped" and stopped["wan_bytes_sent"] > 0 and stopped["error"] is None
        assert sum(stopped["levels"].values()) == 3, stopped
        (phases,) = stopped["phases"]  # one upstream shard: its 3 site steps timed
        assert phases["steps"] == 3 and phases["push_s"] > 0, stopped
        lines = [json.loads(x) for x in log.read_text().splitlines()]
        assert [(x["step"], x["worker_id"], x["policy"]) for x in lines] == [(s, "relay-b", "netsense") for s in range(3)]
    finally:
        if proc.poll() is None:
            proc.kill()
        ps.stop()


def test_relay_takes_no_checkpoint_settings_from_the_job_config(tmp_path: Path) -> None:
    """A job's TOML names its PS shards' checkpoint folder; the relay it is also given holds no
    state, so it must not try to checkpoint (it would stop at its first step)."""
    import argparse

    from netsense.cli.relay import register, settings_from_args
    from netsense.config import JobConfig, override
    from netsense.devcerts import ensure_certs

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["relay", "--ps", "127.0.0.1:4433", "--insecure"])
    config = override(JobConfig(), server__checkpoint_dir=str(tmp_path / "ckpt"), server__checkpoint_every_s=5.0,
                      security__insecure=True)  # fmt: skip
    server = settings_from_args(args, config, ensure_certs(str(tmp_path / "certs"), create=True)).server
    assert server.checkpoint_dir is None and server.checkpoint_every_steps == 0 and server.checkpoint_every_s == 0


def test_relay_runs_the_policy_over_the_configs_ladder(tmp_path: Path) -> None:
    import argparse

    from netsense.cli.relay import register, settings_from_args
    from netsense.config import JobConfig, override
    from netsense.devcerts import ensure_certs

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["relay", "--ps", "127.0.0.1:4433", "--insecure", "--upstream-policy", "dc2"])
    config = override(JobConfig(), train__ladder="fp32,fp16,qsgd:8", security__insecure=True)
    settings = settings_from_args(args, config, ensure_certs(str(tmp_path / "certs"), create=True))
    assert (settings.upstream_policy, settings.ladder, settings.decision_log) == ("dc2", "fp32,fp16,qsgd:8", None)


def test_relay_prices_its_push_from_the_configs_progress_table(tmp_path: Path) -> None:
    """`launch` hands the relay the job's config: a `netsense` push reads its up table."""
    import argparse

    from netsense.cli.relay import register, settings_from_args
    from netsense.compression.policy.calibration import progress_table_json
    from netsense.config import JobConfig, override
    from netsense.devcerts import ensure_certs
    from netsense.relay.server import _adaptive

    table = tmp_path / "q.json"
    table.write_text(progress_table_json({"up": {"powersgd:2": 0.61}, "down": {"powersgd:2": 0.4}}, {}))
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["relay", "--ps", "127.0.0.1:4433", "--insecure", "--upstream-policy", "netsense"])
    config = override(JobConfig(), train__policy="netsense", train__progress_table=str(table), security__insecure=True)
    settings = settings_from_args(args, config, ensure_certs(str(tmp_path / "certs"), create=True))
    adaptive = _adaptive(settings, 0)
    assert adaptive is not None
    try:
        policy = adaptive.policy
        level = policy.ladder.find("powersgd:2")
        assert level is not None and policy.progress.pinned[level] and policy.progress[level] == 0.61
    finally:
        adaptive.close()


def test_relay_ignores_the_jobs_downlink_policy_and_checkpoints(tmp_path: Path) -> None:
    """`launch` gives the relay the job's config, whose downlink policy is its PS shards' (a relay
    fans out the upstream's bytes and has no `set_downlink`): the relay must not run one."""
    from netsense.ps.server import ServerSettings
    from netsense.relay import Relay, RelaySettings
    from netsense.worker.connect import ConnectSettings

    server = ServerSettings(policy="fp16", decision_log=str(tmp_path / "d.jsonl"), checkpoint_dir=str(tmp_path / "c"))
    relay = Relay(RelaySettings(upstream=(ConnectSettings("127.0.0.1", 1, insecure=True),), server=server), secret=None)
    assert all(s.downlink is None and s.settings.checkpoint_dir is None for s in relay.shards)
