"""Where a job will write (decision logs, checkpoints, summaries, the run folder), checked at start.

A decision log in a folder that does not exist failed with a `FileNotFoundError` traceback in a
worker after the PS had started; a checkpoint folder that is a file, or not writable, logged one
error per checkpoint and the job ran on without any. Checked before anything starts, each is one
`ConfigError` line naming the flag or field. Nothing is created here: a missing checkpoint folder
is fine when it could be made (the PS makes it at the first checkpoint).
"""

from __future__ import annotations

import os
from pathlib import Path

from netsense.errors import ConfigError


def check_output_file(label: str, path: str | Path | None) -> None:
    """`path` (None: unset) can be created or appended to, else a `ConfigError` naming `label`."""
    if path is None:
        return
    p = Path(path)
    problem = _file_problem(p)
    if problem:
        raise ConfigError(f"{label}: cannot write {p}: {problem}")


def shard_file(path: str | Path, shard: int, shards: int) -> str:
    """The file of shard `shard` among `shards` that write one each: ``<stem>-shard<i><suffix>``
    (the plain name when there is one)."""
    p = Path(path)
    return str(p) if shards == 1 else str(p.with_name(f"{p.stem}-shard{shard}{p.suffix or '.jsonl'}"))


def check_output_dir(label: str, path: str | Path | None) -> None:
    """`path` (None: unset) is a writable folder, or one that can be created, else a `ConfigError`."""
    if path is None:
        return
    p = Path(path)
    problem = _dir_problem(p)
    if problem:
        raise ConfigError(f"{label}: cannot write to {p}: {problem}")


def _file_problem(p: Path) -> str | None:
    if p.is_dir():
        return "it is a folder, not a file"
    if p.exists():
        return None if _writable(p) else "no permission to write it"
    parent = p.parent
    if not parent.exists():
        above = _existing_ancestor(parent)
        if not above.is_dir():
            return f"{above} is a file, not a folder"
        return f"folder {parent} does not exist"
    if not parent.is_dir():
        return f"{parent} is a file, not a folder"
    return None if _writable(parent) else f"no permission to create files in {parent}"


def _dir_problem(p: Path) -> str | None:
    if p.exists():
        if not p.is_dir():
            return "it is a file, not a folder"
        return None if _writable(p) else "no permission to write in it"
    above = _existing_ancestor(p)
    if not above.is_dir():
        return f"{above} is a file, not a folder"
    return None if _writable(above) else f"no permission to create folders in {above}"


def _existing_ancestor(p: Path) -> Path:
    """The nearest of `p`'s parents that exists (the root always does)."""
    for parent in p.absolute().parents:
        if parent.exists():
            return parent
    return Path(p.absolute().anchor)


def _writable(p: Path) -> bool:
    """Writable by this process (a folder: also enterable); a read-only file system counts as not."""
    return os.access(p, os.W_OK | (os.X_OK if p.is_dir() else 0))
