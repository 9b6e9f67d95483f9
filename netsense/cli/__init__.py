"""The `netsense` command line: one entry point, one module per subcommand (`netsense/cli/<name>.py`).

Each subcommand module defines ``register(subparsers) -> None`` that adds its parser and sets
``func=run`` where ``run(args) -> int`` returns the exit status. Adding a command is adding a module
to `_COMMANDS`; nothing else changes. The entry point lives here, in the package itself, so that
the console script and ``from netsense.cli import main`` name the same place.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import signal
import sys
import typing
from collections.abc import Iterable

from netsense.errors import NetSenseError

_COMMANDS = ("ps", "worker", "relay", "launch", "certs", "calibrate", "bench", "emulate", "probe", "plot", "export")
SUPERVISORS = ("launch", "bench")
"""Commands whose children (shards, workers, relays, emulators, network namespaces) must not
outlive them: for these SIGTERM (a scheduler's time limit, `kill`) unwinds as Ctrl-C does, through
the clean-up that stops every child. Killed outright, they left their children running."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread of a supervising command."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated()


def register_modules(sub: argparse._SubParsersAction, package: str, names: Iterable[str]) -> None:  # type: ignore[type-arg]
    """Call ``register(sub)`` of each module ``package.name``, in order.

    A module that does not exist is simply absent (a command or bench kind not built yet); a module
    that exists but fails to import still raises, so a broken import is never hidden."""
    for name in names:
        try:
            module = importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{package}.{name}":
                raise
            continue
        module.register(sub)


class OneLineParser(argparse.ArgumentParser):
    """A usage error is one line, like every other bad input (the usage block is in --help);
    subcommand parsers inherit the class."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def command_of(argv: list[str]) -> str | None:
    """The subcommand `argv` names, or None where only the full parser can answer.

    The top-level parser's one option before the command is -v (a count, no value), so the
    command is the first word that is not -v...; anything else first (-h, an unknown word, an
    abbreviation) gets None, and with it every subcommand, as before."""
    for word in argv:
        if word.startswith("-"):
            if re.fullmatch(r"-v+|--verbose", word):
                continue
            return None
        return word if word in _COMMANDS else None
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, with every available subcommand registered; with `only`, just that one.

    `main` passes `only`: importing every subcommand module imports torch (~2 s of CPU), which
    `netsense emulate`, started on each emulated job's critical path, has no use for."""
    parser = OneLineParser(
        prog="netsense",
        description="Parameter-server training over QUIC with network-adaptive gradient compression.",
        epilog="Example: netsense launch            # 1 PS + 2 workers on digits-cnn, TLS on",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    register_modules(sub, "netsense.cli", (only,) if only else _COMMANDS)
    if only and not sub.choices:  # not built (yet): the full parser says which commands exist
        register_modules(sub, "netsense.cli", _COMMANDS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(only=command_of(argv))
    args = parser.parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if args.command in SUPERVISORS:
        signal.signal(signal.SIGTERM, _terminated)
    try:
        return int(args.func(args) or 0)
    except NetSenseError as exc:
        print(f"netsense {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except Terminated:
        print(f"netsense {args.command}: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"netsense {args.command}: interrupted", file=sys.stderr)
        return 130
