"""Scenario results: the `results.json` schema, the per-policy figures and the markdown table.

Pure functions over plain values (events, decision-log records, a link spec): no processes, no
clock reads, so the arithmetic of `netsense bench scenario` is tested without training anything.

Clocks. Every time here is *training time*: rank 0's wall clock since its first step, minus the
pauses of rank 0's periodic evaluations (the other workers wait at the barrier meanwhile, so the
pauses would add the same cost to every policy and blur the comparison). Link time (which rate a
trace has at a step) is the launcher's monotonic clock minus the emulator's start.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from netsense.transport.emulation.linkspec import DuplexSpec, LinkSpec

RESULTS_FORMAT = "netsense-bench-scenario"
RESULTS_VERSION = 1

POLICY_FIELDS: dict[str, tuple[type, ...]] = {
    "samples_per_s": (int, float),
    "time_to_target_s": (int, float, type(None)),
    "final_accuracy": (int, float),
    "bytes_up": (int,),
    "bytes_down": (int,),
    "steps": (int,),
    "wall_s": (int, float),
    "mean_step_s": (int, float),
    "ideal_step_s": (int, float),
}
"""Required fields of every policy's figures and their JSON types (null only for time to target)."""

FIXED_PREFIXES = ("none", "fp16", "fixed:")
"""Policies that never adapt: "best fixed" is the fastest of these."""


# --- time --------------------------------------------------------------------------------------


def training_clock(
    step_walls: Mapping[int, float], evals: Sequence[Mapping[str, Any]], *, start_skew: float = 0.0
) -> dict[int, float]:
    """Training time at the end of each step of rank 0, eval pauses removed.

    `step_walls` maps step -> rank 0's ``wall_s`` in that step's event; `evals` are rank 0's eval
    events, each emitted after the step event of the same step (its ``wall_s`` minus the step's is
    the pause). `start_skew`: how long after rank 0 the last worker started (`start_skew`), which
    rank 0's first step spent waiting at the barrier: taken off, so the clock runs from the last
    worker's start, as DDP's ranks start theirs after a barrier (docs/BENCHMARKS.md, "Machine and
    method").
    """
    pauses = sorted(
        (int(e["step"]), max(0.0, float(e["wall_s"]) - step_walls[int(e["step"])]))
        for e in evals
        if int(e["step"]) in step_walls
    )
    clock: dict[int, float] = {}
    paused, i = 0.0, 0
    for step in sorted(step_walls):
        while i < len(pauses) and pauses[i][0] < step:
            paused += pauses[i][1]
            i += 1
        clock[step] = max(0.0, step_walls[step] - paused - start_skew)
    return clock


def start_skew(starts: Mapping[int, float]) -> float:
    """How long after rank 0 the last worker started (0 if none did): `starts` maps rank -> when
    its ``start`` event arrived, on one clock. A rank that starts before rank 0 waits on its own
    clock, not on rank 0's, so only later starts count."""
    if 0 not in starts:
        return 0.0
    return max(0.0, max(starts.values()) - starts[0])


def eval_curve(clock: Mapping[int, float], evals: Iterable[Mapping[str, Any]]) -> list[tuple[float, int, float]]:
    """(training s, step, test accuracy) of every eval whose step is on the clock, in step order."""
    points = [(clock[int(e["step"])], int(e["step"]), float(e["test_accuracy"])) for e in evals if int(e["step"]) in clock]
    return sorted(points, key=lambda p: p[1])


def first_at_target(curve: Sequence[tuple[float, int, float]], target: float) -> tuple[float, int, float] | None:
    """The first eval (time, step, accuracy) with accuracy >= `target`; None if none reached it."""
    return next((point for point in curve if point[2] >= target), None)


def time_to_target(curve: Sequence[tuple[float, int, float]], target: float) -> float | None:
    """Training time of the first eval with accuracy >= `target`; None if none reached it."""
    first = first_at_target(curve, target)
    return None if first is None else first[0]


def step_at_target(curve: Sequence[tuple[float, int, float]], target: float) -> int | None:
    """Step of the first eval with accuracy >= `target` (the one `time_to_target` times); None if
    none reached it. Time over step splits a policy's time to target into its step's speed and
    its progress per step (two policies at the same levels cross at about the same step)."""
    first = first_at_target(curve, target)
    return None if first is None else int(first[1])


# --- the link's true rate ------------------------------------------------------------------------


def rate_Bps(link: LinkSpec, t: float) -> float | None:
    """The configured rate of one direction at link time `t`, in bytes/s; None when unlimited."""
    if link.rate is None:
        return None
    return link.rate.rate_at(max(0.0, t)) / 8.0


def transfer_s(spec: DuplexSpec | None, t: float, up_bytes: float, down_bytes: float) -> float:
    """Least seconds the link needs for one step's bytes at link time `t`.

    The directions are independent (full duplex), and a worker that has its update may push its
    next gradient while another still pulls, so the bound is the busier direction, not the sum.
    """
    if spec is None:
        return 0.0
    worst = 0.0
    for link, n in ((spec.up, up_bytes), (spec.down, down_bytes)):
        rate = rate_Bps(link, t)
        if rate is not None and n > 0:
            worst = max(worst, n / rate if rate > 0 else math.inf)
    return worst


# --- per-step records ----------------------------------------------------------------------------


def step_compute(
    steps: Mapping[int, Mapping[int, Mapping[str, Any]]],
    decisions: Mapping[int, Sequence[Mapping[str, Any]]],
    evals: Iterable[Mapping[str, Any]] = (),
) -> dict[int, float | None]:
    """Per step every rank finished, the slowest rank's compute time (None where no rank's is known).

    A rank's compute is its step event's ``compute_s`` (the time from the end of its last step to
    the start of this one: data, forward, backward), or, for events without one, its decision
    log's ``compute_s``. The latter is the policy's Tc, which since 2026-12-02 also holds the wait
    for the update (docs/POLICIES.md), so it is no compute time for an ideal step. Rank 0's step
    after an eval is left out: the eval's pause is in it, and the training clock removes it.
    """
    ranks = sorted(steps)
    if not ranks:
        return {}
    common = sorted(set.intersection(*(set(steps[r]) for r in ranks)))
    logged = {r: {int(d["step"]) + 1: d.get("compute_s") for d in decisions.get(r, ())} for r in ranks}
    paused = {int(e["step"]) + 1 for e in evals}
    out: dict[int, float | None] = {}
    for step in common:
        known = []
        for r in ranks:
            if r == ranks[0] and step in paused:
                continue
            event = steps[r][step]
            c = event["compute_s"] if "compute_s" in event else logged[r].get(step)
            if c:
                known.append(float(c))
        out[step] = max(known) if known else None
    return out


def step_records(
    steps: Mapping[int, Mapping[int, Mapping[str, Any]]],
    decisions: Mapping[int, Sequence[Mapping[str, Any]]],
    *,
    link_t0: float | None,
    evals: Iterable[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """One record per step that every rank finished: bytes of all workers, compute (`step_compute`),
    link time.

    `steps[rank][step]` is that rank's step event plus ``mono`` (launcher's monotonic receipt
    time); its ``bytes_up``/``bytes_down`` are cumulative. `decisions[rank]` are the rank's uplink
    decision-log records. The link time is the midpoint of rank 0's step.
    """
    ranks = sorted(steps)
    if not ranks:
        return []
    compute = step_compute(steps, decisions, evals)
    records: list[dict[str, Any]] = []
    prev: dict[int, Mapping[str, Any] | None] = {r: None for r in ranks}
    for step in compute:
        up = down = 0
        for r in ranks:
            cur, before = steps[r][step], prev[r]
            up += int(cur["bytes_up"]) - (int(before["bytes_up"]) if before else 0)
            down += int(cur["bytes_down"]) - (int(before["bytes_down"]) if before else 0)
        e0, p0 = steps[ranks[0]][step], prev[ranks[0]]
        mono = float(e0["mono"]) if "mono" in e0 else None
        start = float(p0["mono"]) if p0 is not None and "mono" in p0 else mono
        t_link = None if mono is None or link_t0 is None or start is None else (mono + start) / 2 - link_t0
        records.append({"step": step, "bytes_up": up, "bytes_down": down, "compute_s": compute[step], "t_link": t_link})
        for r in ranks:
            prev[r] = steps[r][step]
    return records


def ideal_step_s(records: Sequence[Mapping[str, Any]], spec: DuplexSpec | None) -> float:
    """Mean over steps of max(compute, bytes / link rate): the step time of perfect overlap, a lower bound.

    A step whose compute time is unknown (a worker's first step) takes the run's median compute.
    """
    if not records:
        return 0.0
    known = [float(r["compute_s"]) for r in records if r.get("compute_s")]
    fallback = statistics.median(known) if known else 0.0
    total = 0.0
    for r in records:
        tc = float(r["compute_s"]) if r.get("compute_s") else fallback
        t = r.get("t_link") or 0.0
        total += max(tc, transfer_s(spec, t, r["bytes_up"], r["bytes_down"]))
    return total / len(records)


def timeline(
    decisions: Sequence[Mapping[str, Any]], *, link_t0: float | None, spec: DuplexSpec | None
) -> dict[str, list[Any]]:
    """Rank 0's uplink decisions as columns: link time, step, level, spec, estimate, true rate (bit/s)."""
    cols: dict[str, list[Any]] = {k: [] for k in ("t_s", "step", "level", "spec", "bw_est_bps", "true_bps")}
    for d in decisions:
        t = float(d["t"]) - link_t0 if link_t0 is not None and d.get("t") is not None else None
        est = d.get("bw_used_Bps") or d.get("bw_Bps")
        true = rate_Bps(spec.up, t or 0.0) if spec is not None else None
        cols["t_s"].append(t)
        cols["step"].append(int(d["step"]) + 1)
        cols["level"].append(d.get("level"))
        cols["spec"].append(d.get("spec"))
        cols["bw_est_bps"].append(None if est is None else float(est) * 8)
        cols["true_bps"].append(None if true is None else true * 8)
    return cols


def policy_figures(
    *,
    steps: Mapping[int, Mapping[int, Mapping[str, Any]]],
    evals: Sequence[Mapping[str, Any]],
    decisions: Mapping[int, Sequence[Mapping[str, Any]]],
    link_t0: float | None,
    spec: DuplexSpec | None,
    target: float,
    global_batch: int,
    starts: Mapping[int, float] | None = None,
) -> dict[str, Any]:
    """The figures of one policy's run from its events and decision logs (see `POLICY_FIELDS`);
    `starts`: rank -> when its ``start`` event arrived (`start_skew`; none: no skew, as after
    DDP's barrier)."""
    if 0 not in steps or not steps[0]:
        raise ValueError("rank 0 finished no step: nothing to report")
    skew = start_skew(starts or {})
    clock = training_clock({s: float(e["wall_s"]) for s, e in steps[0].items()}, evals, start_skew=skew)
    curve = eval_curve(clock, evals)
    records = step_records(steps, decisions, link_t0=link_t0, evals=evals)
    n = len(records)
    last = records[-1]["step"] if records else 0
    wall = clock[last] if records else 0.0
    ranks = sorted(steps)
    return {
        "samples_per_s": n * global_batch / wall if wall > 0 else 0.0,
        "time_to_target_s": time_to_target(curve, target),
        "step_at_target": step_at_target(curve, target),
        "final_accuracy": curve[-1][2] if curve else 0.0,
        "bytes_up": sum(int(steps[r][last]["bytes_up"]) for r in ranks) if records else 0,
        "bytes_down": sum(int(steps[r][last]["bytes_down"]) for r in ranks) if records else 0,
        "steps": n,
        "wall_s": wall,
        "mean_step_s": wall / n if n else 0.0,
        "ideal_step_s": ideal_step_s(records, spec),
        "start_skew_s": skew,
        "evals": [[t, s, a] for t, s, a in curve],
        "timeline": timeline(decisions.get(0, ()), link_t0=link_t0, spec=spec),
    }


# --- schema and consistency ----------------------------------------------------------------------


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def validate_results(data: Any) -> list[str]:
    """Every way `data` breaks the results.json schema or is inconsistent; empty when it is valid.

    Consistency: finite numbers, bytes > 0, samples/s > 0, steps > 0, accuracy in [0, 1],
    time to target <= wall time.
    """
    problems: list[str] = []
    if not isinstance(data, dict):
        return [f"results must be an object, got {type(data).__name__}"]
    if not isinstance(data.get("scenario"), dict):
        problems.append("'scenario' must be an object")
    target = data.get("target_accuracy")
    if not _finite(target) or not 0 <= target <= 1:
        problems.append(f"'target_accuracy' must be a number in [0, 1], got {target!r}")
    policies = data.get("policies")
    if not isinstance(policies, dict) or not policies:
        return [*problems, "'policies' must be a non-empty object"]
    for name, figs in policies.items():
        where = f"policies[{name!r}]"
        if not isinstance(figs, dict):
            problems.append(f"{where} must be an object")
            continue
        for key, types in POLICY_FIELDS.items():
            if key not in figs:
                problems.append(f"{where} lacks {key!r}")
            elif isinstance(figs[key], bool) or not isinstance(figs[key], types):
                problems.append(f"{where}.{key} has type {type(figs[key]).__name__}")
            elif figs[key] is not None and not _finite(figs[key]):
                problems.append(f"{where}.{key} is not finite: {figs[key]!r}")
        if any(p.startswith(where) for p in problems):
            continue
        for key in ("samples_per_s", "bytes_up", "bytes_down", "steps", "wall_s", "mean_step_s", "ideal_step_s"):
            if figs[key] <= 0:
                problems.append(f"{where}.{key} must be > 0, got {figs[key]}")
        if not 0 <= figs["final_accuracy"] <= 1:
            problems.append(f"{where}.final_accuracy must be in [0, 1], got {figs['final_accuracy']}")
        ttt = figs["time_to_target_s"]
        if ttt is not None and not 0 <= ttt <= figs["wall_s"] + 1e-9:
            problems.append(f"{where}.time_to_target_s {ttt} is outside [0, wall_s={figs['wall_s']}]")
    return problems


# --- comparisons and the table -------------------------------------------------------------------


def path_of(policy: str) -> str:
    """``"netns:"`` for runs across the namespaces' tbf (``netns:*`` and the ``ddp:*`` peers), else ``""``."""
    return "netns:" if policy.startswith(("netns:", "ddp:")) else ""


def is_fixed(policy: str) -> bool:
    name = policy.removeprefix("netns:")
    return name == "none" or name == "fp16" or name.startswith("fixed:")


def best_fixed(policies: Mapping[str, Mapping[str, Any]], path: str = "") -> str | None:
    """The fixed NetSense policy on `path` with the shortest time to target (None if none reached it)."""
    reached = [
        (f["time_to_target_s"], p)
        for p, f in policies.items()
        if is_fixed(p) and path_of(p) == path and f["time_to_target_s"] is not None
    ]
    return min(reached)[1] if reached else None


def baseline_for(policies: Mapping[str, Any], policy: str, base: str) -> str | None:
    """`base` ("none", "fp16") on the same path as `policy`: ``netns:none`` for the netns and ddp rows."""
    name = path_of(policy) + base
    return name if name in policies else None


def speedup(policies: Mapping[str, Mapping[str, Any]], policy: str, baseline: str | None) -> float | None:
    """baseline's time to target / policy's (> 1: `policy` is faster); None if either is missing."""
    if baseline is None or baseline not in policies:
        return None
    a, b = policies[policy]["time_to_target_s"], policies[baseline]["time_to_target_s"]
    if a is None or b is None or a <= 0:
        return None
    return b / a


def _fmt(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "—" if x is None else f"{x:{spec}}{suffix}"


def markdown_table(results: Mapping[str, Any]) -> str:
    """One row per policy: throughput, time to target and speed-ups, accuracy, bytes, step vs ideal."""
    policies = results["policies"]
    head = (
        "| policy | samples/s | time to target s | x none | x fp16 | x best fixed | final acc | MB up | MB down "
        "| steps | mean step s | ideal step s | mean/ideal |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, f in policies.items():
        ratio = f["mean_step_s"] / f["ideal_step_s"] if f["ideal_step_s"] > 0 else None
        best = best_fixed(policies, path_of(name))
        x_none = speedup(policies, name, baseline_for(policies, name, "none"))
        x_fp16 = speedup(policies, name, baseline_for(policies, name, "fp16"))
        lines.append(
            f"| `{name}` | {f['samples_per_s']:.0f} | {_fmt(f['time_to_target_s'], '.1f')} "
            f"| {_fmt(x_none, '.2f', 'x')} | {_fmt(x_fp16, '.2f', 'x')} "
            f"| {_fmt(speedup(policies, name, best), '.2f', 'x')} | {f['final_accuracy']:.4f} "
            f"| {f['bytes_up'] / 1e6:.1f} | {f['bytes_down'] / 1e6:.1f} | {f['steps']} "
            f"| {f['mean_step_s']:.3f} | {f['ideal_step_s']:.3f} | {_fmt(ratio, '.2f')} |"
        )
    target = results["target_accuracy"]
    lines.append("")
    bests = {path: best_fixed(policies, path) for path in sorted({path_of(p) for p in policies})}
    where = "; ".join(f"{'across netns tbf' if path else 'best fixed policy'}: {b or 'none reached the target'}"
                      for path, b in bests.items())  # fmt: skip
    lines.append(f"Target accuracy {target}; {where}. Rows netns:* and ddp:* are compared with netns:* baselines.")
    for name, reason in results.get("failed", {}).items():
        lines.append(f"\n`{name}` failed: {reason}")
    return "\n".join(lines)
