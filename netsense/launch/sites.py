"""Sites: where a job's workers and PS shards run, and the WAN bytes a step moves between them.

A real two-site job puts PS shards at both sites (BytePS-style co-location): the keys are split by
size over all shards (`assign_shards`, unchanged), shard i runs at the site that the description
gives it, so every site hosts its share of the keys and a worker's traffic to its own site's
shards never crosses the WAN. Ranks and shard indices follow the description's order: the first
site's workers are ranks 0..n-1, its shards are shards 0..m-1, and so on.

Written as ``a:workers=1,shards=1;b:workers=1,shards=1`` (``--sites``; a field left out is 1) or
as TOML ``[[sites]]`` tables with ``name``, ``workers`` and ``shards``. Pure: no I/O, so the
placement and the WAN arithmetic are tested without processes (docs/ARCHITECTURE.md, "Sites").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from netsense.errors import ConfigError
from netsense.transport.messages import SITE_RE

NAME_RE = SITE_RE  # a site's name travels in HELLO (`Hello.site`)
"""A site name: letters, digits, ``_ . -``, at most 32 (it lands in flags, logs and file names)."""


@dataclass(frozen=True)
class Site:
    """One site of a job: its name, and how many workers and PS shards run there."""

    name: str
    """Unique within the job; `netsense ps/worker --site NAME` tells a process its site."""
    workers: int = 1
    """Worker processes at this site (0: a site that only serves keys)."""
    shards: int = 1
    """PS shard processes at this site (>= 1: every site hosts its share of the keys)."""

    def __post_init__(self) -> None:
        problem = site_problem(self)
        if problem:
            raise ConfigError(problem)


def name_problem(name: object) -> str | None:
    """Why `name` is no site name, or None."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        return f"site name {name!r} must be 1-32 letters, digits, '_', '.' or '-'"
    return None


def site_problem(site: Site) -> str | None:
    """Why one site is invalid on its own, or None."""
    problem = name_problem(site.name)
    if problem:
        return problem
    for what in ("workers", "shards"):
        value = getattr(site, what)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f"site {site.name!r}: {what} must be an integer >= 0, got {value!r}"
    if site.shards < 1:
        return f"site {site.name!r} has no PS shard: with sites, every site hosts its share of the keys (shards >= 1)"
    return None


def sites_problem(sites: Sequence[Site]) -> str | None:
    """Why a whole description is invalid (names repeat, no worker at all, too many), or None."""
    if not sites:
        return None
    names = [s.name for s in sites]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        return f"site {repeated[0]!r} is named twice"
    workers, shards = sum(s.workers for s in sites), sum(s.shards for s in sites)
    if workers < 1:
        return "the sites hold no worker (workers >= 1 at one site at least)"
    if workers > 256 or shards > 64:
        return f"the sites hold {workers} workers and {shards} shards (at most 256 and 64)"
    return None


def parse_sites(text: str) -> tuple[Site, ...]:
    """``a:workers=1,shards=1;b:shards=2`` -> sites in order; one-line `ConfigError` on any fault."""
    out: list[Site] = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        name, _, fields = part.partition(":")
        counts: dict[str, int] = {}
        for item in (f.strip() for f in fields.split(",") if f.strip()):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or key not in ("workers", "shards"):
                raise ConfigError(f"site {name.strip()!r}: {item!r} is not workers=N or shards=N")
            if key in counts:
                raise ConfigError(f"site {name.strip()!r}: {key} is given twice")
            try:
                counts[key] = int(value)
            except ValueError:
                raise ConfigError(f"site {name.strip()!r}: {key} must be an integer, got {value.strip()!r}") from None
        out.append(Site(name.strip(), **counts))
    if not out:
        raise ConfigError(f"{text!r} names no site; e.g. 'a:workers=1,shards=1;b:workers=1,shards=1'")
    problem = sites_problem(out)
    if problem:
        raise ConfigError(problem)
    return tuple(out)


def format_sites(sites: Sequence[Site]) -> str:
    """The ``--sites`` text of `sites` (round-trips through `parse_sites`)."""
    return ";".join(f"{s.name}:workers={s.workers},shards={s.shards}" for s in sites)


def rank_sites(sites: Sequence[Site]) -> list[str]:
    """Site name of each worker rank, in rank order."""
    return [s.name for s in sites for _ in range(s.workers)]


def shard_sites(sites: Sequence[Site]) -> list[str]:
    """Site name of each PS shard, in shard order."""
    return [s.name for s in sites for _ in range(s.shards)]


Pair = tuple[str, str]
"""(from site, to site)."""


def ps_wan_bytes(
    rank_site: Sequence[str],
    shard_site: Sequence[str],
    owner: Mapping[str, int],
    up_bytes: Mapping[str, int],
    down_bytes: Mapping[str, int] | None = None,
) -> dict[Pair, int]:
    """Bytes one synchronous PS step moves between sites, per (from, to) pair.

    Every worker pushes each key to the shard that owns it and pulls it back: a key owned at
    another site costs its encoded gradient one way and its update the other. `down_bytes`
    defaults to `up_bytes` (the same codec both ways)."""
    down = up_bytes if down_bytes is None else down_bytes
    out: dict[Pair, int] = {}
    for here in rank_site:
        for key, shard in owner.items():
            there = shard_site[shard]
            if there != here:
                out[(here, there)] = out.get((here, there), 0) + up_bytes[key]
                out[(there, here)] = out.get((there, here), 0) + down[key]
    return out


def ring_wan_bytes(rank_site: Sequence[str], model_bytes: int) -> dict[Pair, int]:
    """Bytes one ring all-reduce (reduce-scatter + all-gather, DDP's) moves between sites.

    Each of N ranks sends 2 (N-1)/N of the model to the next rank in the ring; a hop between two
    sites is WAN traffic. For 2 ranks at 2 sites: one model each way."""
    n = len(rank_site)
    out: dict[Pair, int] = {}
    if n < 2:
        return out
    per_hop = 2 * (n - 1) * model_bytes // n
    for r, here in enumerate(rank_site):
        there = rank_site[(r + 1) % n]
        if there != here:
            out[(here, there)] = out.get((here, there), 0) + per_hop
    return out
