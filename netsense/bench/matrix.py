"""`netsense bench matrix`: `bench scenario` over models x links x policies x seeds, one table.

Each run (one model, link, policy and seed) is its own `netsense bench scenario` subprocess in its
own process group, so a run that crashes, hangs or leaks a child costs that run only: it is
recorded as failed with its reason and the matrix goes on. `--max-time` is the scenario's guard
for every run; a run still alive at 1.5 x --max-time + 180 s (process start-up and evaluations
included) is killed as hung.

Outputs in ``--out DIR``: results.json (rewritten after every run, so an interrupt keeps what
finished; ``--resume`` skips those runs), matrix.md (the table, `matrix_results.markdown_matrix`)
and runs/<model>/<link>/<policy>/seed<N>/ with each scenario's own outputs and log.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netsense.bench.matrix_results import cell_key, markdown_matrix
from netsense.errors import ConfigError
from netsense.launch import PYTHON

FORMAT, VERSION = "netsense-bench-matrix", 1
DEFAULT_MODELS = "digits-cnn,charlm,wide-mlp"
DEFAULT_LINKS = "20mbit,100mbit,unshaped,steps,trace"
DEFAULT_POLICIES = (
    "none,fp16,fixed:qsgd:4,fixed:qsgd:8,fixed:powersgd:2,fixed:topk:0.01+fp16,dc2,netsenseml-paper,accordion,gravac,"
    "netsense"
)
CELLULAR_TRACE = Path(__file__).resolve().parents[2] / "examples" / "traces" / "cellular.mahimahi"
STEP_LINK = "rate=0s:50mbit,4s:10mbit,8s:100mbit,12s:25mbit,16s:loop,delay=10ms"
"""The looping step trace: four 4 s phases, a cycle every run sees in full; mean 46.25 Mbit/s."""
LINKS: dict[str, tuple[str | None, str | None]] = {
    "20mbit": ("rate=20mbit,delay=10ms", None),
    "100mbit": ("rate=100mbit,delay=10ms", None),
    "unshaped": (None, None),
    "steps": (STEP_LINK, None),
    "trace": ("delay=20ms", str(CELLULAR_TRACE)),
}
"""Link name -> (`bench scenario --link`, `--trace`); ``trace:FILE`` adds any trace file (delay 20 ms)."""

EPILOG = "Links:\n" + "".join(
    f"  {k:<9} {v[0] or 'unshaped loopback (no emulator)'}{' + --trace ' + Path(v[1]).name if v[1] else ''}\n"
    for k, v in LINKS.items()
) + f"""\
  trace:FILE a CSV or Mahimahi trace file of your own, with delay=20ms
Seeds are 0..N-1. Every run is one `bench scenario` subprocess; a failed or hung run is recorded
with its reason and the rest go on.
Examples:
  netsense bench matrix --out runs/matrix                      # the full default matrix (hours)
  netsense bench matrix --models digits-cnn,wide-mlp --links 20mbit,trace \\
      --policies fp16,fixed:qsgd:4,fixed:powersgd:2,dc2,netsense --seeds 1 --max-time 120 --out runs/m
  netsense bench matrix ... --out runs/m --resume              # continue after an interrupt"""


def register(kinds: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `matrix` bench kind."""
    p = kinds.add_parser(
        "matrix",
        help="bench scenario over models x links x policies x seeds: one table of time to target",
        description="Run `netsense bench scenario` once per model, link, policy and seed, then write results.json "
        "and one markdown table (median and min-max time to target per policy, final accuracy, netsense / best "
        "fixed and netsense / each adaptive peer) into --out.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated models (default {DEFAULT_MODELS})")
    p.add_argument("--links", default=DEFAULT_LINKS, help=f"comma-separated links (default {DEFAULT_LINKS})")
    p.add_argument("--policies", default=DEFAULT_POLICIES, help="comma-separated policies (default: the eleven of issue #14)")
    p.add_argument("--seeds", type=int, default=2, help="seeds per cell, 0..N-1 (default 2)")
    p.add_argument("--max-time", type=float, default=300.0, help="each run's --max-time, seconds (default 300)")
    p.add_argument("--targets", help="target accuracy: one number for every model, or MODEL=ACC,... "
                   "(default per model, as bench scenario)")  # fmt: skip
    p.add_argument("--steps", type=int, help="synchronous steps per run (default: the task's)")
    p.add_argument("--batch-size", type=int, help="samples per worker per step (default: the task's)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--eval-every", type=int, default=10, help="rank 0 evaluates every N steps (default 10)")
    p.add_argument("--insecure", action="store_true", help="no TLS verification / worker auth")
    p.add_argument("--downlink", choices=["same", "none", "gradient"], default="gradient",
                   help="each run's bench scenario --downlink: the gradient domain (default), the policy's, or fp32")  # fmt: skip
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--resume", action="store_true", help="keep the runs already in DIR/results.json, run the rest")
    p.add_argument("--calibrate", action="store_true",
                   help="run `netsense calibrate` once per model first (DIR/tables/) and give netsense its table "
                   "(docs/POLICIES.md, \"Calibrated q\"); the seconds it took are recorded, not added to the times")  # fmt: skip
    p.set_defaults(func=run)


@dataclass(frozen=True)
class Cell:
    model: str
    link: str
    policy: str
    seed: int

    @property
    def key(self) -> str:
        return cell_key(self.model, self.link, self.policy, self.seed)

    def describe(self) -> str:
        return f"{self.model} x {self.link} x {self.policy} seed {self.seed}"


def _names(flag: str, text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"{flag} {text!r} names nothing")
    if len(set(names)) != len(names):
        raise ConfigError(f"{flag} {text!r} repeats a name")
    if any("|" in n for n in names):
        raise ConfigError(f"{flag} {text!r}: '|' is not allowed in a name")
    return names


def parse_links(text: str) -> dict[str, dict[str, str | None]]:
    """Link name -> {"link", "trace"}, each checked by parsing it (a bad trace file fails here)."""
    from netsense.transport.emulation.linkspec import parse_link

    out: dict[str, dict[str, str | None]] = {}
    for name in _names("--links", text):
        if name.startswith("trace:"):
            spec, trace = "delay=20ms", name.removeprefix("trace:")
        elif name in LINKS:
            spec, trace = LINKS[name]
        else:
            raise ConfigError(f"--links: unknown link {name!r}; use {', '.join(LINKS)} or trace:FILE")
        try:
            if spec or trace:
                parse_link(spec or "", trace=trace)
        except ConfigError as exc:
            raise ConfigError(f"--links {name}: {exc}") from None
        out[name] = {"link": spec, "trace": trace}
    return out


def parse_matrix_policies(text: str) -> list[str]:
    from netsense.bench.scenario import parse_policies

    names = parse_policies(text)
    bad = [p for p in names if p.startswith(("ddp:", "netns:"))]
    if bad:
        raise ConfigError(f"--policies: {', '.join(bad)} need network namespaces; run them with bench scenario")
    return names


def parse_targets(text: str | None, models: list[str]) -> dict[str, float]:
    """Model -> target accuracy from ``0.8`` or ``m=0.8,n=0.5`` over the scenario's defaults."""
    from netsense.bench.scenario import DEFAULT_TARGETS

    given: dict[str, float] = {}
    if text is not None and "=" not in text:
        given = dict.fromkeys(models, _accuracy(text))
    elif text is not None:
        for item in _names("--targets", text):
            model, sep, value = item.partition("=")
            if not sep or model.strip() not in models:
                raise ConfigError(f"--targets: {item!r} must be MODEL=ACC with MODEL one of --models")
            given[model.strip()] = _accuracy(value)
    targets = {m: given.get(m, DEFAULT_TARGETS.get(m)) for m in models}
    missing = [m for m, t in targets.items() if t is None]
    if missing:
        raise ConfigError(f"--targets: no default target for {', '.join(missing)}; give --targets {missing[0]}=ACC")
    return {m: float(t) for m, t in targets.items() if t is not None}


def _accuracy(value: str) -> float:
    try:
        acc = float(value)
    except ValueError:
        raise ConfigError(f"--targets: {value!r} is not a number") from None
    if not 0 < acc <= 1:
        raise ConfigError(f"--targets: an accuracy must be in (0, 1], got {value}")
    return acc


def _check_models(models: list[str]) -> None:
    from netsense.models import load_task, model_names

    for model in models:
        if model not in model_names():
            load_task(model)  # an unknown name or a factory that does not import: its one-line error


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """What every run shares and its figures depend on: a resume must use the same."""
    return {"workers": args.workers, "steps": args.steps, "batch_size": args.batch_size,
            "eval_every": args.eval_every, "max_time_s": args.max_time, "calibrate": bool(args.calibrate),
            "downlink": args.downlink}  # fmt: skip


def check_resumable(old: dict[str, Any], new: dict[str, Any]) -> None:
    """One-line ConfigError when `old` (results.json) and `new` disagree on a shared setting."""
    if not isinstance(old, dict) or old.get("format") != FORMAT or not isinstance(old.get("cells"), dict):
        raise ConfigError(f"--resume: results.json is not a {FORMAT} file")
    for key, value in new["settings"].items():
        before = {"calibrate": False, "downlink": "same"}.get(key)  # what a results.json from before the flag ran with
        if old.get("settings", {}).get(key, before) != value:
            raise ConfigError(f"--resume: results.json ran with {key}={old['settings'].get(key)}, now {value}; "
                              "use the same flags or another --out")  # fmt: skip
    for table in ("links", "targets"):
        for name, value in new[table].items():
            if name in old.get(table, {}) and old[table][name] != value:
                raise ConfigError(f"--resume: {table[:-1]} {name} was {old[table][name]}, now {value}; use another --out")


def merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`old` with `new`'s models, links, policies, seeds and targets added after its own."""
    out = dict(old)
    for key in ("models", "policies", "seeds"):
        out[key] = list(old[key]) + [x for x in new[key] if x not in old[key]]
    for key in ("links", "targets"):
        out[key] = {**old[key], **new[key]}
    out["runs"] = list(old.get("runs", []))
    return out


def plan_cells(results: dict[str, Any], models: list[str], links: Iterable[str], policies: list[str],
               seeds: list[int], resume: bool) -> tuple[list[Cell], int]:  # fmt: skip
    """The runs to do in order (seed-major, so one seed of every cell comes first) and how many
    are skipped: under --resume a run whose record is ok; a failed one runs again."""
    cells = [Cell(m, link, p, s) for s in seeds for m in models for link in links for p in policies]
    done = {k for k, r in results["cells"].items() if r.get("status") == "ok"} if resume else set()
    todo = [c for c in cells if c.key not in done]
    return todo, len(cells) - len(todo)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", text)


def scenario_argv(cell: Cell, results: dict[str, Any], out: Path, insecure: bool) -> list[str]:
    """The `netsense bench scenario` arguments of one run."""
    link = results["links"][cell.link]
    s = results["settings"]
    argv = ["bench", "scenario", "--model", cell.model, "--policies", cell.policy, "--seed", str(cell.seed),
            "--max-time", str(s["max_time_s"]), "--target-accuracy", str(results["targets"][cell.model]),
            "--workers", str(s["workers"]), "--eval-every", str(s["eval_every"]), "--out", str(out)]  # fmt: skip
    table = results.get("calibration", {}).get(cell.model, {}).get("table")
    if cell.policy.removeprefix("netns:") != "netsense":
        table = None
    for flag, value in (("--link", link["link"]), ("--trace", link["trace"]), ("--steps", s["steps"]),
                        ("--batch-size", s["batch_size"]), ("--progress-table", table),
                        ("--downlink", s.get("downlink", "same"))):  # fmt: skip
        if value is not None:
            argv += [flag, str(value)]
    return argv + (["--insecure"] if insecure else [])


Calibrator = Callable[[list[str], Path], None]


def run_calibrate(argv: list[str], log: Path) -> None:
    """`netsense calibrate` as a subprocess (its progress lines in `log`); `ConfigError` if it fails."""
    with log.open("w") as f:
        proc = subprocess.run([*SCENARIO_CMD, *argv], stdout=f, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        raise ConfigError(f"--calibrate: `netsense {' '.join(argv)}` failed (exit {proc.returncode}): {_last_error(log)}")


def calibrate_models(results: dict[str, Any], models: list[str], out: Path, calibrator: Calibrator = run_calibrate) -> None:
    """One progress table per model not yet calibrated (DIR/tables/<model>.json), recorded in
    `results` with the seconds it took, before any run: every netsense run of the model reads it."""
    s = results["settings"]
    tables = out / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    done = results.setdefault("calibration", {})
    for model in models:
        if model in done:
            continue
        path = tables / f"{_slug(model)}.json"
        argv = ["calibrate", "--model", model, "--workers", str(s["workers"]), "--out", str(path)]
        if s["batch_size"] is not None:
            argv += ["--batch-size", str(s["batch_size"])]
        print(f"matrix: calibrating {model} ...", file=sys.stderr, flush=True)
        started = time.monotonic()
        calibrator(argv, tables / f"{_slug(model)}.log")
        done[model] = {"table": str(path.resolve()), "seconds": round(time.monotonic() - started, 1)}
        write_results(results, out)


SCENARIO_CMD: tuple[str, ...] = (*PYTHON, "-m", "netsense")
"""The command a run's argv follows (a test swaps in a stand-in)."""
Runner = Callable[[Cell, list[str], Path, float], tuple[dict[str, Any] | None, str | None]]


def run_subprocess(cell: Cell, argv: list[str], out: Path, limit_s: float) -> tuple[dict[str, Any] | None, str | None]:
    """Run one scenario as a subprocess in its own process group: (figures, None) or (figures or None, reason)."""
    if out.exists():
        shutil.rmtree(out)  # a failed earlier attempt's results.json must not pass for this one
    out.mkdir(parents=True)
    log = out / "log.txt"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1"}
    with log.open("w") as fh:
        p = subprocess.Popen([*SCENARIO_CMD, *argv], stdout=fh, stderr=subprocess.STDOUT,
                             start_new_session=True, env=env)  # fmt: skip
        try:
            rc = p.wait(limit_s)
        except subprocess.TimeoutExpired:
            _kill_group(p)
            return None, f"hung: no result after {limit_s:.0f} s, killed (log {log})"
        except BaseException:
            _kill_group(p)
            raise
        _kill_group(p)  # a child the scenario left behind
    figures = None
    try:
        data = json.loads((out / "results.json").read_text())
        figures = data.get("policies", {}).get(cell.policy)
    except (OSError, ValueError):
        data = {}
    if rc == 0 and figures is not None:
        return figures, None
    reason = data.get("failed", {}).get(cell.policy) or _last_error(log) or "no results.json"
    return figures, f"exit {rc}: {reason}"


def _kill_group(p: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
    """SIGTERM the run's process group (the scenario and every child it started), SIGKILL what is
    left after `grace_s`; returns at once when the group is empty."""
    sig = signal.SIGTERM
    deadline = time.monotonic() + grace_s
    while True:
        p.poll()  # reap the leader, or its zombie keeps the group alive
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        if sig == signal.SIGKILL and time.monotonic() > deadline + grace_s:
            return  # unkillable (D state): give up rather than hang the matrix
        sig = signal.SIGKILL if time.monotonic() > deadline else 0  # 0: only probe until the grace is over
        time.sleep(0.2)


def _last_error(log: Path) -> str | None:
    """The last line of the run's log that names an error, else its last line."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    errors = [ln for ln in lines if "error" in ln.lower() or "failed" in ln.lower()]
    return (errors or lines or [None])[-1]


KEEP = ("time_to_target_s", "step_at_target", "final_accuracy", "samples_per_s", "steps", "wall_s", "bytes_up", "bytes_down",
        "mean_step_s", "ideal_step_s", "stopped_at_max_time", "levels", "levels_down")  # fmt: skip
"""The figures of a run the matrix keeps (the eval curve and timeline stay in the run's own results.json)."""


def _hms(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def write_results(results: dict[str, Any], out: Path) -> None:
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=1, allow_nan=False) + "\n")
    tmp.replace(out / "results.json")
    (out / "matrix.md").write_text(markdown_matrix(results) + "\n")


def run_cells(todo: list[Cell], results: dict[str, Any], out: Path, *, insecure: bool,
              runner: Runner = run_subprocess, log: Any = None) -> int:  # fmt: skip
    """Run `todo` in order, recording each into `results` and DIR/results.json; returns the failures."""
    log = log or sys.stderr
    limit = 1.5 * results["settings"]["max_time_s"] + 180.0
    t0, failures = time.monotonic(), 0
    for i, cell in enumerate(todo, start=1):
        print(f"matrix [{i}/{len(todo)}] {cell.describe()} ...", file=log, flush=True)
        started = time.monotonic()
        cell_dir = out / "runs" / _slug(cell.model) / _slug(cell.link) / _slug(cell.policy) / f"seed{cell.seed}"
        figures, reason = runner(cell, scenario_argv(cell, results, cell_dir, insecure), cell_dir, limit)
        took = time.monotonic() - started
        record: dict[str, Any] = {"model": cell.model, "link": cell.link, "policy": cell.policy, "seed": cell.seed,
                                  "status": "failed" if reason else "ok", "elapsed_s": round(took, 1),
                                  "target_accuracy": results["targets"][cell.model], "loadavg": _loadavg(),
                                  "figures": {k: figures[k] for k in KEEP if k in figures} if figures else None}  # fmt: skip
        if reason:
            record["reason"] = reason
            failures += 1
        results["cells"][cell.key] = record
        write_results(results, out)
        elapsed = time.monotonic() - t0
        eta = elapsed / i * (len(todo) - i)
        if reason:
            what = f"FAILED: {reason}"
        else:
            ttt = figures["time_to_target_s"] if figures else None
            what = (f"ok, target {'not reached' if ttt is None else f'at {ttt:.1f} s'}, "
                    f"final acc {figures['final_accuracy']:.3f}" if figures else "ok")  # fmt: skip
        print(f"matrix [{i}/{len(todo)}] {cell.describe()}: {what} ({took:.0f} s) | elapsed {_hms(elapsed)}, ETA {_hms(eta)}",
              file=log, flush=True)  # fmt: skip
    return failures


def run(args: argparse.Namespace, runner: Runner = run_subprocess, calibrator: Calibrator = run_calibrate) -> int:
    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
    if not args.max_time > 0:
        raise ConfigError(f"--max-time must be > 0, got {args.max_time}")
    for flag, value in (("--steps", args.steps), ("--batch-size", args.batch_size), ("--workers", args.workers),
                        ("--eval-every", args.eval_every)):  # fmt: skip
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    models = _names("--models", args.models)
    _check_models(models)
    links = parse_links(args.links)
    policies = parse_matrix_policies(args.policies)
    targets = parse_targets(args.targets, models)
    out = Path(args.out)
    path = out / "results.json"
    if path.exists() and not args.resume:
        raise ConfigError(f"--out {out} already holds a matrix's results.json; pass --resume to continue it, or another --out")
    seeds = list(range(args.seeds))
    new: dict[str, Any] = {"format": FORMAT, "version": VERSION, "settings": settings_of(args), "models": models,
                           "links": links, "policies": policies, "seeds": seeds, "targets": targets, "runs": [],
                           "cells": {}}  # fmt: skip
    results = new
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--resume: cannot read {path}: {exc}") from None
        check_resumable(old, new)
        results = merge(old, new)
    out.mkdir(parents=True, exist_ok=True)
    todo, skipped = plan_cells(results, models, links, policies, seeds, args.resume)
    if skipped:
        print(f"matrix: --resume: {skipped} run(s) already in {path}, {len(todo)} to go", file=sys.stderr, flush=True)
    command = "netsense " + " ".join(sys.argv[1:]) if sys.argv and "netsense" in sys.argv[0] else None
    results["runs"].append({"started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                            "command": command, "cpus": os.cpu_count(), "loadavg_start": _loadavg()})  # fmt: skip
    if args.calibrate and any(p.removeprefix("netns:") == "netsense" for p in results["policies"]):
        calibrate_models(results, results["models"], out, calibrator)
    try:
        failures = run_cells(todo, results, out, insecure=args.insecure, runner=runner)
    finally:
        results["runs"][-1]["loadavg_end"] = _loadavg()
        write_results(results, out)
    print(markdown_matrix(results))
    return 1 if failures else 0
