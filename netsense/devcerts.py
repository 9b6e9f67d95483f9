"""Where a job's development certificates live when no ``--certs`` folder is given, and making sure
they exist.

Shared by the `ps`, `worker` and `certs` commands and by the local launcher, so it sits below both
`netsense.cli` and `netsense.launch` (the launcher must not import the command line).
"""

from __future__ import annotations

import os
from pathlib import Path

from netsense.errors import ConfigError
from netsense.transport.tls import CertPaths, make_dev_certs


def default_certs_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "netsense" / "dev-certs"


def ensure_certs(certs_dir: str | None, *, create: bool) -> CertPaths:
    """Cert paths in `certs_dir` (or the cache dir); create dev certs there if allowed and missing."""
    d = Path(certs_dir) if certs_dir else default_certs_dir()
    paths = CertPaths.in_dir(d)
    missing = [p for p in (paths.ca, paths.cert, paths.key, paths.secret) if not p.exists()]
    if missing:
        if not create:
            raise ConfigError(f"missing {', '.join(map(str, missing))}; create them with `netsense certs --out {d}`")
        make_dev_certs(d)
    return paths


def worker_certs(certs_dir: str | None) -> CertPaths:
    """Cert paths for a worker, which needs only the CA and the secret (never the PS's key), so an
    operator copies exactly those two files to each worker machine."""
    d = Path(certs_dir) if certs_dir else default_certs_dir()
    paths = CertPaths.in_dir(d)
    missing = [p for p in (paths.ca, paths.secret) if not p.exists()]
    if missing:
        raise ConfigError(
            f"missing {', '.join(map(str, missing))}; copy ca.pem and secret from the PS's `netsense certs --out` "
            f"folder into {d} (a worker never needs the PS's private key)"
        )
    return paths
