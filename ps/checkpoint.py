"""Atomic PS checkpoints: save the store's state, find the newest intact one, keep the last K.

Pure file I/O, no event loop: the server snapshots the store on its loop (`ParameterStore.state()`)
and hands the snapshot to `save` in a thread. A checkpoint is written to a temp file in the same
folder, flushed and fsynced, renamed over its final name (atomic on POSIX) and the folder is
fsynced, so a crash at any instant leaves either the old set of checkpoints or the new one.

File format: ``MAGIC``, the SHA-256 of the body, then the body (``torch.save`` of plain dicts,
lists, numbers, strings and tensors). Loading checks the digest before unpickling anything and
unpickles with ``weights_only=True``, so a truncated, bit-flipped or hostile file is refused and
the next older checkpoint is used.

Because of that header a checkpoint is NOT a file `torch.load` reads, so it is named
``ckpt-<version>.nsckpt``, not ``.pt`` (a name that promised `torch.load`); checkpoints written
under the old ``.pt`` name are still found and read (``--resume``, ``netsense export``), and pruned
like the others. `export_state_dict` (``netsense export``) turns one checkpoint per shard into the
plain ``state_dict`` that ``model.load_state_dict(torch.load(path))`` takes, from the key ->
state_dict name map rank 0 sent with INIT.
"""

from __future__ import annotations

import hashlib
import io
import logging
import math
import os
import re
from pathlib import Path
from typing import Any

import torch

from netsense.errors import ConfigError

log = logging.getLogger(__name__)

MAGIC = b"NSCKPT1\n"
SUFFIX = ".nsckpt"
"""What a checkpoint is named with: not `torch.load`'s ``.pt``, which it is not."""
LEGACY_SUFFIX = ".pt"
"""The name checkpoints had before (same format): still read and pruned, never written."""
_NAME_RE = re.compile(r"^ckpt-(\d{12})(\.nsckpt|\.pt)$")


def checkpoint_path(directory: str | Path, version: int) -> Path:
    """Where the checkpoint of `version` is written (names sort by version)."""
    return Path(directory) / f"ckpt-{version:012d}{SUFFIX}"


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
    final.with_suffix(LEGACY_SUFFIX).unlink(missing_ok=True)  # the same version under the old name: superseded
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
    """Checkpoint files in `directory`, newest (highest version) first, old ``.pt`` names included
    (of one version, the ``.nsckpt`` first)."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = [(m, p) for p in d.iterdir() if (m := _NAME_RE.match(p.name))]
    return [p for m, p in sorted(found, key=lambda mp: (int(mp[0].group(1)), mp[0].group(2) == SUFFIX), reverse=True)]


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


_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
    "bool": torch.bool,
}  # fmt: skip


def shard_dirs(directory: str | Path) -> list[Path]:
    """The checkpoint folders of a job: `directory` itself, or its ``shard-i`` folders (`launch
    --servers S`), in shard order."""
    d = Path(directory)
    shards = sorted((p for p in d.glob("shard-*") if p.is_dir() and p.name[6:].isdigit()), key=lambda p: int(p.name[6:]))
    return shards if shards and not list_checkpoints(d) else [d]


def export_state_dict(states: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """The model's plain ``state_dict`` from the checkpoint states of every shard of one job:
    parameters and buffers under their module names, in their own shapes and dtypes.

    Raises `ConfigError` when a state lacks the name map (a PS from before it, or an INIT from an
    older worker), when the shards are of different jobs, or when an entry is not covered exactly."""
    jobs = {str(st.get("job_id", "")) for st in states}
    if len(jobs) > 1:
        raise ConfigError(f"the checkpoints are of different jobs: {sorted(jobs)}")
    flat: dict[str, tuple[torch.Tensor, torch.Tensor, list[int]]] = {}  # name -> (values, covered, shape)
    for st in states:
        model = dict(st.get("model", {}))
        if not model:
            raise ConfigError(
                f"checkpoint of version {st['version']} has no key -> state_dict name map "
                "(written by a PS or a rank 0 from before `netsense export`); it cannot be exported"
            )
        values = {**dict(st["params"]), **dict(st.get("state", {}))}
        for key, info in model.items():
            if key not in values:
                raise ConfigError(f"checkpoint names key {key!r} but holds no value for it")
            name, shape, offset = str(info["name"]), [int(x) for x in info["shape"]], int(info["offset"])
            dtype = _DTYPES[str(info["dtype"])]
            if name not in flat:
                n = math.prod(shape)
                flat[name] = (torch.zeros(n, dtype=dtype), torch.zeros(n, dtype=torch.bool), shape)
            data, covered, _ = flat[name]
            part = values[key].reshape(-1)
            span = slice(offset, offset + part.numel())
            if offset + part.numel() > data.numel() or bool(covered[span].any()):
                raise ConfigError(f"key {key!r} overlaps another or does not fit in {name!r} of shape {shape}")
            data[span] = part if dtype.is_floating_point else part.round().to(dtype)
            covered[span] = True
    out: dict[str, torch.Tensor] = {}
    for name, (data, covered, shape) in flat.items():
        if not bool(covered.all()):
            raise ConfigError(f"{name!r}: {int((~covered).sum())} elements missing (is a shard's checkpoint missing?)")
        out[name] = data.reshape(shape)
    return out
