"""Which sites of a launch get a relay, and what each relay is told (docs/ARCHITECTURE.md,
"Hierarchical aggregation").

A site of two or more workers in a job of several sites runs one relay: the site's workers reach
only it (every shard, their own site's included, through it), and it reaches every shard, so every
shard sees one member per relayed site. Pure, so the plan is tested without processes; the
launcher spawns and supervises the relays (`netsense relay` children).
"""

from __future__ import annotations

import json
import queue
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

from netsense.config import JobConfig
from netsense.launch.sites import Site, rank_sites

ADAPTIVE_UPSTREAM_CODEC = "fp16"
"""A relay runs no policy: under an adaptive uplink policy it pushes the site's sum in fp16
(under error feedback), half the fp32 bytes on the WAN."""


@dataclass(frozen=True)
class RelayPlan:
    """One site's relay as the launcher starts it."""

    site: str
    ranks: tuple[int, ...]
    """The site's worker ranks: they talk to the relay only."""
    upstream_world: int
    """Members of every upstream shard's step: relayed sites plus workers at unrelayed sites."""
    upstream_codec: str

    @property
    def worker_id(self) -> str:
        return f"relay-{self.site}"


def relayed_sites(config: JobConfig) -> list[Site]:
    """The sites that get a relay: those of >= 2 workers when there are >= 2 sites, the job is
    synchronous and `config.relay` is on."""
    if not config.relay or len(config.sites) < 2 or config.server.staleness is not None:
        return []
    return [s for s in config.sites if s.workers >= 2]


def upstream_codec(config: JobConfig) -> str:
    """The workers' fixed uplink codec (the policy's, or `train.codec` without one); for an adaptive
    policy `ADAPTIVE_UPSTREAM_CODEC`."""
    policy = config.train.policy
    if policy is None:
        return config.train.codec
    from netsense.compression import DEFAULT_LADDER, Ladder, make_policy
    from netsense.compression.policy.fixed import FixedPolicy

    built = make_policy(policy, Ladder.parse(config.train.ladder or DEFAULT_LADDER))
    return str(built.level.spec) if isinstance(built, FixedPolicy) else ADAPTIVE_UPSTREAM_CODEC


def plan_relays(config: JobConfig) -> list[RelayPlan]:
    """One `RelayPlan` per relayed site, in site order."""
    relayed = relayed_sites(config)
    if not relayed:
        return []
    names = {s.name for s in relayed}
    direct = sum(s.workers for s in config.sites if s.name not in names)
    ranks = rank_sites(config.sites)
    codec = upstream_codec(config)
    return [
        RelayPlan(s.name, tuple(r for r, x in enumerate(ranks) if x == s.name), len(relayed) + direct, codec)
        for s in relayed
    ]


def relay_args(plan: RelayPlan, *, config_path: str, upstream: Sequence[str], host: str, job_id: str) -> list[str]:
    """The `netsense relay` arguments of `plan` (after ``netsense``)."""
    return [
        "relay", "--config", config_path, "--ps", ",".join(upstream), "--site", plan.site,
        "--site-workers", str(len(plan.ranks)), "--upstream-world", str(plan.upstream_world),
        "--upstream-codec", plan.upstream_codec, "--host", host, "--port", "0", "--server-name", "127.0.0.1",
        "--job-id", job_id,
    ]  # fmt: skip


def read_events(stream: IO[str], out: queue.Queue[dict[str, Any]]) -> None:
    """A relay's JSON lines (``ready``, then ``stopped``) into `out`; other lines are logs."""
    for line in stream:
        line = line.strip()
        if line.startswith("{"):
            try:
                out.put(json.loads(line))
            except json.JSONDecodeError:
                pass
