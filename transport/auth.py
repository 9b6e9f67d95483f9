"""Worker authentication: HMAC-SHA256 challenge-response on a shared secret.

aioquic's server never verifies client certificates (docs/ARCHITECTURE.md), so workers prove
themselves at the application level. The MAC covers a fresh server nonce (no replay across
connections), a client nonce, and the worker id (a MAC for one id is useless for another).
TLS 1.3 already encrypts the exchange; the secret itself never crosses the wire.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
from pathlib import Path

from netsense.errors import AuthError, ConfigError

log = logging.getLogger(__name__)
NONCE_BYTES = 32
MIN_SECRET_BYTES = 16
_LABEL = b"netsense/1 worker auth"


def new_nonce() -> bytes:
    """A fresh random nonce."""
    return secrets.token_bytes(NONCE_BYTES)


def auth_mac(secret: bytes, *, server_nonce: bytes, client_nonce: bytes, worker_id: str) -> bytes:
    """The MAC a worker sends in AUTH."""
    msg = b"|".join([_LABEL, server_nonce, client_nonce, worker_id.encode()])
    return hmac.new(secret, msg, hashlib.sha256).digest()


def verify_mac(secret: bytes, mac: bytes, *, server_nonce: bytes, client_nonce: bytes, worker_id: str) -> None:
    """Raise `AuthError` unless `mac` is right (constant-time comparison)."""
    expected = auth_mac(secret, server_nonce=server_nonce, client_nonce=client_nonce, worker_id=worker_id)
    if not hmac.compare_digest(expected, mac):
        raise AuthError(f"worker {worker_id!r} failed the challenge: wrong shared secret")


def write_secret(path: Path) -> None:
    """Write a new random secret readable by the owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")


def load_secret(path: str | Path) -> bytes:
    """Read the shared secret file; clear errors for a missing, empty or too short secret."""
    p = Path(path)
    try:
        data = p.read_bytes().strip()
    except FileNotFoundError:
        raise ConfigError(f"secret file {p} does not exist; create one with `netsense certs --out DIR`") from None
    except OSError as exc:
        raise ConfigError(f"cannot read secret file {p}: {exc}") from None
    if len(data) < MIN_SECRET_BYTES:
        raise ConfigError(f"secret file {p} holds {len(data)} bytes; at least {MIN_SECRET_BYTES} are required")
    mode = p.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("secret file %s is readable by group or others (mode %o); chmod 600 it", p, mode & 0o777)
    return data
