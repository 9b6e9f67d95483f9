"""`netsense bench`: micro- and macro-benchmarks, one sub-subcommand per bench kind.

Each kind lives in its own module ``netsense/bench/<kind>.py`` with ``register(kinds) -> None``
that adds its parser to the ``bench`` subparsers and sets ``func=run``, the same contract as the
top-level commands in `netsense.cli`. Adding a kind is adding a module and its name to `KINDS`.
"""

from __future__ import annotations

import argparse

from netsense.cli import register_modules

KINDS: tuple[str, ...] = ("codecs", "transport", "scenario", "matrix", "shards")
"""Bench kinds, in --help order; a kind whose module does not exist yet is simply absent."""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `bench` subcommand and every available bench kind under it."""
    p = sub.add_parser(
        "bench",
        help="benchmarks: codec speed and wire ratio, training scenarios",
        description="Benchmarks whose figures go into docs/BENCHMARKS.md. Each kind prints a table and can "
        "write JSON; record the date, the machine and the exact command with every figure.",
        epilog="Examples:\n  netsense bench codecs --numel 11000000 --json codecs.json\n"
        "  netsense bench codecs --help",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    kinds = p.add_subparsers(dest="bench_kind", metavar="KIND")
    register_modules(kinds, "netsense.bench", KINDS)
    p.set_defaults(func=_usage(p))


def _usage(parser: argparse.ArgumentParser):  # type: ignore[no-untyped-def]
    """`netsense bench` without a kind: show the kinds and fail like a usage error."""

    def run(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    return run
