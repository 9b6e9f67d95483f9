"""Do the two WAN directions of a two-site run carry traffic together, or take turns?

Measurement script for docs/BENCHMARKS.md ("WAN-first release"), not part of the product.

    # while `netsense bench scenario ... --workers 2` runs (root), in its router namespace:
    ip netns exec netsense-<tag>-router python scripts/wan_turns.py sample tx.txt 60
    python scripts/wan_turns.py report tx.txt --rate 20mbit

`sample` reads every interface's tx_bytes (sysfs of the namespace it runs in) every 2 ms and writes
a line per change; `report` bins both directions into 10 ms and, over the bins where either runs
near full (>= 80 % of the rate), counts those where only one does and the other is near idle
(< 10 %): the directions taking turns.
"""

from __future__ import annotations

import argparse
import collections
import os
import time


def sample(out: str, seconds: float) -> None:
    ifaces = [i for i in os.listdir("/sys/class/net") if i != "lo"]
    files = {i: open(f"/sys/class/net/{i}/statistics/tx_bytes") for i in ifaces}  # noqa: SIM115
    last: dict[str, int] = {}
    end = time.monotonic() + seconds
    with open(out, "w") as f:
        while time.monotonic() < end:
            now = time.monotonic()
            try:
                for name, stat in files.items():
                    stat.seek(0)
                    value = int(stat.read())
                    if last.get(name) != value:
                        f.write(f"{now:.4f} {name} {value}\n")
                        last[name] = value
            except OSError:  # the run tore its namespace down
                return
            time.sleep(0.002)


def report(path: str, rate_Bps: float, bin_s: float = 0.01) -> dict[str, float]:
    series: dict[str, list[tuple[float, int]]] = collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3:
                series[parts[1]].append((float(parts[0]), int(parts[2])))
    if len(series) != 2:
        raise SystemExit(f"{path}: expected the router's two interfaces, found {sorted(series)}")
    bins: dict[str, collections.Counter[int]] = {}
    for name, points in series.items():
        counts: collections.Counter[int] = collections.Counter()
        for (_, before), (t, value) in zip(points, points[1:]):
            counts[int(t / bin_s)] += value - before
        bins[name] = counts
    a, b = (bins[n] for n in sorted(bins))
    full, idle = 0.8 * rate_Bps * bin_s, 0.1 * rate_Bps * bin_s
    busy = [k for k in sorted(set(a) | set(b)) if a[k] >= full or b[k] >= full]
    if not busy:
        raise SystemExit(f"{path}: no bin ran near {rate_Bps:.3g} B/s")
    one = sum(1 for k in busy if (a[k] >= full and b[k] < idle) or (b[k] >= full and a[k] < idle))
    both = sum(1 for k in busy if a[k] >= full and b[k] >= full)
    return {"busy_bins": len(busy), "one_direction_only": one / len(busy), "both_full": both / len(busy)}


def _rate(text: str) -> float:
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}
    for unit, scale in units.items():
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale / 8
    return float(text) / 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    s.add_argument("out")
    s.add_argument("seconds", type=float)
    r = sub.add_parser("report")
    r.add_argument("files", nargs="+")
    r.add_argument("--rate", default="20mbit", help="the shaped rate of each direction (e.g. 20mbit)")
    args = parser.parse_args()
    if args.cmd == "sample":
        sample(args.out, args.seconds)
    else:
        for path in args.files:
            print(path, report(path, _rate(args.rate)))


if __name__ == "__main__":
    main()
