"""The policy matrix's arithmetic and its table: pure functions over the matrix's results.json.

Kept apart from the runner (`netsense.bench.matrix`) so that medians, spreads and ratios are
tested on fabricated cells without training anything.

Conventions. A seed that did not reach the target counts as an infinite time: the median of a
cell is then finite only when most seeds reached it, and a ratio against a policy that never got
there reads "faster". A *failed* seed (the run crashed or hung) is no time at all: it is left out
of the median and named under the table. Ratios are **time ratios**, netsense's median time to
target over the other policy's: < 1 is faster, and issue #14's targets read <= 1.1 against the
best fixed policy and <= 1 against dc2, netsenseml-paper, accordion and gravac.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ADAPTIVE = "netsense"
PEERS = ("dc2", "netsenseml-paper", "accordion", "gravac")
"""The adaptive schemes netsense is compared with, each in its own ratio column."""


def is_fixed(policy: str) -> bool:
    """A policy that never adapts: "best fixed" is the fastest of these (as in `bench scenario`)."""
    return policy in ("none", "fp16") or policy.startswith("fixed:")


def cell_key(model: str, link: str, policy: str, seed: int) -> str:
    """The results.json key of one run; '|' appears in no model, link or policy name."""
    return f"{model}|{link}|{policy}|{seed}"


@dataclass(frozen=True)
class CellSummary:
    """One (scenario, policy) over its seeds."""

    runs: int
    """Seeds with figures."""
    failed: int
    """Seeds whose run crashed or hung."""
    reached: int
    """Seeds that reached the target."""
    median_s: float
    """Median time to target over `runs` (inf: most did not reach it; nan: no runs)."""
    min_s: float
    max_s: float
    final_accuracy: float | None
    """Median final accuracy over `runs`."""
    median_step: float | None = None
    """Median step of the first eval at the target over the seeds that reached it (None: none
    did, or their records predate the figure)."""


def summarize(records: Sequence[Mapping[str, Any]]) -> CellSummary:
    """Median, spread and accuracy of one cell's seed records (``status``, ``figures``)."""
    ok = [r["figures"] for r in records if r.get("status") == "ok" and r.get("figures")]
    times = [math.inf if f.get("time_to_target_s") is None else float(f["time_to_target_s"]) for f in ok]
    accs = [float(f["final_accuracy"]) for f in ok if f.get("final_accuracy") is not None]
    steps = [int(f["step_at_target"]) for f in ok if f.get("step_at_target") is not None]
    nan = math.nan
    return CellSummary(
        runs=len(ok),
        failed=len(records) - len(ok),
        reached=sum(math.isfinite(t) for t in times),
        median_s=_median(times) if times else nan,
        min_s=min(times) if times else nan,
        max_s=max(times) if times else nan,
        final_accuracy=statistics.median(accs) if accs else None,
        median_step=statistics.median(steps) if steps else None,
    )


def _median(xs: Sequence[float]) -> float:
    """The median, with inf allowed (an even count straddling inf is inf: "not reached")."""
    s = sorted(xs)
    n = len(s)
    mid = s[n // 2]
    if n % 2:
        return mid
    lo = s[n // 2 - 1]
    return math.inf if math.isinf(mid) else (lo + mid) / 2


def time_ratio(a: float, b: float) -> float | None:
    """a / b for median times: 0 when only `a` reached the target, inf when only `b` did, None
    when neither did or either has no runs."""
    if math.isnan(a) or math.isnan(b):
        return None
    if math.isinf(a) and math.isinf(b):
        return None
    if math.isinf(b):
        return 0.0
    if math.isinf(a):
        return math.inf
    return a / b if b > 0 else None


def best_fixed(summaries: Mapping[str, CellSummary]) -> str | None:
    """The fixed policy with the least finite median time to target (ties: the first listed)."""
    reached = [(s.median_s, i, p) for i, (p, s) in enumerate(summaries.items()) if is_fixed(p) and math.isfinite(s.median_s)]
    return min(reached)[2] if reached else None


def row_summaries(results: Mapping[str, Any], model: str, link: str) -> dict[str, CellSummary]:
    """Policy -> summary of one scenario row, in the matrix's policy order (policies with no record left out)."""
    cells = results.get("cells", {})
    out: dict[str, CellSummary] = {}
    for policy in results.get("policies", []):
        records = [r for r in cells.values() if (r["model"], r["link"], r["policy"]) == (model, link, policy)]
        if records:
            out[policy] = summarize(records)
    return out


def row_ratios(summaries: Mapping[str, CellSummary]) -> dict[str, Any]:
    """netsense's time ratio to the row's best fixed policy and to each adaptive peer present."""
    best = best_fixed(summaries)
    ours = summaries.get(ADAPTIVE)
    out: dict[str, Any] = {"best_fixed": best, "vs_best_fixed": None}
    if ours is not None and best is not None:
        out["vs_best_fixed"] = time_ratio(ours.median_s, summaries[best].median_s)
    for peer in PEERS:
        if peer in summaries and ours is not None:
            out[f"vs_{peer}"] = time_ratio(ours.median_s, summaries[peer].median_s)
    return out


def _t(x: float) -> str:
    return "n/r" if math.isinf(x) else f"{x:.1f}"


def format_cell(s: CellSummary) -> str:
    """``median (min-max) @ step / final acc``; n/r = not reached; failed seeds counted at the end."""
    if s.runs == 0:
        return f"failed ({s.failed})" if s.failed else ""
    text = _t(s.median_s)
    if s.runs > 1:
        text += f" ({_t(s.min_s)}-{_t(s.max_s)})"
    if s.median_step is not None:
        text += f" @ {s.median_step:g}"
    if s.final_accuracy is not None:
        text += f" / {s.final_accuracy:.3f}"
    if s.failed:
        text += f" [{s.failed} failed]"
    return text


def format_ratio(r: float | None, other: str = "") -> str:
    if r is None:
        return "—"
    if r == 0.0:
        return f"faster ({other or 'other'} n/r)"
    if math.isinf(r):
        return "n/r"
    return f"**{r:.2f}**" if r <= 1.0 else f"{r:.2f}"


def markdown_matrix(results: Mapping[str, Any]) -> str:
    """One row per scenario (model x link), one column per policy, then netsense's time ratios."""
    policies = list(results.get("policies", []))
    peers = [p for p in PEERS if p in policies]
    cols = [f"`{p}`" for p in policies] + ["best fixed", "netsense / best fixed"] + [f"netsense / {p}" for p in peers]
    head = "| model | link | " + " | ".join(cols) + " |"
    lines = [head, "|" + "---|" * (len(cols) + 2)]
    for model in results.get("models", []):
        for link in results.get("links", {}):
            summaries = row_summaries(results, model, link)
            if not summaries:
                continue
            ratios = row_ratios(summaries)
            best = ratios["best_fixed"]
            row = [format_cell(summaries[p]) if p in summaries else "" for p in policies]
            row += [f"`{best}`" if best else "none reached", format_ratio(ratios["vs_best_fixed"], best or "")]
            row += [format_ratio(ratios.get(f"vs_{p}"), p) for p in peers]
            lines.append(f"| {model} | {link} | " + " | ".join(row) + " |")
    seeds = results.get("seeds", [])
    targets = ", ".join(f"{m} {t}" for m, t in results.get("targets", {}).items())
    lines += [
        "",
        f"Each policy cell: median time to target in s (min-max over {len(seeds)} seed(s) {seeds}) @ the median "
        "step it was read at (over the seeds that reached it) / median final accuracy; n/r = target not reached. "
        "Ratios: netsense's median time / the other's (< 1: netsense faster, "
        f"in bold when <= 1); best fixed = the fastest of none, fp16, fixed:*. Targets: {targets}.",
    ]
    calibrated = results.get("calibration") or {}
    if calibrated:
        took = ", ".join(f"{m} {c['seconds']} s" for m, c in calibrated.items())
        lines.append(f"\nnetsense ran with calibrated q (`netsense calibrate`, once per model: {took}; not in its times).")
    failed = [(k, r.get("reason", "")) for k, r in results.get("cells", {}).items() if r.get("status") != "ok"]
    for key, reason in failed:
        lines.append(f"\nFailed `{key.replace('|', ' x ')}`: {reason}")
    return "\n".join(lines)
