"""More PS shards than a model has keys, refused before any process starts.

A shard that owns no key was started, then every worker refused the layout (`Replica`: "9 PS
shards for 8 keys") after the PS processes ran; with zero-size keys a shard could own nothing
even with enough keys. `assign_shards` is what the workers use, so the check agrees with them.
"""

from __future__ import annotations

from netsense.errors import ConfigError
from netsense.transport.sharding import assign_shards
from netsense.worker import TrainTask
from netsense.worker.layout import shard_layout


def check_shards(task: TrainTask, model_spec: str, servers: int) -> None:
    """Every one of `servers` shards owns at least one of the model's keys, else one `ConfigError`."""
    if servers <= 1:
        return
    slots = shard_layout(task.build_model(), servers)  # shapes only: no seed needed
    owner = assign_shards([(s.key, 4 * s.numel) for s in slots], servers)
    empty = sorted(set(range(servers)) - set(owner.values()))
    if empty:
        most = len(set(owner.values())) if len(slots) >= servers else len(slots)
        raise ConfigError(
            f"--servers {servers}: model {model_spec!r} has {len(slots)} parameter keys, and shard {empty[0]} would own none; "
            f"use at most {most} PS shards"
        )
