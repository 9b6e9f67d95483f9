"""`netsense launch`: a whole job on this machine (1 PS + N workers over QUIC on loopback)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from netsense.cli.flags import add_config_flag, add_job_flags, check_host, check_port, resolve_config
from netsense.config import SettingError, override, with_sites
from netsense.errors import ConfigError
from netsense.launch.jsonout import strict_json
from netsense.launch.launcher import Launcher
from netsense.launch.outputs import check_output_file
from netsense.launch.sites import parse_sites


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "launch",
        help="run 1 PS + N workers locally (the default job)",
        description="Start a parameter server and N workers as separate processes on loopback, over QUIC with "
        "TLS verification and worker authentication (dev certs are created in a cache dir). Shows progress, "
        "stops everything on Ctrl-C or on any failure.",
        epilog="Examples:\n  netsense launch\n  netsense launch --workers 4 --codec fp16 --steps 200 --summary-json out.json\n"
        "  netsense launch --sites 'a:workers=1,shards=1;b:workers=1,shards=1' --link rate=20mbit,delay=10ms",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_flag(p)
    p.add_argument("--workers", type=int, help="number of worker processes (default 2)")
    p.add_argument("--servers", type=int, help="number of PS shard processes; keys are spread over them by size (default 1)")
    p.add_argument("--sites", metavar="DESC", help="sites and what runs at each, e.g. 'a:workers=1,shards=1;b:workers=2,shards=1' "
                   "(a count left out is 1): ranks and shards in that order, keys split by size over all shards, "
                   "--link only between sites; sets --workers and --servers (TOML: [[sites]] tables)")
    p.add_argument("--no-relay", dest="relay", action="store_false", default=None,
                   help="with --sites: no relay at a site of several workers (each worker crosses the WAN alone; "
                   "default: a relay sums each such site's gradients before the WAN; TOML: relay = false)")
    p.add_argument("--summary-json", metavar="PATH", help="write the summary JSON here")
    p.add_argument("--run-dir", metavar="DIR", help="folder for the resolved config and logs (default: a temp dir)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--link", metavar="SPEC", help="emulated link between workers and PS (netsense emulate), "
                   "e.g. rate=20mbit,delay=10ms; with --sites, between a worker and the shards of other sites")
    p.add_argument("--trace", metavar="FILE", help="rate trace for the emulated link (CSV or Mahimahi)")
    add_job_flags(
        p, train=True, staleness=True, metrics=True,
        metrics_help="Prometheus metrics from every process: PS shard i on PORT+i, worker r on PORT+SERVERS+r "
        "(one shard: the PS on PORT, worker r on PORT+1+r); 0 = each picks a free port, listed in the summary",
    )  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = resolve_config(args)  # every range and spec checked here, before any process starts
    if args.sites is not None:
        try:
            config = override(config, sites=parse_sites(args.sites))
        except ConfigError as exc:
            raise ConfigError(f"--sites: {exc}") from None
    try:
        config = with_sites(config, {n for n in ("workers", "servers") if getattr(args, n) is not None})
    except SettingError as exc:
        raise ConfigError(f"--{exc.path} {exc.detail}") from None
    check_port("--metrics-port", args.metrics_port)
    check_host("--metrics-host", args.metrics_host)
    if args.metrics_port:
        check_port("--metrics-port", args.metrics_port + config.servers + config.workers - 1)
    bar = None  # drawn once the job is checked: a bad --model or --link is then the only line printed

    def on_event(rank: int, e: dict[str, Any]) -> None:
        if bar is None or rank != 0:
            return
        if e.get("event") == "step":
            bar.total = e["steps"]
            bar.n = e["step"]
            bar.set_postfix(
                loss=f"{e['loss']:.3f}", sps=f"{e['samples_per_s']:.0f}", up=_mb(e["bytes_up"]), down=_mb(e["bytes_down"]),
                codec=e.get("codec", ""), refresh=False,
            )  # fmt: skip
            bar.refresh()
        elif e.get("event") == "eval":
            bar.write(f"step {e['step']}: test accuracy {e['test_accuracy']:.4f}")

    launcher = Launcher(
        config, verbose=args.verbose, on_event=on_event, run_dir=args.run_dir, link=args.link, trace=args.trace,
        metrics_port=args.metrics_port, metrics_host=args.metrics_host,
    )  # fmt: skip
    launcher.check()  # a model that does not load, a bad link: one line, before any process starts
    # The run folder is the job's own (checked above): made now, a summary inside it can be checked
    # (the README's main job writes runs/demo/summary.json, which a fresh clone does not have).
    launcher.run_dir.mkdir(parents=True, exist_ok=True)
    check_output_file("--summary-json", args.summary_json)  # not a traceback after the job ran
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=None, unit="step", desc=f"{config.model} x{config.workers}", dynamic_ncols=True)
    try:
        summary = launcher.run()
    finally:
        if bar is not None:
            bar.close()
    text = strict_json(summary, indent=2)
    print(text)
    if args.summary_json:
        Path(args.summary_json).write_text(text + "\n")
    return 0


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f}MB"
