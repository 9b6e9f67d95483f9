"""Plots of one `netsense launch` run folder: link timeline and accuracy vs time.

Reads what the launcher leaves behind: `decisions-up-<rank>.jsonl` (per step: time, bandwidth
estimate, chosen level), `events.jsonl` (step and eval events) and `launch.json` (the emulated
link, so its true rate can be drawn). Bench folders (`results.json`) are drawn by `plot.py`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from netsense.errors import ConfigError
from netsense.transport.emulation.linkspec import parse_link


def _jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a crash: skip it, keep the rest
    return out


def is_run_dir(d: Path) -> bool:
    """True for a launch run folder (decision logs or events)."""
    return (d / "events.jsonl").exists() or any(d.glob("decisions-up-*.jsonl"))


def plot_run(run_dir: str | Path) -> list[Path]:
    """Write timeline.png and accuracy.png into `run_dir`; returns their paths."""
    d = Path(run_dir)
    if not is_run_dir(d):
        raise ConfigError(f"{d} holds no decisions-up-*.jsonl or events.jsonl: not a `netsense launch` run folder")
    ups = {p.stem.rsplit("-", 1)[-1]: _jsonl(p) for p in sorted(d.glob("decisions-up-*.jsonl"))}
    events = _jsonl(d / "events.jsonl") if (d / "events.jsonl").exists() else []
    launch = json.loads((d / "launch.json").read_text()) if (d / "launch.json").exists() else {}
    t0 = min((r["t"] for recs in ups.values() for r in recs[:1]), default=0.0)

    fig, (ax_bw, ax_level, ax_sps) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for rank, recs in ups.items():
        ts = [r["t"] - t0 for r in recs]
        ax_bw.plot(ts, [(r.get("bw_Bps") or float("nan")) * 8 / 1e6 for r in recs], label=f"worker {rank} estimate")
        ax_level.step(ts, [r["level"] if r.get("level") is not None else float("nan") for r in recs], where="post", label=f"worker {rank}")
    t_end = max((r["t"] - t0 for recs in ups.values() for r in recs[-1:]), default=1.0)
    if launch.get("link") or launch.get("trace"):
        rate = parse_link(launch.get("link") or "", trace=launch.get("trace")).up.rate
        if rate is not None:
            grid = [t_end * i / 400 for i in range(401)]
            ax_bw.plot(grid, [rate.rate_at(t) / 1e6 for t in grid], "k--", label="true uplink rate (emulator clock)")
    ax_bw.set_ylabel("Mbit/s")
    ax_bw.set_title(f"{d.name}: link {launch.get('link') or launch.get('trace') or 'unshaped loopback'}")
    ax_level.set_ylabel("uplink level (ladder index)")
    steps = [e for e in events if e.get("event") == "step" and e.get("rank") == 0]
    if steps:
        first = steps[0]["t"] - steps[0]["wall_s"]
        ax_sps.plot([e["t"] - first for e in steps], [e["samples_per_s"] for e in steps], label="samples/s (rank 0, cumulative)")
    ax_sps.set_ylabel("samples/s")
    ax_sps.set_xlabel("time (s)")
    for ax in (ax_bw, ax_level, ax_sps):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    timeline = d / "timeline.png"
    fig.savefig(timeline, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    evals = [e for e in events if e.get("event") == "eval"]
    ax.plot([e["wall_s"] for e in evals], [e["test_accuracy"] for e in evals], "o-")
    ax.set_xlabel("training time (s, rank 0)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{d.name}: accuracy vs time")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    accuracy = d / "accuracy.png"
    fig.savefig(accuracy, dpi=110)
    plt.close(fig)
    return [timeline, accuracy]
