"""Atomic PS checkpoints: save the store's state, find the newest intact one, keep the last K.

Pure file I/O, no event loop: the server snapshots the store on its loop (`ParameterStore.state()`)
and hands the snapshot to `save` in a thread. A checkpoint is written to a temp file in the same
folder, flushed and fsynced, renamed over its final name (atomic on POSIX) and the folder is
fsynced, so a crash at any instant leaves either the old set of checkpoints or the new one.

File format: ``MAGIC``, the SHA-256 of the body, then the body (``torch.save`` of plain dicts,
lists, numbers, strings and tensors). Loading checks the digest before unpickling anything and
unpickles with ``weights_only=True``, so a truncated, bit-flipped or hostile file is refused and
the next older checkpoint is used.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
from pathlib import Path
from typing import Any

import torch

from netsense.errors import ConfigError

log = logging.getLogger(__name__)

MAGIC = b"NSCKPT1\n"
_NAME_RE = re.compile(r"^ckpt-(\d{12})\.pt$")


def checkpoint_path(directory: str | Path, version: int) -> Path:
    """Where the checkpoint of `version` lives (names sort by version)."""
    return Path(directory) / f"ckpt-{version:012d}.pt"


def save(directory: str | Path, state: dict[str, Any], *, keep: int = 3) -> Path:
    """Write `state` (must hold ``version``) atomically; delete all but the newest `keep`; returns the path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(state, buf)
    body = buf.getvalue()
    final = checkpoint_path(d, int(state["version"]))
    tmp = d / f".{final.name}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(MAGIC)
        f.write(hashlib.sha256(body).digest())
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    _fsync_dir(d)
    for old in list_checkpoints(d)[keep:]:
        try:
            old.unlink()
        except OSError as exc:
            log.warning("could not delete old checkpoint %s: %s", old, exc)
    return final


def load(path: str | Path) -> dict[str, Any]:
    """Read and verify one checkpoint; raises `ValueError` if it is truncated or corrupt."""
    data = Path(path).read_bytes()
    head = len(MAGIC) + 32
    if len(data) < head or not data.startswith(MAGIC):
        raise ValueError(f"{path}: not a NetSense checkpoint (bad header, {len(data)} bytes)")
    digest, body = data[len(MAGIC) : head], data[head:]
    if hashlib.sha256(body).digest() != digest:
        raise ValueError(f"{path}: checksum mismatch (truncated or corrupt)")
    state = torch.load(io.BytesIO(body), weights_only=True, map_location="cpu")
    if not isinstance(state, dict) or "version" not in state:
        raise ValueError(f"{path}: checkpoint body is not a store state")
    return state


def list_checkpoints(directory: str | Path) -> list[Path]:
    """Checkpoint files in `directory`, newest (highest version) first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted((p for p in d.iterdir() if _NAME_RE.match(p.name)), reverse=True)


def load_latest(directory: str | Path) -> tuple[dict[str, Any], Path]:
    """The newest intact checkpoint in `directory`, skipping corrupt ones; `ConfigError` if none."""
    tried = []
    for path in list_checkpoints(directory):
        try:
            return load(path), path
        except Exception as exc:  # noqa: BLE001 - any unreadable file is skipped, whatever broke
            log.warning("skipping checkpoint %s: %s", path, exc)
            tried.append(path.name)
    detail = f" (all unreadable: {', '.join(tried)})" if tried else ""
    raise ConfigError(f"no valid checkpoint in {directory}{detail}; start without --resume to begin a new run")


def _fsync_dir(d: Path) -> None:
    """Make the rename durable: fsync the folder entry (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
