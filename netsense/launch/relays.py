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

@dataclass(frozen=True)
class RelayPlan:
    """One site's relay as the launcher starts it."""

    site: str
    ranks: tuple[int, ...]
    """The site's worker ranks: they talk to the relay only."""
    upstream_world: int
    """Members of every upstream shard's step: relayed sites plus workers at unrelayed sites."""
    upstream_codec: str | None
    """The workers' fixed codec, at which the site's sum goes up; None under an adaptive policy."""
    upstream_policy: str | None = None
    """The job's adaptive uplink policy, which the relay runs on each upstream path as a worker
    would (`netsense.relay.adaptive`); None under a fixed codec."""

    @property
    def worker_id(self) -> str:
        return f"relay-{self.site}"

    @property
    def site_policy(self) -> str | None:
        """The uplink policy of the site's workers, to the relay: `RELAYED_WORKER_POLICY` under an
        adaptive job (the relay adapts the push that crosses the WAN), None (the job's) otherwise."""
        return RELAYED_WORKER_POLICY if self.upstream_policy is not None else None


RELAYED_WORKER_POLICY = "fp16"
"""What a relayed worker of an adaptive job pushes to its relay. `launch` puts a site's workers and
relay on one host, so that hop never crosses the WAN: compressing it lossily would only add a
second compression's error under the relay's (and its CPU). On 2 sites x 2 workers it took
digits-cnn from 57-60 to 43-44 ms a step and reached wide-mlp's target 10-20 steps sooner
(docs/history/BENCHMARKS-2026.md, "Relayed workers push fp16")."""


def relayed_sites(config: JobConfig) -> list[Site]:
    """The sites that get a relay: those of >= 2 workers when there are >= 2 sites, the job is
    synchronous and `config.relay` is on."""
    if not config.relay or len(config.sites) < 2 or config.server.staleness is not None:
        return []
    return [s for s in config.sites if s.workers >= 2]


def upstream_codec(config: JobConfig) -> str | None:
    """The workers' fixed uplink codec (the policy's, or `train.codec` without one); None for an
    adaptive policy (`upstream_policy`)."""
    policy = config.train.policy
    if policy is None:
        return config.train.codec
    from netsense.compression import DEFAULT_LADDER, Ladder, make_policy
    from netsense.compression.policy.fixed import FixedPolicy

    built = make_policy(policy, Ladder.parse(config.train.ladder or DEFAULT_LADDER))
    return str(built.level.spec) if isinstance(built, FixedPolicy) else None


def upstream_policy(config: JobConfig) -> str | None:
    """The job's uplink policy when it adapts (then the relays run it too), else None."""
    return config.train.policy if upstream_codec(config) is None else None


def plan_relays(config: JobConfig) -> list[RelayPlan]:
    """One `RelayPlan` per relayed site, in site order."""
    relayed = relayed_sites(config)
    if not relayed:
        return []
    names = {s.name for s in relayed}
    direct = sum(s.workers for s in config.sites if s.name not in names)
    ranks = rank_sites(config.sites)
    codec, policy = upstream_codec(config), upstream_policy(config)
    return [
        RelayPlan(s.name, tuple(r for r, x in enumerate(ranks) if x == s.name), len(relayed) + direct, codec, policy)
        for s in relayed
    ]


def relay_args(
    plan: RelayPlan, *, config_path: str, upstream: Sequence[str], host: str, job_id: str, decision_log: str | None = None
) -> list[str]:
    """The `netsense relay` arguments of `plan` (after ``netsense``); `decision_log`: where an
    adaptive relay logs its decisions."""
    if plan.upstream_policy is not None:
        push = ["--upstream-policy", plan.upstream_policy, *(["--decision-log", decision_log] if decision_log else [])]
    else:
        push = ["--upstream-codec", plan.upstream_codec or "fp32"]
    return [
        "relay", "--config", config_path, "--ps", ",".join(upstream), "--site", plan.site,
        "--site-workers", str(len(plan.ranks)), "--upstream-world", str(plan.upstream_world), *push,
        "--host", host, "--port", "0", "--server-name", "127.0.0.1", "--job-id", job_id,
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
