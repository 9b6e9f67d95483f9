"""`netsense bench codecs`: encode/decode time and wire ratio of codecs, against one memory pass."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from netsense.compression.bench import DEFAULT_SPECS, REFERENCE, make_bench_codec, run_codec_bench
from netsense.errors import ConfigError

EPILOG = f"""\
Times are medians over --repeats runs on one random normal tensor shaped as a near-square matrix.
"x clone" divides by the median time of one tensor.clone() timed in turn with that codec's
encode and decode (clone, encode, decode, repeated), so that figures taken on a loaded machine
remain comparable; the wire ratio is payload bytes / fp32 bytes.
A top-k spec ending in {REFERENCE} times its torch.topk selection (the reference that exact top-k's
CPU scan replaced), e.g. topk:0.01{REFERENCE}.
Default specs: {",".join(DEFAULT_SPECS)}
Examples:
  netsense bench codecs --numel 11000000 --json codecs.json
  netsense bench codecs --specs fp16,qsgd:8,topka:0.01+fp16 --repeats 9
  netsense bench codecs --specs topk:0.01,topk:0.01{REFERENCE},topk:0.01+fp16,topk:0.01+fp16{REFERENCE}
  netsense bench codecs --device cuda --numel 100000000"""


def register(kinds: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `codecs` bench kind."""
    p = kinds.add_parser(
        "codecs",
        help="encode/decode seconds and wire ratio of each codec",
        description="Time every codec spec's encode and decode on one tensor and report the wire ratio.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--numel", type=int, default=11_000_000, help="tensor elements (default 11000000, ResNet-18-sized)")
    p.add_argument("--specs", metavar="A,B,C", help="comma-separated codec specs (default: one or more per family)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per figure; the median is kept (default 5)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument(
        "--rows", type=float, default=1.0,
        help="share of the matrix's rows that are nonzero, the rest zero as an embedding's untouched rows (default 1)",
    )  # fmt: skip
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON here")
    p.set_defaults(func=run)


def parse_specs(text: str | None) -> list[str]:
    """The spec list, each built once so that a typo fails before anything is timed."""
    specs = list(DEFAULT_SPECS) if text is None else [s.strip() for s in text.split(",") if s.strip()]
    if not specs:
        raise ConfigError(f"--specs {text!r} names no codec; e.g. --specs fp16,qsgd:8")
    for spec in specs:
        make_bench_codec(spec)  # raises CompressionError naming the bad spec and the known codecs
    return specs


def check_device(name: str) -> str:
    """`name` if torch can run on it here, else a ConfigError saying why (the worker's check)."""
    from netsense.worker.device import resolve_device

    resolve_device(name)
    return name


def format_table(result: dict[str, Any]) -> str:
    """One row per codec: seconds, multiples of one clone, wire ratio."""
    clone = result["clone_s"]
    width = max([5, *(len(s) for s in result["codecs"])])
    lines = [
        f"numel {result['numel']}, nonzero rows {result.get('rows', 1.0):g}, clone {clone * 1e3:.2f} ms"
        " (median of all; each row divides by its own clone)",
        f"{'codec':<{width}}  {'encode ms':>10} {'x clone':>8}  {'decode ms':>10} {'x clone':>8}  {'ratio':>7}  {'clone ms':>8}",
    ]
    for spec, f in result["codecs"].items():
        own = f.get("clone_s", clone)  # the clone timed alongside this codec
        lines.append(
            f"{spec:<{width}}  {f['encode_s'] * 1e3:>10.2f} {f['encode_s'] / own:>8.2f}  "
            f"{f['decode_s'] * 1e3:>10.2f} {f['decode_s'] / own:>8.2f}  {f['ratio']:>7.4f}  {own * 1e3:>8.2f}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.numel < 1:
        raise ConfigError(f"--numel must be >= 1, got {args.numel}")
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {args.repeats}")
    if not 0.0 < args.rows <= 1.0:
        raise ConfigError(f"--rows must be in (0, 1], got {args.rows}")
    specs = parse_specs(args.specs)
    device = check_device(args.device)
    result = run_codec_bench(numel=args.numel, specs=specs, repeats=args.repeats, device=device, rows=args.rows)
    print(format_table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0
