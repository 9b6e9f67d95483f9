"""Dead-peer detection in seconds: `TransportSettings.idle_timeout_s` (10 s by default, > 0), set
from TOML or `--idle-timeout` on ps / worker / launch, reaches the QUIC configuration on both
sides (workers ping every third of it, `worker/client.py`)."""

from __future__ import annotations

import math

import pytest

from netsense.cli import build_parser
from netsense.cli.flags import resolve_config
from netsense.config import load_config
from netsense.errors import ConfigError
from netsense.transport.tls import TransportSettings, client_configuration


def test_default_idle_timeout_notices_a_dead_peer_in_seconds() -> None:
    settings = TransportSettings()
    assert settings.idle_timeout_s == 10.0
    assert client_configuration(settings, ca=None, server_name="x", insecure=True).idle_timeout == 10.0


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan])
def test_idle_timeout_must_be_positive(bad: float) -> None:
    with pytest.raises(ConfigError, match="idle_timeout_s must be > 0"):
        TransportSettings(idle_timeout_s=bad)


@pytest.mark.parametrize("command", ["ps", "worker", "launch"])
def test_idle_timeout_flag_on_every_job_command(command: str) -> None:
    args = build_parser().parse_args([command, "--idle-timeout", "2.5"])
    assert resolve_config(args).transport.idle_timeout_s == 2.5
    with pytest.raises(ConfigError, match="idle-timeout must be > 0"):
        resolve_config(build_parser().parse_args([command, "--idle-timeout", "0"]))


def test_idle_timeout_from_toml(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "job.toml"
    cfg.write_text("[transport]\nidle_timeout_s = 4.0\n")
    assert load_config(cfg).transport.idle_timeout_s == 4.0
    cfg.write_text("[transport]\nidle_timeout_s = -3.0\n")
    with pytest.raises(ConfigError, match="idle_timeout_s must be > 0"):
        load_config(cfg)
