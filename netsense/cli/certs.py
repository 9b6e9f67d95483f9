"""`netsense certs`: a development CA, a server certificate and a worker secret."""

from __future__ import annotations

import argparse

from netsense.cli.flags import check_host
from netsense.devcerts import default_certs_dir
from netsense.errors import ConfigError
from netsense.transport.tls import make_dev_certs


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "certs",
        help="create a dev CA, server certificate and shared worker secret",
        description="Create a development CA + server certificate (workers pin the CA) and a shared secret "
        "(workers authenticate with it). Copy ca.pem and secret to the workers; keep server.key on the PS. "
        "Existing files are never replaced without --force: workers holding the old CA and secret could no longer connect.",
        epilog="Example: netsense certs --out ./certs --host ps.example.org --host 10.1.2.3",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", help=f"output folder (default {default_certs_dir()})")
    p.add_argument("--host", action="append", help="DNS name or IP the PS is reached at (repeatable; default localhost, 127.0.0.1, ::1)")
    p.add_argument("--days", type=int, default=365, help="validity in days, >= 1 (default 365)")
    p.add_argument("--force", action="store_true", help="replace an existing CA, certificate and secret (every worker then needs the new ca.pem and secret)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.days < 1:
        raise ConfigError(f"--days must be >= 1, got {args.days}")
    for host in args.host or []:
        check_host("--host", host)
    paths = make_dev_certs(args.out or default_certs_dir(), args.host, args.days, force=args.force)
    print(f"CA:          {paths.ca}\nserver cert: {paths.cert}\nserver key:  {paths.key}\nsecret:      {paths.secret}")
    return 0
