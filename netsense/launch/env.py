"""Rank, world size and PS address from the environment set by torchrun or Slurm.

Existing launchers already know who is who; NetSense reads their variables so that
``torchrun --nproc-per-node 2 -m netsense worker ...`` or ``srun netsense worker ...`` just work.
Explicit flags always win over the environment.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from netsense.errors import ConfigError
from netsense.ps.server import ServerSettings

DEFAULT_PS_PORT = ServerSettings.port
"""The PS's default port (one source: `ServerSettings`)."""


@dataclass(frozen=True)
class LaunchEnv:
    """What the surrounding launcher told this process."""

    source: str
    """``torchrun``, ``slurm`` or ``none``."""
    rank: int | None = None
    """Global rank."""
    world_size: int | None = None
    """Number of workers."""
    local_rank: int | None = None
    """Rank on this node."""
    ps_host: str | None = None
    """Where the PS runs: $NETSENSE_PS host, torchrun's MASTER_ADDR, or Slurm's first node."""
    ps_port: int | None = None
    """PS port from $NETSENSE_PS (torchrun's MASTER_PORT is its own rendezvous port, not the PS's)."""


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} must be an integer") from None


def first_slurm_host(nodelist: str) -> str:
    """First host of a Slurm node list: ``gpu[03-05,09],cpu1`` -> ``gpu03``."""
    m = re.match(r"^([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not m:
        raise ConfigError(f"cannot parse SLURM_NODELIST={nodelist!r}")
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def from_environ(env: Mapping[str, str] | None = None) -> LaunchEnv:
    """Read torchrun's or Slurm's variables (torchrun first: it may itself run under Slurm)."""
    env = os.environ if env is None else env
    ps_host = ps_port = None
    if env.get("NETSENSE_PS"):
        host, _, port = env["NETSENSE_PS"].rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"NETSENSE_PS={env['NETSENSE_PS']!r} must be HOST:PORT")
        ps_host, ps_port = host.strip("[]"), int(port)
    if "RANK" in env and "WORLD_SIZE" in env:
        return LaunchEnv(
            "torchrun", _int(env, "RANK"), _int(env, "WORLD_SIZE"), _int(env, "LOCAL_RANK"),
            ps_host or env.get("MASTER_ADDR"), ps_port,
        )  # fmt: skip
    if "SLURM_PROCID" in env:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        return LaunchEnv(
            "slurm", _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS"), _int(env, "SLURM_LOCALID"),
            ps_host or (first_slurm_host(nodelist) if nodelist else None), ps_port,
        )  # fmt: skip
    return LaunchEnv("none", ps_host=ps_host, ps_port=ps_port)


JOB_ID_ENV = "NETSENSE_JOB_ID"


def resolve_job_id(model: str, seed: int, configured: str = "", *, random_part: bool, env: Mapping[str, str] | None = None) -> str:
    """The job's id (docs/ARCHITECTURE.md, "Job identity"): `configured` (``--job-id`` or
    `train.job_id`), else $NETSENSE_JOB_ID, else ``<model>-s<seed>`` plus the run's id where all
    workers share one (Slurm's job id, torchrun's rendezvous id) and, for `launch`, a random part;
    workers started one by one cannot agree on a random id, so theirs is deterministic."""
    env = os.environ if env is None else env
    if configured:
        return configured
    if env.get(JOB_ID_ENV):
        return env[JOB_ID_ENV]
    run = env.get("SLURM_JOB_ID") or env.get("TORCHELASTIC_RUN_ID", "none")
    base = f"{model}-s{seed}" + (f"-{run}" if run != "none" else "")
    base = re.sub(r"[^A-Za-z0-9_.\-:]", "_", base)[:110]
    return f"{base}-{secrets.token_hex(4)}" if random_part else base
