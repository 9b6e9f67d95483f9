"""Figures of a scenario's results.json (matplotlib, Agg backend: no display needed).

`plot_results(results, out_dir)` writes, and returns the paths of:

- ``accuracy.png``: test accuracy vs training time per policy, with the target line;
- ``timeline.png``: per policy the bandwidth estimate the policy used vs the link's true uplink
  rate (top) and the uplink level (bottom), against link time;
- ``throughput.png``: samples/s per policy, and mean step time next to the ideal
  max(compute, bytes / rate) step time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

FIGURES = ("accuracy.png", "timeline.png", "throughput.png")


def _title(results: dict[str, Any]) -> str:
    s = results.get("scenario", {})
    link = s.get("trace") or s.get("link") or "unshaped loopback"
    return f"{s.get('model', '?')}, {s.get('workers', '?')} workers, {link}"


def plot_accuracy(results: dict[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, f in results["policies"].items():
        curve = f.get("evals") or []
        if curve:
            ax.plot([p[0] for p in curve], [p[2] for p in curve], marker=".", label=name)
    ax.axhline(results["target_accuracy"], color="grey", linestyle=":", label=f"target {results['target_accuracy']}")
    ax.set_xlabel("training time (s, eval pauses excluded)")
    ax.set_ylabel("test accuracy")
    ax.set_title(_title(results), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _legend(ax: Any) -> None:
    if ax.get_legend_handles_labels()[0]:  # an unshaped run has no true-rate line, a fixed run no estimate
        ax.legend(fontsize=7)


def _true_rate(results: dict[str, Any], t_max: float) -> tuple[list[float], list[float]] | None:
    """The configured uplink rate (Mbit/s) over [0, t_max] from the scenario's link or trace."""
    from netsense.transport.emulation.linkspec import parse_link

    s = results.get("scenario", {})
    if not (s.get("link") or s.get("trace")) or t_max <= 0:
        return None
    try:
        spec = parse_link(s.get("link") or "", trace=s.get("trace"))
    except Exception:  # noqa: BLE001  (a trace file moved since the run: the figure goes without the line)
        return None
    if spec.up.rate is None:
        return None
    ts = [t_max * i / 400 for i in range(401)]
    return ts, [spec.up.rate.rate_at(t) / 1e6 for t in ts]


def plot_timeline(results: dict[str, Any], path: Path) -> None:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    by_step = False
    t_max = 0.0
    for name, f in results["policies"].items():
        tl = f.get("timeline") or {}
        t = tl.get("t_s") or []
        if not t or any(x is None for x in t):
            t = tl.get("step") or []  # no link clock (unshaped run): fall back to steps
            by_step = True
        est = tl.get("bw_est_bps") or []
        pts = [(x, y / 1e6) for x, y in zip(t, est) if y is not None]
        if pts:
            top.plot([p[0] for p in pts], [p[1] for p in pts], label=f"{name} estimate", linewidth=1)
        if not by_step:
            t_max = max([t_max, *(x for x in t if x is not None)])
        levels = [(x, lv) for x, lv in zip(t, tl.get("level") or []) if lv is not None]
        if levels:
            bottom.step([p[0] for p in levels], [p[1] for p in levels], where="post", label=name, linewidth=1)
    true = _true_rate(results, t_max) if not by_step else None
    if true:
        top.step(true[0], true[1], where="post", color="black", linestyle="--", linewidth=1.5, label="true uplink rate")
    top.set_ylabel("Mbit/s")
    top.set_yscale("log")
    top.set_title(_title(results), fontsize=10)
    top.grid(alpha=0.3)
    _legend(top)
    bottom.set_ylabel("uplink level (ladder index)")
    bottom.set_xlabel("step" if by_step else "link time (s)")
    bottom.grid(alpha=0.3)
    _legend(bottom)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_throughput(results: dict[str, Any], path: Path) -> None:
    names = list(results["policies"])
    figs = [results["policies"][n] for n in names]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.bar(names, [f["samples_per_s"] for f in figs], color="tab:blue")
    left.set_ylabel("samples/s")
    left.set_title("throughput", fontsize=10)
    x = range(len(names))
    right.bar([i - 0.2 for i in x], [f["mean_step_s"] for f in figs], width=0.4, label="mean step")
    right.bar([i + 0.2 for i in x], [f["ideal_step_s"] for f in figs], width=0.4, label="ideal max(Tc, bytes/rate)")
    right.set_xticks(list(x), names)
    right.set_ylabel("s per step")
    right.set_title("step time vs ideal", fontsize=10)
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(_title(results), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_results(results: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write every figure into `out_dir`; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in FIGURES]
    plot_accuracy(results, paths[0])
    plot_timeline(results, paths[1])
    plot_throughput(results, paths[2])
    return paths
