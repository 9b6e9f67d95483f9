"""`netsense plot DIR`: redraw a scenario's figures and table from DIR/results.json."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from netsense.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "plot",
        help="redraw the figures of a `netsense bench scenario` run from its results.json",
        description="Read DIR/results.json (written by `netsense bench scenario --out DIR`), check it against "
        "the schema, and write accuracy.png, timeline.png, throughput.png and results.md into DIR.",
        epilog="Example:\n  netsense bench scenario --model digits-cnn --link rate=20mbit --out runs/20mbit\n"
        "  netsense plot runs/20mbit",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dir", metavar="DIR", help="a bench folder (results.json) or a `netsense launch --run-dir` folder")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from netsense.bench.plot import plot_results
    from netsense.bench.results import markdown_table, validate_results

    path = Path(args.dir) / "results.json"
    if not path.exists():
        from netsense.bench.plot_run import is_run_dir, plot_run

        if is_run_dir(Path(args.dir)):  # a `netsense launch` run folder
            for p in plot_run(args.dir):
                print(p)
            return 0
    try:
        results = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}; run `netsense bench scenario --out {args.dir}` first") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not JSON: {exc}") from None
    problems = validate_results(results)
    if problems:
        raise ConfigError(f"{path} does not match the results schema: {'; '.join(problems[:5])}")
    for p in plot_results(results, args.dir):
        print(p)
    table = markdown_table(results)
    (Path(args.dir) / "results.md").write_text(table + "\n")
    print(table)
    return 0
