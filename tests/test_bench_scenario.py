"""`netsense bench scenario`: the pure figures of `netsense.bench.results`, and one tiny scenario end to end."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from netsense.bench.scenario import parse_policies
from netsense.cli import main
from netsense.errors import ConfigError
from netsense.bench.plot import FIGURES
from netsense.bench.results import (
    POLICY_FIELDS,
    best_fixed,
    ideal_step_s,
    markdown_table,
    policy_figures,
    speedup,
    step_at_target,
    step_compute,
    step_records,
    start_skew,
    time_to_target,
    training_clock,
    transfer_s,
    validate_results,
)
from netsense.transport.emulation.linkspec import parse_link
from netsense.worker.task import TrainTask


def _figs(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "samples_per_s": 100.0, "time_to_target_s": 5.0, "final_accuracy": 0.9, "bytes_up": 10, "bytes_down": 10,
        "steps": 10, "wall_s": 10.0, "mean_step_s": 1.0, "ideal_step_s": 0.5,
    }  # fmt: skip
    base.update(kw)
    return base


def _results(**policies: dict[str, object]) -> dict[str, object]:
    return {"scenario": {"model": "m"}, "target_accuracy": 0.8, "policies": policies}


def test_training_clock_removes_eval_pauses() -> None:
    walls = {1: 1.0, 2: 2.0, 3: 5.0, 4: 6.0}  # an eval after step 2 took 2 s
    evals = [{"step": 2, "wall_s": 4.0, "test_accuracy": 0.5}, {"step": 4, "wall_s": 6.0, "test_accuracy": 0.9}]
    clock = training_clock(walls, evals)
    assert clock == {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0}


def test_the_clock_runs_from_the_last_workers_start() -> None:
    """Rank 1 started 0.8 s after rank 0: rank 0's first step held that wait at the barrier."""
    assert start_skew({0: 10.0, 1: 10.8, 2: 10.3}) == pytest.approx(0.8)
    assert start_skew({0: 10.0, 1: 9.5}) == 0.0  # an earlier start waits on its own clock
    assert start_skew({1: 10.0}) == 0.0 and start_skew({}) == 0.0
    walls = {1: 1.0, 2: 1.5, 3: 4.0}  # an eval after step 2 took 2 s
    evals = [{"step": 2, "wall_s": 3.5, "test_accuracy": 0.5}]
    assert training_clock(walls, evals, start_skew=0.8) == pytest.approx({1: 0.2, 2: 0.7, 3: 1.2})
    assert training_clock({1: 0.5}, [], start_skew=0.8) == {1: 0.0}  # never below zero
    steps = _events(n=10)
    evals = [{"step": 10, "wall_s": 5.0, "test_accuracy": 0.85}]
    figs = policy_figures(steps=steps, evals=evals, decisions={}, link_t0=None, spec=None, target=0.8,
                          global_batch=64, starts={0: 50.0, 1: 50.5})  # fmt: skip
    assert figs["start_skew_s"] == pytest.approx(0.5)
    assert figs["time_to_target_s"] == pytest.approx(4.5) and figs["wall_s"] == pytest.approx(4.5)
    assert figs["mean_step_s"] == pytest.approx(0.45)


def test_time_to_target_is_the_first_eval_at_or_above_it() -> None:
    curve = [(1.0, 10, 0.5), (2.0, 20, 0.8), (3.0, 30, 0.7), (4.0, 40, 0.95)]
    assert time_to_target(curve, 0.8) == 2.0
    assert time_to_target(curve, 0.9) == 4.0
    assert time_to_target(curve, 0.99) is None
    assert step_at_target(curve, 0.8) == 20 and step_at_target(curve, 0.9) == 40
    assert step_at_target(curve, 0.99) is None


def test_transfer_and_ideal_step_use_the_true_rate_over_time() -> None:
    spec = parse_link("rate=0s:80mbit,10s:8mbit")  # 10 MB/s, then 1 MB/s, both ways
    assert transfer_s(spec, 1.0, 1_000_000, 2_000_000) == pytest.approx(0.2)  # the busier direction
    assert transfer_s(spec, 11.0, 1_000_000, 0) == pytest.approx(1.0)
    assert transfer_s(None, 0.0, 10**9, 10**9) == 0.0
    assert transfer_s(parse_link("up.rate=8mbit"), 0.0, 1_000_000, 10**9) == pytest.approx(1.0)  # down unlimited
    records = [
        {"step": 1, "bytes_up": 1_000_000, "bytes_down": 0, "compute_s": None, "t_link": 1.0},  # comm 0.1
        {"step": 2, "bytes_up": 1_000_000, "bytes_down": 0, "compute_s": 0.3, "t_link": 2.0},  # compute 0.3
        {"step": 3, "bytes_up": 1_000_000, "bytes_down": 0, "compute_s": 0.3, "t_link": 12.0},  # comm 1.0
    ]
    # Step 1's unknown compute takes the median (0.3).
    assert ideal_step_s(records, spec) == pytest.approx((0.3 + 0.3 + 1.0) / 3)


def _events(ranks: int = 2, n: int = 4, per_step: int = 100) -> dict[int, dict[int, dict[str, object]]]:
    return {
        r: {s: {"step": s, "wall_s": 0.5 * s, "bytes_up": per_step * s, "bytes_down": 2 * per_step * s, "mono": 100.0 + 0.5 * s}
            for s in range(1, n + 1)}
        for r in range(ranks)
    }  # fmt: skip


def test_step_records_sum_ranks_and_take_the_slowest_compute() -> None:
    steps = _events()
    del steps[1][4]  # rank 1 was stopped before finishing step 4
    decisions = {0: [{"step": s, "compute_s": 0.01} for s in range(4)], 1: [{"step": s, "compute_s": 0.02} for s in range(4)]}
    records = step_records(steps, decisions, link_t0=100.0)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["bytes_up"] == 200 and r["bytes_down"] == 400 and r["compute_s"] == 0.02 for r in records)
    assert records[1]["t_link"] == pytest.approx(0.75)  # midpoint of rank 0's step 2


def test_step_compute_is_the_step_events_own_without_the_eval_pause() -> None:
    """The step event's compute_s wins over the decision log's (the policy's Tc, which holds the
    wait for the update), and rank 0's step after an eval leaves that rank out (the pause)."""
    steps = _events(n=3)
    for r in (0, 1):
        for s, e in steps[r].items():
            e["compute_s"] = 0.005 * (r + 1)
    steps[0][3]["compute_s"] = 0.5  # rank 0 evaluated after step 2
    steps[1][1]["compute_s"] = 0.0  # a first step: unknown
    tc = {r: [{"step": s, "compute_s": 0.09} for s in range(3)] for r in (0, 1)}
    assert step_compute(steps, tc, [{"step": 2, "test_accuracy": 0.5}]) == {1: 0.005, 2: 0.01, 3: 0.01}
    assert step_compute(steps, tc)[3] == 0.5
    records = step_records(steps, tc, link_t0=None, evals=[{"step": 2}])
    assert [r["compute_s"] for r in records] == [0.005, 0.01, 0.01]
    del steps[0][1]["compute_s"]  # an event without the field: the decision log's
    assert step_compute(steps, tc)[1] == 0.09


def test_policy_figures_are_consistent() -> None:
    steps = _events(n=10)
    evals = [{"step": 5, "wall_s": 2.5, "test_accuracy": 0.7}, {"step": 10, "wall_s": 5.0, "test_accuracy": 0.85}]
    decisions = {0: [{"step": s, "compute_s": 0.0001, "t": 100.0 + s, "level": 0, "spec": "fp32", "bw_used_Bps": 1e6}
                     for s in range(10)]}  # fmt: skip
    figs = policy_figures(steps=steps, evals=evals, decisions=decisions, link_t0=100.0,
                          spec=parse_link("rate=8mbit"), target=0.8, global_batch=64)  # fmt: skip
    assert figs["steps"] == 10 and figs["wall_s"] == 5.0
    assert figs["samples_per_s"] == pytest.approx(640 / 5.0)
    assert figs["time_to_target_s"] == 5.0
    assert figs["final_accuracy"] == 0.85
    assert figs["bytes_up"] == 2000 and figs["bytes_down"] == 4000
    assert figs["ideal_step_s"] == pytest.approx(400 / 1e6)
    assert figs["timeline"]["true_bps"][0] == 8e6 and figs["timeline"]["bw_est_bps"][0] == 8e6
    assert validate_results(_results(p=figs)) == []


def test_validate_results_finds_each_problem() -> None:
    assert validate_results(_results(none=_figs())) == []
    assert validate_results(_results(none=_figs(time_to_target_s=None))) == []
    bad = {
        "missing": _figs(),
        "nan": _figs(samples_per_s=float("nan")),
        "zero_bytes": _figs(bytes_up=0),
        "late": _figs(time_to_target_s=11.0),
        "acc": _figs(final_accuracy=1.5),
        "type": _figs(steps=1.5),
    }
    del bad["missing"]["ideal_step_s"]
    problems = " | ".join(validate_results(_results(**bad)))
    for needle in ("lacks 'ideal_step_s'", "samples_per_s is not finite", "bytes_up must be > 0",
                   "outside [0, wall_s", "final_accuracy must be in [0, 1]", "steps has type float"):  # fmt: skip
        assert needle in problems
    assert validate_results([]) == ["results must be an object, got list"]
    assert "'policies' must be a non-empty object" in validate_results({"scenario": {}, "target_accuracy": 0.5})


def test_speedups_best_fixed_and_table() -> None:
    policies = {
        "none": _figs(time_to_target_s=9.0),
        "fp16": _figs(time_to_target_s=6.0),
        "fixed:topk:0.01+fp16": _figs(time_to_target_s=4.0),
        "netsense": _figs(time_to_target_s=3.0),
        "dc2": _figs(time_to_target_s=None),
    }
    assert best_fixed(policies) == "fixed:topk:0.01+fp16"
    assert speedup(policies, "netsense", "none") == pytest.approx(3.0)
    assert speedup(policies, "netsense", "fp16") == pytest.approx(2.0)
    assert speedup(policies, "dc2", "none") is None
    table = markdown_table(_results(**policies))
    assert "| `netsense` |" in table and "3.00x" in table and "best fixed policy: fixed:topk:0.01+fp16" in table
    assert all(line.count("|") == table.splitlines()[0].count("|") for line in table.splitlines() if line.startswith("|"))


def test_parse_policies_checks_names() -> None:
    assert parse_policies("none, fp16,fixed:topk:0.01+fp16") == ["none", "fp16", "fixed:topk:0.01+fp16"]
    with pytest.raises(ConfigError):
        parse_policies("none,bogus")
    with pytest.raises(ConfigError, match="repeats"):
        parse_policies("none,none")
    with pytest.raises(ConfigError, match="names no policy"):
        parse_policies(" , ")


def test_bad_arguments_fail_before_anything_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "scenario", "--model", "tests.nowhere:f", "--target-accuracy", "0.5", "--out", str(tmp_path)]) == 2
    assert main(["bench", "scenario", "--policies", "nope", "--out", str(tmp_path)]) == 2
    assert main(["bench", "scenario", "--model", "digits-cnn", "--target-accuracy", "2", "--out", str(tmp_path)]) == 2
    assert not (tmp_path / "results.json").exists()


def test_bad_sites_fail_before_anything_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in (
        (["--workers", "4", "--sites", "5"], "--sites must be in 2..--workers (4), got 5"),
        (["--workers", "4", "--sites", "1"], "--sites must be in 2..--workers (4), got 1"),
        (["--workers", "4", "--sites", "2", "--topology", "bottleneck"], "--sites needs --topology sites"),
    ):
        capsys.readouterr()
        assert main(["bench", "scenario", "--policies", "none", *argv, "--out", str(tmp_path)]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()


def test_tiny_scenario_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CI's scenario: 2 workers, 2 policies, a few steps over the emulated link; seconds, not minutes."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "scn"
    status = main([
        "bench", "scenario", "--model", "digits-cnn", "--workers", "2", "--link", "rate=50mbit,delay=2ms",
        "--policies", "none,fp16", "--steps", "6", "--eval-every", "3", "--target-accuracy", "0.05",
        "--seed", "3", "--max-time", "120", "--insecure", "--out", str(out),
    ])  # fmt: skip
    assert status == 0
    results = json.loads((out / "results.json").read_text())
    assert validate_results(results) == []
    assert list(results["policies"]) == ["none", "fp16"]
    assert results["scenario"]["link"] == "rate=50mbit,delay=2ms" and results["scenario"]["seed"] == 3
    for name, f in results["policies"].items():
        assert set(POLICY_FIELDS) <= set(f)
        assert f["steps"] == 6 and f["bytes_up"] > 0 and f["bytes_down"] > 0 and f["samples_per_s"] > 0
        assert f["time_to_target_s"] is not None and f["time_to_target_s"] <= f["wall_s"]
        assert 0 < f["ideal_step_s"] and math.isfinite(f["mean_step_s"])
        assert f["levels"] == {"fp32" if name == "none" else "fp16": 12}
        assert f["levels_down"] == {}  # the gradient domain (the default) runs no downlink policy: the push's codec
        assert all(t is not None and t >= 0 for t in f["timeline"]["t_s"])
        assert set(f["timeline"]["true_bps"]) == {50e6}
    # fp16 halves the uplink payload (framing aside), and the update comes down at the push's codec.
    assert results["policies"]["fp16"]["bytes_up"] < 0.6 * results["policies"]["none"]["bytes_up"]
    assert results["policies"]["fp16"]["bytes_down"] < 0.6 * results["policies"]["none"]["bytes_down"]
    for name in FIGURES:
        assert (out / name).stat().st_size > 1000
    assert "| `fp16` |" in (out / "results.md").read_text()


def test_plot_redraws_a_copy(tmp_path: Path) -> None:
    policies = {"none": _figs(evals=[[1.0, 5, 0.5], [5.0, 10, 0.9]]), "fp16": _figs()}
    (tmp_path / "results.json").write_text(json.dumps(copy.deepcopy(_results(**policies))))
    assert main(["plot", str(tmp_path)]) == 0
    assert all((tmp_path / name).exists() for name in FIGURES)


def test_ddp_peer_through_netns(tmp_path: Path) -> None:
    """DDP (gloo) with the fp16 hook across a tbf bottleneck, a few steps, same figures."""
    from netsense.transport.emulation.netns import netns_available

    ok, reason = netns_available()
    if not ok:
        pytest.skip(reason)
    from netsense.bench.ddp_baseline import figures, run_ddp

    events = run_ddp(model="digits-cnn", hook="fp16", link="rate=50mbit,queue=50ms", steps=4, eval_every=2)
    figs = figures(events, link="rate=50mbit,queue=50ms", target=0.01, global_batch=64)
    assert validate_results(_results(**{"ddp:fp16": figs})) == []
    assert figs["steps"] == 4 and figs["time_to_target_s"] is not None
    # fp16 all-reduce of ~38k parameters: ~77 kB each way per step, plus TCP/IP framing.
    assert 4 * 70_000 < figs["bytes_up"] < 4 * 200_000


def test_netns_and_ddp_rows_compare_with_netns_baselines() -> None:
    policies = {
        "none": _figs(time_to_target_s=9.0),
        "netns:none": _figs(time_to_target_s=8.0),
        "netns:fp16": _figs(time_to_target_s=4.0),
        "ddp:powersgd": _figs(time_to_target_s=2.0),
    }
    assert best_fixed(policies) == "none" and best_fixed(policies, "netns:") == "netns:fp16"
    table = markdown_table(_results(**policies))
    row = next(line for line in table.splitlines() if "`ddp:powersgd`" in line)
    assert "| 4.00x | 2.00x | 2.00x |" in row  # vs netns:none, netns:fp16, best netns fixed


@pytest.mark.slow
def test_netsense_and_ddp_cross_the_same_tbf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """netns:none (PS and workers in the namespaces) and ddp:none through one tbf spec."""
    from netsense.transport.emulation.netns import netns_available

    ok, reason = netns_available()
    if not ok:
        pytest.skip(reason)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "scn"
    assert main([
        "bench", "scenario", "--model", "digits-cnn", "--netns-link", "rate=50mbit,queue=50ms", "--policies",
        "netns:none,ddp:none", "--steps", "4", "--eval-every", "2", "--target-accuracy", "0.01", "--out", str(out),
    ]) == 0  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    assert validate_results(results) == []
    for f in results["policies"].values():
        assert f["path"] == "netns tbf rate=50mbit,queue=50ms" and f["steps"] == 4
    # NetSense: 2 workers push 153 kB each through the tbf per step; DDP's ring moves ~1 model each way.
    assert results["policies"]["netns:none"]["bytes_up"] > 4 * 2 * 150_000


def _needs_netns() -> None:
    from netsense.transport.emulation.netns import netns_available

    ok, reason = netns_available()
    if not ok:
        pytest.skip(reason)


def test_wide_mlp_fills_two_ddp_buckets() -> None:
    """The PowerSGD test below is only a test if DDP splits the model's gradient into buckets."""
    import torch.distributed as dist

    from netsense.models import load_task

    params = list(load_task("wide-mlp").build_model().parameters())
    assert sum(p.numel() for p in params) >= 300_000
    # DDP's assignment after its first iteration: parameters in reverse order, first bucket 1 MiB.
    buckets, _ = dist._compute_bucket_assignment_by_size(params[::-1], [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 << 20])
    assert len(buckets) >= 2


def test_ddp_powersgd_with_two_buckets() -> None:
    """torch's powerSGD_hook issued one bucket's P / Q all-reduces from gloo's threads while the next
    bucket's started: the ranks' collective orders differed and gloo aborted or hung at step 3."""
    _needs_netns()
    from netsense.bench.ddp_baseline import figures, run_ddp

    link = "rate=100mbit,queue=50ms"
    events = run_ddp(model="wide-mlp", hook="powersgd", link=link, steps=6, eval_every=3, max_time_s=60)
    figs = figures(events, link=link, target=0.01, global_batch=64)
    assert validate_results(_results(**{"ddp:powersgd": figs})) == []
    assert figs["steps"] == 6
    # Two fp32 steps (1.35 MB each, ring of 2) before PowerSGD starts, then rank-2 factors of ~10 kB.
    assert figs["bytes_up"] < 4 * 1_350_000


def test_ddp_row_stops_at_max_time(tmp_path: Path) -> None:
    _needs_netns()
    out = tmp_path / "scn"
    assert main([
        "bench", "scenario", "--model", "wide-mlp", "--netns-link", "rate=10mbit,queue=50ms", "--policies", "ddp:none",
        "--steps", "300", "--eval-every", "2", "--target-accuracy", "0.5", "--max-time", "3", "--out", str(out),
    ]) == 0  # fmt: skip
    f = json.loads((out / "results.json").read_text())["policies"]["ddp:none"]
    # ~1.1 s per step at 10 Mbit/s: stopped at the first step past 3 s, a step or two later.
    assert f["stopped_at_max_time"] is True and 2 <= f["steps"] < 20


class _FaultOnRank1(nn.Module):
    """digits-cnn whose rank 1 raises (or, with FAULT_KIND=hang, sleeps) at its 3rd training forward,
    in the row of hook $FAULT_HOOK only."""

    def __init__(self) -> None:
        super().__init__()
        from netsense.models import DigitsCNN

        self.net, self.calls = DigitsCNN(), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import sys

        import torch.distributed as dist

        if self.training and dist.is_initialized() and dist.get_rank() == 1:
            hook = sys.argv[sys.argv.index("--hook") + 1]
            self.calls += 1
            if hook == os.environ.get("FAULT_HOOK") and self.calls == 3:
                if os.environ.get("FAULT_KIND") == "hang":
                    time.sleep(3600)
                raise RuntimeError("injected crash at step 3")
        return self.net(x)


def crashing_digits() -> TrainTask:
    """`--model tests.test_bench_scenario:crashing_digits` (the DDP ranks import it from the cwd)."""
    from netsense.models import digits_cnn

    return dataclasses.replace(digits_cnn(), name="crashing-digits", build_model=_FaultOnRank1)


def test_failed_ddp_row_is_recorded_and_the_bench_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _needs_netns()
    monkeypatch.setenv("FAULT_HOOK", "fp16")
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    out = tmp_path / "scn"
    assert main([
        "bench", "scenario", "--model", "tests.test_bench_scenario:crashing_digits", "--netns-link", "rate=50mbit,queue=50ms",
        "--policies", "ddp:fp16,ddp:none", "--steps", "4", "--eval-every", "2", "--target-accuracy", "0.01", "--out", str(out),
    ]) == 1  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    assert list(results["policies"]) == ["ddp:none"] and results["policies"]["ddp:none"]["steps"] == 4
    assert list(results["failed"]) == ["ddp:fp16"]
    assert "DDP rank 1 (fp16) exited with status 1" in results["failed"]["ddp:fp16"]
    assert "injected crash at step 3" in results["failed"]["ddp:fp16"]
    assert validate_results(results) == []
    assert "`ddp:fp16` failed: " in (out / "results.md").read_text()


def test_a_rank_that_fails_is_named_before_the_peer_it_took_down() -> None:
    """Rank 1 raises; rank 0 aborts on the lost connection first (seen in a CI-like run: the report
    named only rank 0's "Connection closed by peer"). The report names both, the cause first, and
    no rank is left running."""
    import subprocess
    import sys
    import threading

    from netsense.bench import ddp_baseline
    from netsense.errors import ProcessFailed

    lost = "import sys; sys.stderr.write('what():  [pair.cc:553] Connection closed by peer [10.0.0.2]:7336\\n'); sys.exit(134)"
    cause = ("import sys, time; print('{\"event\": \"step\", \"step\": 3}', flush=True); time.sleep(0.5); "
             "sys.stderr.write('RuntimeError: injected crash at step 3\\n'); sys.exit(1)")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for code in (lost, cause)]  # fmt: skip
    outs: list[list[str]] = [[], []]
    errs: list[list[str]] = [[], []]
    readers = []
    for p, out, err in zip(procs, outs, errs):
        readers += [threading.Thread(target=ddp_baseline._pump, args=(p.stdout, out), daemon=True),
                    threading.Thread(target=ddp_baseline._pump, args=(p.stderr, err), daemon=True)]  # fmt: skip
    for t in readers:
        t.start()
    with pytest.raises(ProcessFailed) as e:
        ddp_baseline._supervise(procs, outs, errs, readers, hook="fp16", max_time_s=30.0)
    message = str(e.value)
    assert message.index("DDP rank 1 (fp16) exited with status 1: RuntimeError: injected crash") < message.index(
        "DDP rank 0 (fp16) exited with status 134"
    )
    assert "injected crash at step 3 (its last step: 3)" in message and message.endswith("(its last step: None)")
    assert all(p.poll() is not None for p in procs)


def test_hung_ddp_row_is_stopped_and_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank blocked in a collective never reports the step past --max-time: the hang guard ends it."""
    _needs_netns()
    from netsense.bench import ddp_baseline

    monkeypatch.setattr(ddp_baseline, "HANG_GRACE_S", 5.0)
    monkeypatch.setenv("FAULT_HOOK", "none")
    monkeypatch.setenv("FAULT_KIND", "hang")
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    out = tmp_path / "scn"
    assert main([
        "bench", "scenario", "--model", "tests.test_bench_scenario:crashing_digits", "--netns-link", "rate=50mbit,queue=50ms",
        "--policies", "ddp:none", "--steps", "4", "--eval-every", "2", "--target-accuracy", "0.01", "--max-time", "10",
        "--out", str(out),
    ]) == 1  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    assert results["policies"] == {} and list(results["failed"]) == ["ddp:none"]
    assert "hung" in results["failed"]["ddp:none"]


def test_wan_figures_and_table_of_a_sites_row() -> None:
    """WAN bytes per step into each site, and the ideal step they allow: the busier direction at its
    link's rate, or the step's compute when that is longer."""
    from netsense.bench.topology import wan_figures, wan_table
    from netsense.transport.emulation.linkspec import parse_link

    spec = parse_link("up.rate=8kbit,down.rate=16kbit")  # 1000 B/s s0 -> s1, 2000 B/s s1 -> s0
    figs = wan_figures({"s0": 2000, "s1": 3000}, 10, spec, ["s0", "s1"], [0.1, 0.5])
    assert figs["wan_bytes_per_step"] == {"into s0": 200.0, "into s1": 300.0}
    assert figs["wan_ideal_step_s"] == pytest.approx((0.3 + 0.5) / 2)
    assert wan_figures({"s0": 2000, "s1": 3000}, 10, spec, ["s0", "s1"])["wan_ideal_step_s"] == pytest.approx(0.3)
    # three sites: into s1 come s0 -> s1 (up, 1000 B/s) and s2 -> s1 (down, 2000 B/s)
    three = wan_figures({"s0": 0, "s1": 3000, "s2": 0}, 1, spec, ["s0", "s1", "s2"])
    assert three["wan_ideal_step_s"] == pytest.approx(1.0)
    results = _results(**{"netns:fp16": {**_figs(), **figs}, "fp16": _figs()})
    table = wan_table(results)
    assert "| `netns:fp16` | s0 0.2, s1 0.3 |" in table and "`fp16`" not in table
    assert wan_table(_results(fp16=_figs())) == ""


def test_relay_table_of_a_relayed_row() -> None:
    """Each relay's phases per upstream shard, in ms; a relay without phases, and a row without
    relays, add nothing."""
    from netsense.bench.topology import relay_table

    phases = {"steps": 60, "gather_s": 0.05, "push_s": 0.158, "update_s": 0.2, "install_s": 0.0005}
    relays = [{"site": "s0", "phases": [phases, None]}, {"site": "s1", "phases": [{"steps": 1, "install_s": 0.001}]},
              {"site": "s2"}]  # fmt: skip
    table = relay_table(_results(**{"netns:fp16": {**_figs(), "relays": relays}, "fp16": _figs()}))
    assert "| `netns:fp16` | s0 | 0 | 60 | 50.0 | 158.0 | 200.0 | 0.5 |" in table
    assert "| `netns:fp16` | s1 | 0 | 1 | — | — | — | 1.0 |" in table and "| s0 | 1 |" not in table
    assert relay_table(_results(fp16=_figs())) == ""

