"""Where a job's development certificates live when no ``--certs`` folder is given, and making sure
they exist.

Shared by the `ps`, `worker` and `certs` commands and by the local launcher, so it sits below both
`netsense.cli` and `netsense.launch` (the launcher must not import the command line).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from cryptography import x509

from netsense.errors import ConfigError
from netsense.transport.tls import CertPaths, make_dev_certs

log = logging.getLogger(__name__)
WARN_BEFORE = datetime.timedelta(days=1)
"""`netsense ps` warns when its certificate expires sooner than this."""


def default_certs_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "netsense" / "dev-certs"


def ensure_certs(certs_dir: str | None, *, create: bool) -> CertPaths:
    """Cert paths in `certs_dir` (or the cache dir); create dev certs there if allowed and missing."""
    d = Path(certs_dir) if certs_dir else default_certs_dir()
    paths = CertPaths.in_dir(d)
    files = (paths.ca, paths.cert, paths.key, paths.secret)
    if not create:
        missing = [p for p in files if not p.exists()]
        if missing:
            raise ConfigError(f"missing {', '.join(map(str, missing))}; create them with `netsense certs --out {d}`")
        return paths
    # The shards and relays of one `launch --insecure` start together and each makes sure of the
    # same folder: unlocked, one saw the files another was writing and refused to overwrite them.
    with _creating(d):
        missing = [p for p in files if not p.exists()]
        if len(missing) == len(files):
            make_dev_certs(d)
        elif missing:  # never replace a CA or secret that workers may already hold
            raise ConfigError(
                f"{d} is incomplete (missing {', '.join(p.name for p in missing)}); "
                f"recreate it with `netsense certs --out {d} --force` and hand the new ca.pem and secret to every worker"
            )
    return paths


@contextlib.contextmanager
def _creating(d: Path) -> Iterator[None]:
    """Holds an exclusive lock on `d`/.lock (created with `d`) while the certs are checked and made."""
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(d / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise ConfigError(f"cannot create the dev certs in {d}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


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


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def check_cert_dates(paths: CertPaths) -> None:
    """Refuse an expired server certificate or CA, warn (one log line) when one expires within a
    day: every worker's handshake would fail, far from the cause."""
    ends = []
    for path in (paths.cert, paths.ca):
        try:
            cert = x509.load_pem_x509_certificate(path.read_bytes())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read certificate {path}: {exc}") from None
        ends.append((cert.not_valid_after_utc, path))
    end, path = min(ends)
    renew = f"create new ones with `netsense certs --out {path.parent} --force`"
    now = _now()
    if end <= now:
        raise ConfigError(f"certificate {path} expired at {end:%Y-%m-%d %H:%M} UTC; {renew}")
    if end - now < WARN_BEFORE:
        log.warning("certificate %s expires at %s UTC, in under a day; %s", path, f"{end:%Y-%m-%d %H:%M}", renew)
