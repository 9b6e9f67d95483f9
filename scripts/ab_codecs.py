"""A/B of the codecs of an older commit against the working tree, timed in turn in one process.

    .venv/bin/python scripts/ab_codecs.py OLD_COMMIT [SPECS [NUMEL [REPEATS]]]

Per repeat: one clone, old encode, new encode, old decode, new decode, so that machine load hits
both alike; prints medians over the clone median of the same rounds, and the ratio of minimums.
The old `compression/` is copied out of git into a temporary package (its own codec registry).
"""

from __future__ import annotations

import importlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from netsense.compression import make_codec
from netsense.compression.bench import DEFAULT_SPECS, matrix_shape


def old_package(commit: str, root: Path) -> object:
    """Import `compression/` of `commit` as the package `oldcomp` under `root`."""
    package = root / "oldcomp"
    package.mkdir()
    names = subprocess.run(["git", "ls-tree", "--name-only", commit, "compression/"], check=True,
                           capture_output=True, text=True).stdout.split()
    for name in names:
        text = subprocess.run(["git", "show", f"{commit}:{name}"], check=True, capture_output=True, text=True).stdout
        (package / Path(name).name).write_text(text)
    sys.path.insert(0, str(root))
    return importlib.import_module("oldcomp")


def timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> None:
    commit = sys.argv[1]
    specs = sys.argv[2].split(",") if len(sys.argv) > 2 else list(DEFAULT_SPECS)
    numel = int(sys.argv[3]) if len(sys.argv) > 3 else 11_000_000
    repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    with tempfile.TemporaryDirectory() as tmp:
        old = old_package(commit, Path(tmp))
        x = torch.randn(matrix_shape(numel), generator=torch.Generator().manual_seed(0))
        for _ in range(3):
            x.clone()
        for spec in specs:
            co, cn = old.make_codec(spec), make_codec(spec)  # type: ignore[attr-defined]
            po, pn = co.encode(x), cn.encode(x)
            co.decode(po), cn.decode(pn)
            t: dict[str, list[float]] = {k: [] for k in ("clone", "enc_old", "enc_new", "dec_old", "dec_new")}
            for _ in range(repeats):
                t["clone"].append(timed(x.clone))
                t["enc_old"].append(timed(lambda: co.encode(x)))
                t["enc_new"].append(timed(lambda: cn.encode(x)))
                t["dec_old"].append(timed(lambda: co.decode(po)))
                t["dec_new"].append(timed(lambda: cn.decode(pn)))
            med = {k: statistics.median(v) for k, v in t.items()}
            low = {k: min(v) for k, v in t.items()}
            c, m = med["clone"], low["clone"]
            print(f"{spec:18s} clone {c * 1e3:5.1f} ms | encode {med['enc_old'] / c:5.2f}x -> {med['enc_new'] / c:5.2f}x"
                  f" | decode {med['dec_old'] / c:5.2f}x -> {med['dec_new'] / c:5.2f}x"
                  f" | of minimums: encode {low['enc_old'] / m:.2f} -> {low['enc_new'] / m:.2f},"
                  f" decode {low['dec_old'] / m:.2f} -> {low['dec_new'] / m:.2f}"
                  f" | wire {po.wire_size / (4 * numel):.4f} / {pn.wire_size / (4 * numel):.4f}", flush=True)


if __name__ == "__main__":
    main()
