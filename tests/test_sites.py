"""Sites (netsense/launch/sites.py): the description, its checks, the placement of ranks and shards,
and the WAN bytes of one step, PS at both sites vs DDP's ring vs every worker behind one link."""

from __future__ import annotations

from pathlib import Path

import pytest

from netsense.config import JobConfig, load_config, override, to_dict, from_dict, with_sites
from netsense.errors import ConfigError
from netsense.launch.sites import (
    Site,
    format_sites,
    parse_sites,
    ps_wan_bytes,
    rank_sites,
    ring_wan_bytes,
    shard_sites,
)
from netsense.transport.sharding import assign_shards


def test_parse_round_trips_and_defaults_to_one_of_each() -> None:
    sites = parse_sites(" a:workers=2,shards=1 ; b ; c:shards=2,workers=0 ")
    assert sites == (Site("a", 2, 1), Site("b", 1, 1), Site("c", 0, 2))
    assert parse_sites(format_sites(sites)) == sites
    assert rank_sites(sites) == ["a", "a", "b"]
    assert shard_sites(sites) == ["a", "b", "c", "c"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "names no site"),
        ("a:shards=0", "site 'a' has no PS shard"),
        ("a:workers=-1", "workers must be an integer >= 0, got -1"),
        ("a:shards=-2", "shards must be an integer >= 0, got -2"),
        ("a:workers=x", "workers must be an integer, got 'x'"),
        ("a:gpus=1", "'gpus=1' is not workers=N or shards=N"),
        ("a:workers=1,workers=2", "workers is given twice"),
        ("a;a", "site 'a' is named twice"),
        ("a b", "site name 'a b' must be"),
        ("a:workers=0", "the sites hold no worker"),
        ("a:workers=300", "at most 256 and 64"),
    ],
)
def test_bad_descriptions_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as info:
        parse_sites(text)
    assert "\n" not in str(info.value)


def test_toml_tables_set_the_counts(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('[[sites]]\nname = "a"\nworkers = 2\n\n[[sites]]\nname = "b"\nshards = 2\n')
    config = load_config(path)
    assert config.sites == (Site("a", 2, 1), Site("b", 1, 2))
    assert (config.workers, config.servers) == (3, 3)
    assert from_dict(JobConfig, to_dict(config)) == config  # what the launcher hands its children
    path.write_text('workers = 4\n[[sites]]\nname = "a"\n')
    with pytest.raises(ConfigError, match="workers is 4 but the sites hold 1"):
        load_config(path)
    path.write_text('[[sites]]\nname = "a"\nshards = 0\n')
    with pytest.raises(ConfigError, match="has no PS shard"):
        load_config(path)
    path.write_text('[[sites]]\nname = "a"\nworkers = "two"\n')
    with pytest.raises(ConfigError, match=r"sites\[0\].workers must be int"):
        load_config(path)
    path.write_text('sites = "a"\n')
    with pytest.raises(ConfigError, match="sites must be an array"):
        load_config(path)


def test_with_sites_derives_workers_and_servers() -> None:
    config = override(JobConfig(), sites=parse_sites("a:workers=3;b:shards=2"))
    assert (with_sites(config).workers, with_sites(config).servers) == (4, 3)
    assert with_sites(JobConfig()) == JobConfig()
    with pytest.raises(ConfigError, match="servers is 1 but the sites hold 3"):
        with_sites(config, {"servers"})


def test_every_site_hosts_its_share_of_the_keys_by_size() -> None:
    """Shards follow the sites' order, keys split by size over all shards: with one shard per site
    each site holds about half of the bytes, and the split is the one-site `assign_shards`."""
    sizes = [("conv.w", 4000), ("conv.b", 40), ("fc1.w", 60000), ("fc1.b", 400), ("fc2.w", 30000), ("fc2.b", 40)]
    sites = parse_sites("a;b")
    owner = assign_shards(sizes, len(shard_sites(sites)))
    held = {s: sum(n for k, n in sizes if shard_sites(sites)[owner[k]] == s) for s in ("a", "b")}
    assert held == {"a": 60000, "b": 34480}  # LPT: the largest key alone, the rest on the other shard
    assert owner == assign_shards(sizes, 2)


def test_wan_bytes_of_one_step_ps_at_both_sites_match_the_ring() -> None:
    """2 sites x 1 worker, a shard at each: a worker pushes the other site's half and pulls it back,
    so each direction carries one model, as DDP's 2-rank ring does; with both workers behind one
    link to a single PS, each direction carries two."""
    sizes = [(f"k{i}", 1000) for i in range(8)]  # 8 kB model, keys of equal size
    up = dict(sizes)
    two = parse_sites("a;b")
    owner = assign_shards(sizes, 2)
    ps = ps_wan_bytes(rank_sites(two), shard_sites(two), owner, up)
    ring = ring_wan_bytes(rank_sites(two), 8000)
    assert ps == ring == {("a", "b"): 8000, ("b", "a"): 8000}
    # The old bottleneck layout: both workers at site "w", the one PS at site "p".
    single = ps_wan_bytes(["w", "w"], ["p"], assign_shards(sizes, 1), up)
    assert single == {("w", "p"): 16000, ("p", "w"): 16000}
    # fp16 up, fp32 down: a -> b carries a's half-model push in fp16 and b's half of the update in fp32.
    half = {k: n // 2 for k, n in up.items()}
    assert ps_wan_bytes(rank_sites(two), shard_sites(two), owner, half, up) == {("a", "b"): 6000, ("b", "a"): 6000}
    assert ps_wan_bytes(rank_sites(two), shard_sites(two), owner, half, half) == {("a", "b"): 4000, ("b", "a"): 4000}


def test_wan_bytes_scale_with_workers_without_site_aggregation() -> None:
    """2 sites x 2 workers: each worker crosses the WAN alone (no relay yet), twice the ring of 4 at 2
    sites, whose ring crosses between sites on two hops of 2 (N-1)/N models each."""
    sizes = [(f"k{i}", 1000) for i in range(8)]
    sites = parse_sites("a:workers=2;b:workers=2")
    ps = ps_wan_bytes(rank_sites(sites), shard_sites(sites), assign_shards(sizes, 2), dict(sizes))
    assert ps == {("a", "b"): 16000, ("b", "a"): 16000}
    assert ring_wan_bytes(rank_sites(sites), 8000) == {("a", "b"): 12000, ("b", "a"): 12000}
    assert ring_wan_bytes(["a"], 8000) == {} and ring_wan_bytes(["a", "a"], 8000) == {}


def test_relays_go_at_sites_of_several_workers_in_a_job_of_several_sites() -> None:
    """A relay per site of >= 2 workers (its ranks), every shard's step then has one member per
    relayed site plus each unrelayed worker; none with one site, --no-relay, or an async job."""
    from netsense.launch.relays import plan_relays, relay_args, upstream_codec, upstream_policy

    def job(text: str, **kw: object) -> JobConfig:
        return with_sites(override(JobConfig(), sites=parse_sites(text), **kw))

    plans = plan_relays(job("a:workers=2;b:workers=2"))
    assert [(p.site, p.worker_id, p.ranks, p.upstream_world) for p in plans] == [
        ("a", "relay-a", (0, 1), 2), ("b", "relay-b", (2, 3), 2)]  # fmt: skip
    mixed = plan_relays(job("a:workers=3;b:workers=1;c:workers=0"))
    assert [(p.site, p.ranks, p.upstream_world) for p in mixed] == [("a", (0, 1, 2), 2)]
    assert plan_relays(job("a:workers=1;b:workers=1")) == []
    assert plan_relays(job("a:workers=4")) == []  # one site: no WAN to save
    assert plan_relays(job("a:workers=2;b:workers=2", relay=False)) == []
    assert plan_relays(job("a:workers=2;b:workers=2", server__staleness=2)) == []
    assert plan_relays(override(JobConfig(), workers=4)) == []
    # The site's sum goes up in the workers' fixed codec; under an adaptive policy the relay runs it.
    assert upstream_codec(JobConfig()) == "fp32"
    assert upstream_codec(override(JobConfig(), train__policy="fp16")) == "fp16"
    assert upstream_codec(override(JobConfig(), train__policy="none")) == "fp32"
    assert upstream_codec(override(JobConfig(), train__policy="fixed:topk:0.01+fp16")) == "topk:0.01+fp16"
    assert upstream_codec(override(JobConfig(), train__policy="netsense")) is None
    assert upstream_policy(override(JobConfig(), train__policy="netsense")) == "netsense"
    assert upstream_policy(override(JobConfig(), train__policy="fp16")) is None and upstream_policy(JobConfig()) is None
    args = relay_args(plans[1], config_path="c.json", upstream=["h:1", "h:2"], host="10.0.0.2", job_id="j")
    assert args[0] == "relay" and args[args.index("--ps") + 1] == "h:1,h:2"
    assert [args[args.index(f) + 1] for f in ("--site", "--site-workers", "--upstream-world", "--host", "--upstream-codec")] == [
        "b", "2", "2", "10.0.0.2", "fp32"]  # fmt: skip
    assert "--upstream-policy" not in args and "--decision-log" not in args
    (adaptive, _) = plan_relays(job("a:workers=2;b:workers=2", train__policy="dc2"))
    args = relay_args(adaptive, config_path="c.json", upstream=["h:1"], host="h", job_id="j", decision_log="d.jsonl")
    assert [args[args.index(f) + 1] for f in ("--upstream-policy", "--decision-log")] == ["dc2", "d.jsonl"]
    assert "--upstream-codec" not in args
    # Under an adaptive job the relay adapts the WAN push; its workers push it fp16 (same host).
    assert adaptive.site_policy == "fp16" and all(p.site_policy is None for p in plans)


def test_relays_halve_the_wan_bytes_of_two_sites_of_two_workers() -> None:
    """With a relay per site the shards see one member per site: each direction carries one model
    (as 2 sites x 1 worker), half what the 4 workers move alone and 2/3 of the 4-rank ring's 1.5."""
    sizes = [(f"k{i}", 1000) for i in range(8)]
    sites = parse_sites("a:workers=2;b:workers=2")
    owner = assign_shards(sizes, 2)
    relayed = ps_wan_bytes(["a", "b"], shard_sites(sites), owner, dict(sizes))  # the relays are the members
    alone = ps_wan_bytes(rank_sites(sites), shard_sites(sites), owner, dict(sizes))
    ring = ring_wan_bytes(rank_sites(sites), 8000)
    assert relayed == {("a", "b"): 8000, ("b", "a"): 8000}
    assert all(relayed[k] * 2 == alone[k] and relayed[k] * 3 == ring[k] * 2 for k in ring)
    half = {k: n // 2 for k, n in sizes}  # fp16 on the WAN: a third of the fp32 ring's bytes
    assert all(v * 3 == ring[k] for k, v in ps_wan_bytes(["a", "b"], shard_sites(sites), owner, half).items())


def test_scenario_sites_spread_workers_evenly_in_rank_order() -> None:
    from netsense.bench.topology import rank_site_names, scenario_sites, site_workers

    assert site_workers(4) == [1, 1, 1, 1] and site_workers(4, 2) == [2, 2] and site_workers(5, 2) == [3, 2]
    assert [(s.name, s.workers, s.shards) for s in scenario_sites(4, 2)] == [("s0", 2, 1), ("s1", 2, 1)]
    assert rank_site_names(4, 2) == ["s0", "s0", "s1", "s1"] and rank_site_names(2) == ["s0", "s1"]
    with pytest.raises(Exception, match="cannot spread 2 workers over 3 sites"):
        site_workers(2, 3)


def test_each_shard_gets_its_own_file_and_one_shard_the_plain_name() -> None:
    """The PS shards' downlink logs and a relay's per-shard logs are named alike."""
    from netsense.launch.outputs import shard_file

    assert shard_file("run/d.jsonl", 0, 1) == "run/d.jsonl"
    assert [shard_file("run/d.jsonl", i, 2) for i in (0, 1)] == ["run/d-shard0.jsonl", "run/d-shard1.jsonl"]
    assert shard_file("run/d", 1, 3) == "run/d-shard1.jsonl"
