"""`netsense bench scenario`: one training scenario run once per policy, side by side, same seeds.

Each policy is one `Launcher` job (1 PS + N workers, and the `netsense emulate` child when a link
is given) with the same model, seed, batch order and link. The policy drives both directions, as
DDP's communication hooks compress both halves of an all-reduce: by default (``--downlink
gradient``, the product's default) the PS sends the step's aggregated gradient at the codec the
workers' pushes came in; ``--downlink same`` runs the policy on the PS's parameter-domain downlink.

Stopping. Every worker runs the same number of synchronous steps (``--steps``, default the task's).
``--max-time S`` is a guard, not a coordinated stop: when rank 0 reports a step past S seconds the
job is stopped (SIGTERM) and the figures are those of the steps that every worker finished. So a
policy cut by the guard is reported with fewer steps, and its final accuracy is its last eval.
The ddp:* peers are stopped the same way. A ddp:* peer that fails or hangs is no row: results.json
lists it under ``failed`` with the reason, the later policies still run, and the exit status is 1.

Topology of the netns:* and ddp:* rows (``--topology``). ``sites`` (the default): one namespace per
worker (a site), a tbf link between each pair of sites (`SitesTopology`), a PS shard at every site
and DDP's ranks at the same sites, so a worker's traffic to its own shard stays inside its site and
WAN bytes per step are comparable with the ring's. ``bottleneck``: the older 3-namespace path with
every NetSense worker behind one tbf and the PS beside DDP's rank 0. With sites, each row also has
``wan_bytes_per_step`` (what the router forwarded into each site, per step) and ``wan_ideal_step_s``
(max(compute, WAN bytes / rate) per step, the busier direction), which is then its
``ideal_step_s`` (the one from the workers' own byte counts, local traffic included, is kept as
``ideal_step_app_s``). ``--sites N`` spreads the workers evenly over N sites in rank order: a
site of several NetSense workers gets a relay (hierarchical aggregation; the row's ``relays`` name
them with their WAN bytes), DDP's consecutive ranks share a site as the workers do.

Outputs in ``--out DIR``: results.json (rewritten after every policy, so a failure keeps the
finished ones), results.md, accuracy.png, timeline.png, throughput.png, and runs/<policy>/ with the
resolved config and decision logs of each job.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from netsense.bench.topology import NetnsLauncher, ScenarioLauncher, SitesLauncher, relay_table, scenario_sites, site_workers, wan_figures, wan_table
from netsense.compression.policy.calibration import read_progress_table
from netsense.compression.policy.decisionlog import read_decision_log
from netsense.config import JobConfig, override, with_sites
from netsense.errors import ConfigError, NetSenseError
from netsense.transport.emulation.linkspec import DuplexSpec, parse_link

DEFAULT_POLICIES = "none,fp16,fixed:topk:0.01+fp16,netsense"
TOPOLOGIES = ("sites", "bottleneck")
"""Namespace topologies of the netns:* and ddp:* rows (`--topology`)."""
DEFAULT_TARGETS = {"digits-cnn": 0.9, "charlm": 0.55, "resnet18-synth": 0.5, "wide-mlp": 0.9}
"""Target test accuracy per registered model when --target-accuracy is not given."""

EPILOG = """\
Policies: none, fp16, fixed:<codec>, dc2, netsenseml-paper, accordion, gravac, netsense (comma-separated, run in order),
the peers ddp:none, ddp:fp16, ddp:powersgd (PyTorch DDP, gloo over TCP, across kernel tbf links
in network namespaces: root only, constant rate, no delay; --netns-link sets their spec), and
netns:<policy>: a NetSense job across those same links. --topology sites (default): one site per
worker, a PS shard and DDP's rank at each, a tbf between each pair of sites; rows report WAN bytes
per step; --sites N spreads the workers over N sites (a relay at each site of several NetSense
workers, DDP's ranks in order).
--topology bottleneck: every worker behind one tbf, the PS and DDP's rank 0 beyond it.
Time to target is training time (rank 0's clock, eval pauses excluded) at the first eval with
accuracy >= target; ideal_step_s is the mean over steps of max(compute, bytes / the link's rate).
Examples:
  netsense bench scenario --model digits-cnn --link rate=20mbit,delay=10ms --out runs/20mbit
  netsense bench scenario --model charlm --link rate=0s:100mbit,30s:10mbit,60s:50mbit,delay=10ms \\
      --policies none,fp16,netsense --target-accuracy 0.55 --max-time 300 --out runs/steps
  netsense bench scenario --model wide-mlp --link rate=20mbit,queue=50ms --policies netns:fp16,ddp:fp16 --out runs/sites
  netsense bench scenario --model wide-mlp --workers 4 --sites 2 --link rate=20mbit,queue=50ms \\
      --policies netns:fp16,netns:netsense,ddp:fp16,ddp:powersgd --out runs/relays
  netsense plot runs/20mbit          # redraw the figures from results.json"""


def register(kinds: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `scenario` bench kind."""
    p = kinds.add_parser(
        "scenario",
        help="train once per policy over the same link and seeds; time to accuracy, bytes, plots",
        description="Run one training scenario for each policy in turn (same model, seeds and link), then write "
        "results.json, a markdown table and PNG figures into --out.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="digits-cnn", help="registered model or package.module:factory (default digits-cnn)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--link", metavar="SPEC", help="emulated link, e.g. rate=20mbit,delay=10ms (default: unshaped loopback)")
    p.add_argument("--trace", metavar="FILE", help="rate trace file for the emulated link (CSV or Mahimahi)")
    p.add_argument("--policies", default=DEFAULT_POLICIES, help=f"comma-separated policies (default {DEFAULT_POLICIES})")
    p.add_argument("--target-accuracy", type=float, help="test accuracy for time-to-target (default per model: "
                   + ", ".join(f"{k} {v}" for k, v in DEFAULT_TARGETS.items()) + ")")  # fmt: skip
    p.add_argument("--max-time", type=float, default=900.0, help="stop a policy's job after S seconds (default 900)")
    p.add_argument("--seed", type=int, default=0, help="seed of model init and batch order, the same for every policy")
    p.add_argument("--steps", type=int, help="synchronous steps per policy (default: the task's)")
    p.add_argument("--batch-size", type=int, help="samples per worker per step (default: the task's)")
    p.add_argument("--eval-every", type=int, default=10, help="rank 0 evaluates every N steps (default 10)")
    p.add_argument("--ladder", help="levels for adaptive policies (default: the policy's default ladder)")
    p.add_argument("--progress-table", metavar="FILE",
                   help="`netsense calibrate`'s table for the netsense rows (netns:netsense too); the other rows ignore it")  # fmt: skip
    p.add_argument("--downlink", choices=["same", "none", "gradient"], default="gradient",
                   help="PS -> worker: the gradient domain, the product's default (each key at its smallest push's "
                   "codec, every worker and relay running the PS's optimizer), or in the parameter domain the same "
                   "policy as the uplink or fp32 for every policy")  # fmt: skip
    p.add_argument("--netns-link", metavar="SPEC",
                   help="tbf link of the ddp:* and netns:* runs (default --link; rate and queue only)")  # fmt: skip
    p.add_argument("--topology", choices=TOPOLOGIES, default="sites",
                   help="netns:* and ddp:* rows: sites = one site per worker with a PS shard at each and a tbf "
                   "link between each pair (default); bottleneck = every worker behind one tbf, the PS and "
                   "DDP's rank 0 beyond it")  # fmt: skip
    p.add_argument("--sites", type=int, metavar="N",
                   help="--topology sites: spread the workers evenly over N sites in rank order (default: one site "
                   "per worker); a site of several workers gets a relay (NetSense) or holds consecutive ranks (DDP)")
    p.add_argument("--insecure", action="store_true", help="no TLS verification / worker auth (the same for every policy)")
    p.add_argument("--idle-timeout", type=float, metavar="S",
                   help="QUIC idle timeout of the NetSense rows (default: transport.idle_timeout_s); raise it on a "
                   "machine so loaded that a starting job goes 10 s without a packet")  # fmt: skip
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.set_defaults(func=run)


def parse_policies(text: str) -> list[str]:
    """The policy list, each checked by building it once (a typo fails before anything runs)."""
    from netsense.compression import DEFAULT_LADDER, Ladder, make_policy

    names = [p.strip() for p in text.split(",") if p.strip()]
    # "fixed:topk:0.01+fp16" contains no comma, so a plain split is safe.
    if not names:
        raise ConfigError(f"--policies {text!r} names no policy; e.g. --policies none,fp16,netsense")
    if len(set(names)) != len(names):
        raise ConfigError(f"--policies {text!r} repeats a policy")
    from netsense.bench.ddp_baseline import HOOKS

    ladder = Ladder.parse(DEFAULT_LADDER)
    for name in names:
        name = name.removeprefix("netns:")
        if name.startswith("ddp:"):
            if name[4:] not in HOOKS:
                raise ConfigError(f"--policies: {name!r} is no DDP peer; use one of {', '.join('ddp:' + h for h in HOOKS)}")
            continue
        make_policy(name, ladder)
    return names


def _slug(policy: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", policy)


class _TimeUp(Exception):
    """Raised from the event callback to stop a job at --max-time."""


def run_policy(
    config: JobConfig,
    *,
    run_dir: Path,
    link: str | None,
    trace: str | None,
    spec: DuplexSpec | None,
    max_time_s: float,
    target: float,
    global_batch: int,
    verbose: int = 0,
    netns_link: str | None = None,
    topology: str = "bottleneck",
    sites: int | None = None,
) -> dict[str, Any]:
    """One policy's job, across `netns_link`'s tbf when given (in `topology`), else through the
    emulator (or none).

    Returns its figures (see `netsense.bench.results.policy_figures`)."""
    from netsense.bench.results import policy_figures, step_compute

    if run_dir.exists():
        shutil.rmtree(run_dir)  # decision logs append: a stale one would mix two runs
    steps: dict[int, dict[int, dict[str, Any]]] = {r: {} for r in range(config.workers)}
    evals: list[dict[str, Any]] = []
    starts: dict[int, float] = {}  # rank -> when its first start event arrived (`start_skew`)

    def on_event(rank: int, e: dict[str, Any]) -> None:
        kind = e.get("event")
        if kind == "start":
            starts.setdefault(rank, time.monotonic())
        elif kind == "step":
            steps[rank][int(e["step"])] = {**e, "mono": time.monotonic()}
            if rank == 0 and float(e["wall_s"]) > max_time_s:
                raise _TimeUp
        elif kind == "eval" and rank == 0:
            evals.append(e)

    stopped = False
    wan: dict[str, int] | None = None
    if netns_link is not None and topology == "sites":
        from netsense.transport.emulation.sites import SitesTopology

        config = override(config, transport__max_datagram_size=1400, sites=scenario_sites(config.workers, sites))
        config = with_sites(config)
        names = [s.name for s in config.sites]
        with SitesTopology(names, netns_link) as sites_topo:
            launcher = SitesLauncher(config, verbose=verbose, on_event=on_event, run_dir=run_dir, topo=sites_topo)
            launcher.link_t0 = time.monotonic()
            before = sites_topo.wan_bytes()
            try:
                launcher.run()
            except _TimeUp:
                stopped = True
            after = sites_topo.wan_bytes()
        wan = {s: after[s] - before[s] for s in names}
    elif netns_link is None:
        launcher = ScenarioLauncher(config, verbose=verbose, on_event=on_event, run_dir=run_dir, link=link, trace=trace)
        try:
            launcher.run()
        except _TimeUp:
            stopped = True
    else:
        from netsense.transport.emulation.netns import NetnsTopology

        # Real 1500-byte frames on the veths: QUIC packets must fit (no loopback-sized datagrams).
        config = override(config, transport__max_datagram_size=1400)
        with NetnsTopology(netns_link) as topo:
            launcher = NetnsLauncher(config, verbose=verbose, on_event=on_event, run_dir=run_dir, topo=topo)
            launcher.link_t0 = time.monotonic()  # tbf is a constant rate: the clock only orders the steps
            try:
                launcher.run()
            except _TimeUp:
                stopped = True
    decisions = {}
    for rank in range(config.workers):
        path = Path(launcher._up_log(rank))
        decisions[rank] = read_decision_log(path) if path.exists() else []
    figures = policy_figures(
        steps=steps, evals=evals, decisions=decisions, link_t0=launcher.link_t0, spec=spec, target=target,
        global_batch=global_batch, starts=starts,
    )  # fmt: skip
    figures["stopped_at_max_time"] = stopped
    if launcher.relays:
        figures["relays"] = [{k: v for k, v in r.items() if k != "events"} for r in launcher.relays]
    if wan is not None and spec is not None:
        compute = [c for c in step_compute(steps, decisions, evals).values() if c]
        figures.update(wan_figures(wan, figures["steps"], spec, list(wan), compute))
        # Across sites a worker's bytes to its own shard never meet the link: the ideal is the WAN's.
        figures["ideal_step_app_s"], figures["ideal_step_s"] = figures["ideal_step_s"], figures["wan_ideal_step_s"]
    figures["levels"] = _levels(decisions)
    down = [Path(launcher._down_log(i)) for i in range(config.servers)]
    figures["levels_down"] = _levels({i: read_decision_log(p) for i, p in enumerate(down) if p.exists()})
    return figures


def _netns_link(args: argparse.Namespace, policy: str) -> str:
    """The tbf spec of a netns:* or ddp:* run; ConfigError where namespaces are unavailable."""
    from netsense.transport.emulation.netns import netns_available

    ok, reason = netns_available()
    if not ok:
        raise ConfigError(f"{policy} needs network namespaces: {reason}; drop it from --policies")
    return args.netns_link or args.link or ""


def _run_ddp(args: argparse.Namespace, policy: str, *, steps: int, batch_size: int, target: float) -> dict[str, Any]:
    """A DDP peer's figures, stopped at --max-time as a NetSense job is (`ddp_baseline.run_ddp`)."""
    from netsense.bench import ddp_baseline

    link = _netns_link(args, policy)
    print(f"== {policy}: {args.model} x{args.workers}, DDP gloo through netns tbf ({args.topology}): "
          f"{link or 'unshaped'}", flush=True)  # fmt: skip
    wan: dict[str, int] = {}
    events = ddp_baseline.run_ddp(
        model=args.model, hook=policy[4:], link=link, workers=args.workers, steps=steps, seed=args.seed,
        batch_size=batch_size, eval_every=args.eval_every, max_time_s=args.max_time, topology=args.topology,
        wan_out=wan, sites=args.sites,
    )  # fmt: skip
    figs = ddp_baseline.figures(events, link=link, target=target, global_batch=batch_size * args.workers)
    figs["path"] = f"netns tbf {link}"
    figs["topology"] = args.topology
    if wan:
        figs.update(wan_figures(wan, figs["steps"], parse_link(link), list(wan)))
        figs["ideal_step_app_s"], figs["ideal_step_s"] = figs["ideal_step_s"], figs["wan_ideal_step_s"]
    figs["stopped_at_max_time"] = not any(e["event"] == "step" and e["step"] == steps for e in events[0])
    print(f"   {figs['steps']} steps in {figs['wall_s']:.1f} s, time to target {figs['time_to_target_s']}", flush=True)
    return figs


def _levels(decisions: dict[int, list[dict[str, Any]]]) -> dict[str, int]:
    """Sends per codec spec over decision logs (all workers' uplinks, or every shard's downlink)."""
    out: dict[str, int] = {}
    for records in decisions.values():
        for d in records:
            out[d["spec"]] = out.get(d["spec"], 0) + 1
    return out


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def scenario_info(args: argparse.Namespace, *, steps: int, batch_size: int, policies: list[str]) -> dict[str, Any]:
    """What ran, where and when: goes into results.json with every figure."""
    import torch

    return {
        "model": args.model,
        "workers": args.workers,
        "link": args.link,
        "trace": args.trace,
        "policies": policies,
        "downlink": args.downlink,
        "seed": args.seed,
        "steps": steps,
        "batch_size": batch_size,
        "eval_every": args.eval_every,
        "max_time_s": args.max_time,
        "topology": getattr(args, "topology", "sites"),
        "progress_table": getattr(args, "progress_table", None),
        "sites": getattr(args, "sites", None) or args.workers,
        "idle_timeout_s": getattr(args, "idle_timeout", None),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "netsense " + " ".join(sys.argv[1:]) if sys.argv and "netsense" in sys.argv[0] else None,
        "cpus": os.cpu_count(),
        "torch_threads_per_process": int(os.environ.get("OMP_NUM_THREADS", "0")) or None,
        "processes": 1 + args.workers + (1 if args.link or args.trace else 0),
        "loadavg_start": _loadavg(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def write_outputs(results: dict[str, Any], out: Path, *, plots: bool = True) -> None:
    from netsense.bench.plot import plot_results
    from netsense.bench.results import markdown_table

    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=1, allow_nan=False) + "\n")
    tmp.replace(out / "results.json")
    (out / "results.md").write_text(markdown_table(results) + wan_table(results) + relay_table(results) + "\n")
    if plots:
        plot_results(results, out)


def run(args: argparse.Namespace) -> int:
    from netsense.models import load_task
    from netsense.bench.results import markdown_table, validate_results

    if args.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {args.workers}")
    if args.max_time <= 0:
        raise ConfigError(f"--max-time must be > 0, got {args.max_time}")
    if args.idle_timeout is not None and not args.idle_timeout > 0:
        raise ConfigError(f"--idle-timeout must be > 0, got {args.idle_timeout}")
    if args.eval_every < 1:
        raise ConfigError(f"--eval-every must be >= 1 (time to target needs evals), got {args.eval_every}")
    policies = parse_policies(args.policies)
    if args.topology == "sites" and args.workers < 2 and any(p.startswith(("netns:", "ddp:")) for p in policies):
        raise ConfigError("--topology sites puts one worker at each site and needs --workers >= 2; "
                          "or use --topology bottleneck")  # fmt: skip
    if args.sites is not None:
        if args.topology != "sites":
            raise ConfigError("--sites needs --topology sites")
        if not 2 <= args.sites <= args.workers:
            raise ConfigError(f"--sites must be in 2..--workers ({args.workers}), got {args.sites}")
        site_workers(args.workers, args.sites)
    table = getattr(args, "progress_table", None)
    if table is not None:
        if not any(p.removeprefix("netns:") == "netsense" for p in policies):
            raise ConfigError("--progress-table is read by the netsense policy only, and --policies has no netsense row")
        for direction in ("up", "down"):
            read_progress_table(table, direction)  # a bad file fails before any policy runs
        table = str(Path(table).resolve())
    for policy in policies:
        if policy.startswith(("netns:", "ddp:")):
            _netns_link(args, policy)  # fail before any policy runs, with the reason
    spec = parse_link(args.link or "", trace=args.trace) if (args.link or args.trace) else None
    task = load_task(args.model)  # a bad --model: the same line as `launch` and `worker` say
    target = args.target_accuracy if args.target_accuracy is not None else DEFAULT_TARGETS.get(args.model)
    if target is None:
        raise ConfigError(f"--target-accuracy is required for model {args.model!r} (no default for it)")
    if not 0 < target <= 1:
        raise ConfigError(f"--target-accuracy must be in (0, 1], got {target}")
    steps = args.steps or task.steps
    batch_size = args.batch_size or task.batch_size
    # Workers, PS and emulator share the cores: one torch thread each avoids oversubscription.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "format": "netsense-bench-scenario",
        "version": 1,
        "scenario": scenario_info(args, steps=steps, batch_size=batch_size, policies=policies),
        "target_accuracy": target,
        "policies": {},
    }
    base = override(
        JobConfig(), model=args.model, workers=args.workers, train__steps=steps, train__seed=args.seed,
        train__batch_size=batch_size, train__eval_every=args.eval_every, train__ladder=args.ladder,
        server__ladder=args.ladder, security__insecure=args.insecure or None,
        transport__idle_timeout_s=getattr(args, "idle_timeout", None),
    )  # fmt: skip
    failed: dict[str, str] = {}
    for policy in policies:
        if policy.startswith("ddp:"):
            try:
                results["policies"][policy] = _run_ddp(args, policy, steps=steps, batch_size=batch_size, target=target)
            except NetSenseError as exc:  # a peer that crashed or hung ends its row, not the comparison
                print(f"   {policy} failed: {exc}", file=sys.stderr, flush=True)
                failed[policy] = str(exc)
                results["failed"] = failed
            write_outputs(results, out, plots=False)
            continue
        inner = policy.removeprefix("netns:")
        config = override(
            base, train__policy=inner, server__policy=inner if args.downlink == "same" else None,
            server__downlink_domain="gradient" if args.downlink == "gradient" else "params",
        )
        if inner == "netsense" and table is not None:
            config = override(config, train__progress_table=table, server__progress_table=table if args.downlink == "same" else None)
        netns_link = _netns_link(args, policy) if policy.startswith("netns:") else None
        where = f"netns tbf {netns_link}" if netns_link is not None else spec.describe() if spec else "unshaped loopback"
        print(f"== {policy}: {args.model} x{args.workers}, {where}", flush=True)
        figs = run_policy(
            config, run_dir=out / "runs" / _slug(policy), link=args.link, trace=args.trace,
            spec=parse_link(netns_link) if netns_link is not None else spec, max_time_s=args.max_time, target=target,
            global_batch=batch_size * args.workers, verbose=args.verbose, netns_link=netns_link,
            topology=args.topology, sites=args.sites,
        )  # fmt: skip
        if netns_link is not None:
            figs["path"] = f"netns tbf {netns_link}"
            figs["topology"] = args.topology
        results["policies"][policy] = figs
        ttt = figs["time_to_target_s"]
        print(
            f"   {figs['steps']} steps in {figs['wall_s']:.1f} s, {figs['samples_per_s']:.0f} samples/s, "
            f"target {'not reached' if ttt is None else f'at {ttt:.1f} s'}, final accuracy {figs['final_accuracy']:.4f}"
            + (f", the last worker started {figs['start_skew_s']:.2f} s after rank 0" if figs.get("start_skew_s") else ""),
            flush=True,
        )
        write_outputs(results, out, plots=False)
    results["scenario"]["loadavg_end"] = _loadavg()
    write_outputs(results, out)
    print(markdown_table(results) + wan_table(results) + relay_table(results))
    if failed:
        print(f"failed, with their reasons under 'failed' in results.json: {', '.join(failed)}", file=sys.stderr)
    problems = validate_results(results)
    if problems:
        print("results.json fails its consistency checks: " + "; ".join(problems), file=sys.stderr)
        return 1
    return 1 if failed else 0
