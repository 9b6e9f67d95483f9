"""Bad input gets one line naming the flag (or TOML field) and what is allowed, exit 2, no traceback,
before any process starts or socket opens (issue #17; #16 items 4 and 6)."""

from __future__ import annotations

import datetime
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from netsense.cli import main

# argv -> a substring of the one-line error. "{toml:TEXT}" is replaced by a config file holding
# TEXT, "{certs}" by a folder that already holds dev certificates, "{tmp}" by a folder that does
# not exist, "{file}" by a file and "{dir}" by a folder that exist (also inside TEXT and the message).
ROWS: list[tuple[list[str], str]] = [
    (["ps", "--port", "70000"], "--port must be in 0..65535, got 70000"),
    (["ps", "--port", "-5"], "--port must be in 0..65535, got -5"),
    (["ps", "--host", "999.1.1.1"], "--host must be an IP address or host name"),
    (["ps", "--host", "nosuch.invalid", "--insecure"], "--host: host 'nosuch.invalid' does not resolve"),
    (["worker", "--ps", "unresolvable.invalid:1", "--insecure"], "--ps: host 'unresolvable.invalid' does not resolve"),
    (["certs", "--out", "{tmp}", "--days", "-1"], "--days must be >= 1, got -1"),
    (["certs", "--out", "{tmp}", "--days", "0"], "--days must be >= 1, got 0"),
    (["certs", "--out", "{certs}"], "refusing to overwrite"),
    (["ps", "--checkpoint-every", "-3"], "--checkpoint-every must be >= 0, got -3"),
    (["ps", "--checkpoint-every-s", "-1"], "--checkpoint-every-s must be >= 0"),
    (["launch", "--steps", "0"], "--steps must be >= 1, got 0"),
    (["launch", "--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["launch", "--workers", "0"], "--workers must be in 1..256, got 0"),
    (["launch", "--servers", "0"], "--servers must be in 1..64, got 0"),
    (["launch", "--eval-every", "-1"], "--eval-every must be >= 0"),
    (["launch", "--staleness", "-1"], "--staleness must be >= 0"),
    (["ps", "--downlink-domain", "both"], "argument --downlink-domain: invalid choice: 'both'"),
    (["launch", "--downlink-domain", "gradient", "--staleness", "1"], "server.downlink_domain 'gradient' needs synchronous training"),
    (["ps", "--config", "{toml:[server]\ndownlink_domain = 'grad'\n}"], "server.downlink_domain must be one of auto, params, gradient"),
    (["worker", "--world-size", "0", "--insecure"], "--world-size must be >= 1, got 0"),
    (["worker", "--config", "{toml:[transport]\nidle_timeout_s = -1\n}", "--insecure"], "transport.idle_timeout_s must be > 0, got -1"),
    (["ps", "--max-datagram-size", "10"], "--max-datagram-size must be in 1200..65507, got 10"),
    (["ps", "--barrier-timeout", "0"], "--barrier-timeout must be > 0, got 0"),
    (["launch", "--barrier-timeout", "-1"], "--barrier-timeout must be > 0, got -1"),
    (["ps", "--downlink-codec", "nosuch"], "--downlink-codec is not a valid codec: unknown codec 'nosuch'"),
    (["ps", "--policy", "nope"], "--policy is not a valid policy: unknown policy 'nope'"),
    (["launch", "--codec", "fp17"], "--codec is not a valid codec: unknown codec 'fp17'"),
    (["launch", "--policy", "fixed:fp17"], "--policy is not a valid policy"),
    (["launch", "--downlink-policy", "nope"], "--downlink-policy is not a valid policy"),
    (["launch", "--ladder", "fp32,fp17"], "--ladder is not a valid ladder"),
    (["worker", "--ladder", "fp16,fp16", "--insecure"], "--ladder is not a valid ladder"),
    (["launch", "--lr", "0"], "--lr is invalid: optimizer lr must be in (0, 1000)"),
    (["launch", "--config", "{toml:[optimizer]\nname = 'sgdd'\n}"], "optimizer.name is invalid"),
    (["launch", "--config", "{toml:[optimizer]\nlrr = 0.1\n}"], "optimizer.lrr is invalid: unknown optimizer settings"),
    (["launch", "--config", "{toml:[train]\ncodec = 'fp17'\n}"], "train.codec is not a valid codec"),
    (["ps", "--config", "{toml:[server]\ndownlink_codec = 'nosuch'\n}"], "server.downlink_codec is not a valid codec"),
    (["ps", "--config", "{toml:[server]\nport = 70000\n}"], "server.port must be in 0..65535"),
    (["launch", "--config", "{toml:[train]\nsteps = 0\n}"], "train.steps must be >= 1, got 0"),
    (["launch", "--metrics-port", "70000"], "--metrics-port must be in 0..65535"),
    (["launch", "--metrics-port", "65535"], "--metrics-port must be in 0..65535, got 65537"),
    (["ps", "--metrics-host", "999.1.1.1"], "--metrics-host must be an IP address or host name"),
    (["worker", "--metrics-port", "-1", "--insecure"], "--metrics-port must be in 0..65535, got -1"),
    (["launch", "--model", "nosuch", "--insecure"], "unknown model 'nosuch'"),  # before the progress bar too
    (["launch", "--link", "rate=fast", "--insecure"], "link spec field 'rate': bad value 'fast'"),  # not the emulator's exit
    (["launch", "--trace", "{tmp}", "--insecure"], "link spec field 'trace': cannot read"),
    (["launch", "--optimizer", "sgdd"], "argument --optimizer: invalid choice: 'sgdd'"),  # argparse's own errors
    (["ps", "--port", "abc"], "argument --port: invalid int value: 'abc'"),
    (["launch", "--sites", "a:shards=0;b"], "--sites: site 'a' has no PS shard"),
    (["launch", "--sites", "a:workers=-1;b"], "--sites: site 'a': workers must be an integer >= 0, got -1"),
    (["launch", "--sites", "a;a"], "--sites: site 'a' is named twice"),
    (["launch", "--sites", "a:cores=2"], "--sites: site 'a': 'cores=2' is not workers=N or shards=N"),
    (["launch", "--sites", "a;b", "--workers", "3"], "--workers is 3 but the sites hold 2"),
    (["launch", "--config", "{toml:[[sites]]\nname = 'a'\nshards = 0\n}"], "site 'a' has no PS shard"),
    (["launch", "--config", "{toml:servers = 3\n[[sites]]\nname = 'a'\n}"], "servers is 3 but the sites hold 1"),
    (["launch", "--config", "{toml:relay = 'no'\n}"], "relay must be bool, got 'no'"),
    (["launch", "--no-relay", "--no-relay", "--sites", "a:workers=2;b", "--workers", "2"], "--workers is 2 but the sites hold 3"),
    (["ps", "--site", "a b"], "--site: site name 'a b' must be"),
    (["ps", "--site", "c", "--config", "{toml:[[sites]]\nname = 'a'\n[[sites]]\nname = 'b'\n}"],
     "--site: unknown site 'c'; the config's sites are a, b"),
    (["worker", "--site", "c", "--insecure", "--config", "{toml:[[sites]]\nname = 'a'\n}"], "--site: unknown site 'c'"),
    # Where a job writes: checked before any process starts (was a traceback after the PS started).
    (["worker", "--decision-log", "{tmp}/up.jsonl", "--insecure", "--ps", "127.0.0.1:1"], "--decision-log: cannot write {tmp}/up.jsonl: folder {tmp} does not exist"),
    (["worker", "--decision-log", "{dir}", "--insecure", "--ps", "127.0.0.1:1"], "--decision-log: cannot write {dir}: it is a folder, not a file"),
    (["worker", "--decision-log", "{file}/up.jsonl", "--insecure", "--ps", "127.0.0.1:1"], "cannot write {file}/up.jsonl: {file} is a file, not a folder"),
    (["worker", "--summary-json", "{tmp}/s.json", "--insecure", "--ps", "127.0.0.1:1"], "--summary-json: cannot write {tmp}/s.json: folder {tmp} does not exist"),
    (["worker", "--insecure", "--ps", "127.0.0.1:1", "--config", "{toml:[train]\ndecision_log = '{tmp}/up.jsonl'\n}"], "train.decision_log: cannot write"),
    (["launch", "--summary-json", "{tmp}/s.json"], "--summary-json: cannot write {tmp}/s.json: folder {tmp} does not exist"),
    (["launch", "--decision-log", "{tmp}/up.jsonl"], "train.decision_log (--decision-log): cannot write {tmp}/up-0.jsonl: folder {tmp} does not"),
    (["launch", "--config", "{toml:[server]\ndecision_log = '{tmp}/d.jsonl'\n}"], "server.decision_log: cannot write {tmp}/d.jsonl"),
    (["launch", "--config", "{toml:[server]\ncheckpoint_dir = '{file}'\n}"], "server.checkpoint_dir: cannot write to {file}: it is a file"),
    (["launch", "--run-dir", "{file}/run"], "--run-dir: cannot write to {file}/run: {file} is a file, not a folder"),
    (["ps", "--decision-log", "{tmp}/down.jsonl"], "--decision-log: cannot write {tmp}/down.jsonl: folder {tmp} does not exist"),
    (["ps", "--checkpoint-dir", "{file}"], "--checkpoint-dir: cannot write to {file}: it is a file, not a folder"),
    (["ps", "--checkpoint-dir", "{file}/ckpt"], "--checkpoint-dir: cannot write to {file}/ckpt: {file} is a file, not a folder"),
    (["ps", "--resume", "{file}"], "--resume: cannot write to {file}: it is a file, not a folder"),
    (["ps", "--config", "{toml:[server]\ncheckpoint_dir = '{file}'\n}"], "server.checkpoint_dir: cannot write to {file}"),
    # Calibrated q (docs/POLICIES.md, "Calibrated q"): a table nothing reads, or a file that is none.
    (["launch", "--policy", "fp16", "--progress-table", "{file}"], "--progress-table is read by the netsense policy only"),
    (["worker", "--policy", "netsense", "--progress-table", "{file}", "--insecure"], "--progress-table is not usable: progress table"),
    (["ps", "--policy", "netsense", "--progress-table", "{tmp}/q.json"], "--progress-table is not usable: progress table '{tmp}/q.json': cannot read it"),
    (["bench", "scenario", "--policies", "fp16", "--progress-table", "{file}", "--out", "{tmp}"], "--progress-table is read by the netsense policy only"),
    (["calibrate", "--trial-steps", "3", "--out", "{dir}/q.json"], "--trial-steps must be in 10..10000, got 3"),
    (["calibrate", "--out", "{tmp}/q.json"], "--out: cannot write {tmp}/q.json: folder {tmp} does not exist"),
    (["calibrate", "--levels", "fp32", "--out", "{dir}/q.json"], "--levels: 'fp32' is lossless"),
    (["calibrate", "--levels", "qsgd:4,nosuch:1", "--out", "{dir}/q.json"], "--levels: 'nosuch:1' is not a level of the ladder"),
    (["calibrate", "--model", "nosuch", "--out", "{dir}/q.json"], "unknown model 'nosuch'"),
    # More shards than keys: refused before 9 PS processes start (the workers refused it after).
    (["launch", "--servers", "12", "--insecure"], "--servers 12: model 'digits-cnn' has 11 parameter keys, and shard 11 would own none; use at most 11"),
]


def _paths(text: str, tmp_path: Path) -> str:
    """`text` with "{tmp}", "{file}" and "{dir}" replaced (the file and folder made)."""
    (tmp_path / "afile").touch()
    (tmp_path / "adir").mkdir(exist_ok=True)
    for token, path in (("{tmp}", "fresh"), ("{file}", "afile"), ("{dir}", "adir")):
        text = text.replace(token, str(tmp_path / path))
    return text


def _argv(argv: list[str], tmp_path: Path) -> list[str]:
    out = []
    for a in argv:
        a = _paths(a, tmp_path)
        if a.startswith("{toml:"):
            path = tmp_path / "job.toml"
            path.write_text(a.removeprefix("{toml:").removesuffix("}"))
            a = str(path)
        elif a == "{certs}":
            assert main(["certs", "--out", str(tmp_path / "certs")]) == 0
            a = str(tmp_path / "certs")
        out.append(a)
    return out


@pytest.mark.parametrize(("argv", "message"), ROWS, ids=[" ".join(a) for a, _ in ROWS])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in ("NETSENSE_PS", "RANK", "WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    argv = _argv(argv, tmp_path)
    capsys.readouterr()
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's usage errors exit from inside parse_args
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    message = _paths(message, tmp_path)
    assert message in lines[0], lines[0]
    assert lines[0].startswith(f"netsense {argv[0]}: error: ")


def test_certs_force_replaces_the_ca(tmp_path: Path, capsys) -> None:
    d = tmp_path / "certs"
    assert main(["certs", "--out", str(d)]) == 0
    ca = (d / "ca.pem").read_bytes()
    assert main(["certs", "--out", str(d)]) == 2
    assert (d / "ca.pem").read_bytes() == ca  # refused: untouched
    assert main(["certs", "--out", str(d), "--force"]) == 0
    assert (d / "ca.pem").read_bytes() != ca


def test_incomplete_cert_dir_is_not_silently_regenerated(tmp_path: Path) -> None:
    from netsense.devcerts import ensure_certs
    from netsense.errors import ConfigError

    d = tmp_path / "certs"
    assert main(["certs", "--out", str(d)]) == 0
    ca = (d / "ca.pem").read_bytes()
    (d / "secret").unlink()
    with pytest.raises(ConfigError, match="incomplete.*--force"):
        ensure_certs(str(d), create=True)
    assert (d / "ca.pem").read_bytes() == ca


def _shift_clock(monkeypatch, days: float) -> None:
    from netsense import devcerts

    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=days)
    monkeypatch.setattr(devcerts, "_now", lambda: later)


def test_ps_refuses_an_expired_certificate(tmp_path: Path, capsys, monkeypatch) -> None:
    d = tmp_path / "certs"
    assert main(["certs", "--out", str(d), "--days", "1"]) == 0
    _shift_clock(monkeypatch, 2)
    capsys.readouterr()
    assert main(["ps", "--certs", str(d), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expired" in err[0] and "--force" in err[0], err


def test_a_certificate_expiring_within_a_day_is_one_warning(tmp_path: Path, caplog, monkeypatch) -> None:
    from netsense.devcerts import check_cert_dates
    from netsense.transport.tls import CertPaths

    d = tmp_path / "certs"
    assert main(["certs", "--out", str(d), "--days", "1"]) == 0
    paths = CertPaths.in_dir(d)
    with caplog.at_level("WARNING"):
        check_cert_dates(paths)  # 1 day from now, minus the seconds this test took: within a day
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "in under a day" in warnings[0].getMessage()
    caplog.clear()
    assert main(["certs", "--out", str(d), "--force"]) == 0  # 365 days
    with caplog.at_level("WARNING"):
        check_cert_dates(paths)
    assert not caplog.records


def test_summary_json_has_no_nan() -> None:
    import json

    from netsense.launch.jsonout import strict_json

    text = strict_json({"final_loss": float("nan"), "levels": [float("inf"), 1.0], "steps": 0})
    assert json.loads(text) == {"final_loss": None, "levels": [None, 1.0], "steps": 0}
    assert "NaN" not in text


def test_launch_gives_each_process_its_metrics_port() -> None:
    from netsense.config import JobConfig
    from netsense.launch.launcher import Launcher

    launcher = Launcher(JobConfig(servers=2, workers=2), metrics_port=9100, metrics_host="0.0.0.0")
    assert [launcher._metrics_args(i)[1] for i in range(4)] == ["9100", "9101", "9102", "9103"]
    assert launcher._metrics_args(0)[2:] == ["--metrics-host", "0.0.0.0"]
    assert Launcher(JobConfig(), metrics_port=0)._metrics_args(3)[:2] == ["--metrics-port", "0"]
    assert Launcher(JobConfig())._metrics_args(0) == []


@pytest.mark.parametrize("progress", [False, True], ids=["no-progress", "progress-bar"])
def test_launch_refuses_an_expired_certificate_before_starting_anything(tmp_path: Path, capsys, monkeypatch, progress: bool) -> None:
    d = tmp_path / "certs"
    assert main(["certs", "--out", str(d), "--days", "1"]) == 0
    _shift_clock(monkeypatch, 2)
    capsys.readouterr()
    flags = [] if progress else ["--no-progress"]  # the bar is drawn only once the job is checked
    assert main(["launch", "--certs", str(d), *flags, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expired" in err[0], err
    assert not (tmp_path / "run" / "config.json").exists()  # no process was started


def test_worker_checks_the_models_optimizer_before_connecting(tmp_path: Path, capsys, monkeypatch) -> None:
    """A task's own optimizer settings are refused by the PS at INIT; the worker says so first."""
    (tmp_path / "badopt_task.py").write_text(
        "import dataclasses\nfrom netsense.models import load_task\n\n"
        "def factory():\n    return dataclasses.replace(load_task('digits-cnn'), optimizer={'name': 'sgdd'})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    capsys.readouterr()
    # nothing listens on port 1: reaching the connection would be a timeout, not this error
    assert main(["worker", "--insecure", "--ps", "127.0.0.1:1", "--model", "badopt_task:factory"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "optimizer of model 'badopt_task:factory'" in err[0] and "sgdd" in err[0], err


_BAD_MODELS = '''
import dataclasses

from netsense.models import load_task


def raises():
    raise RuntimeError("boom: the data folder is missing")


def wrong_type():
    return {"name": "not a task"}


not_callable = 42
'''

BAD_MODEL_SPECS: list[tuple[str, str]] = [
    ("nosuch", "unknown model 'nosuch'; registered: charlm, digits-cnn"),
    ("no_such_pkg_xyz.mod:task", "cannot load model factory 'no_such_pkg_xyz.mod:task': No module named 'no_such_pkg_xyz'"),
    ("ns_bad_models:missing", "cannot load model factory 'ns_bad_models:missing'"),
    ("ns_bad_models_broken:task", "cannot load model factory 'ns_bad_models_broken:task': ValueError: broken at import"),
    ("ns_bad_models:raises", "model factory 'ns_bad_models:raises' raised RuntimeError: boom: the data folder is missing"),
    ("ns_bad_models:wrong_type", "model factory 'ns_bad_models:wrong_type' returned dict, expected netsense.worker.TrainTask"),
    ("ns_bad_models:not_callable", "model factory 'ns_bad_models:not_callable' is int, not a callable"),
]


@pytest.mark.parametrize(("spec", "message"), BAD_MODEL_SPECS, ids=[s for s, _ in BAD_MODEL_SPECS])
def test_a_bad_model_fails_up_front_with_the_same_line_everywhere(
    spec: str, message: str, tmp_path: Path, capsys, monkeypatch
) -> None:
    """`launch`, `worker` and `bench scenario` resolve --model before any process starts or socket
    opens (issue #16 item 6), with one line that is the same in all three."""
    (tmp_path / "ns_bad_models.py").write_text(_BAD_MODELS)
    (tmp_path / "ns_bad_models_broken.py").write_text("raise ValueError('broken at import')\n")
    monkeypatch.chdir(tmp_path)  # found like a user's own module: from the current folder
    monkeypatch.setattr("sys.path", list(__import__("sys").path))  # load_task adds the cwd: undo it after
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in ("NETSENSE_PS", "RANK", "WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    run = tmp_path / "run"
    commands = {
        "launch": ["launch", "--insecure", "--no-progress", "--run-dir", str(run), "--model", spec],
        # nothing listens on port 1: reaching the connection would be a timeout, not this error
        "worker": ["worker", "--insecure", "--ps", "127.0.0.1:1", "--model", spec],
        "bench": ["bench", "scenario", "--model", spec, "--target-accuracy", "0.5", "--out", str(tmp_path / "bench")],
    }
    details = {}
    for command, argv in commands.items():
        capsys.readouterr()
        assert main(argv) == 2, command
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert "Traceback" not in err and len(lines) == 1, (command, err)
        prefix = f"netsense {argv[0]}: error: "
        assert lines[0].startswith(prefix) and message in lines[0], (command, lines[0])
        details[command] = lines[0].removeprefix(prefix)
    assert len(set(details.values())) == 1, details  # the same words from every command
    assert not (run / "config.json").exists()  # launch started nothing
    assert not (tmp_path / "bench" / "results.json").exists()


def test_launch_checks_the_models_optimizer_before_starting(tmp_path: Path, capsys, monkeypatch) -> None:
    """A task whose own optimizer settings the PS would refuse stops `launch` before the PS starts."""
    (tmp_path / "badopt_launch_task.py").write_text(
        "import dataclasses\nfrom netsense.models import load_task\n\n"
        "def factory():\n    return dataclasses.replace(load_task('digits-cnn'), optimizer={'name': 'sgdd'})\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    capsys.readouterr()
    argv = ["launch", "--insecure", "--no-progress", "--run-dir", str(tmp_path / "run"), "--model", "badopt_launch_task:factory"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "optimizer of model 'badopt_launch_task:factory'" in err[0] and "sgdd" in err[0], err
    assert not (tmp_path / "run" / "config.json").exists()


def _ensure_after(barrier: Any, d: str, out: Any) -> None:
    from netsense.devcerts import ensure_certs
    from netsense.errors import ConfigError

    barrier.wait()
    try:
        paths = ensure_certs(d, create=True)
        out.put(paths.secret.read_text())
    except ConfigError as exc:
        out.put(f"error: {exc}")


def test_processes_that_ensure_the_same_certs_at_once_all_get_one_set(tmp_path: Path) -> None:
    """The shards and relays of a `launch --insecure` start together: unlocked, one refused the
    files another was writing (a CI run: "already holds secret; refusing to overwrite them")."""
    ctx = multiprocessing.get_context("fork")
    n = 6
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_ensure_after, args=(barrier, str(tmp_path / "certs"), out)) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        got = [out.get(timeout=60) for _ in range(n)]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert not [g for g in got if g.startswith("error")], got
    assert len(set(got)) == 1  # one secret, made once


def test_launch_checks_a_summary_inside_its_run_folder_once_it_made_it(tmp_path: Path, monkeypatch) -> None:
    """The README's main job writes its summary into the run folder launch creates: on a fresh
    clone that folder did not exist yet and the up-front check refused the summary path."""
    from netsense.launch.launcher import Launcher

    monkeypatch.setattr(Launcher, "run", lambda self: {"steps": 0})  # the checks, not the job
    run = tmp_path / "runs" / "demo"
    assert main(["launch", "--no-progress", "--run-dir", str(run), "--summary-json", str(run / "summary.json")]) == 0
    assert (run / "summary.json").exists()


def test_a_launch_that_fails_its_checks_leaves_no_temporary_run_folder(tmp_path: Path, capsys, monkeypatch) -> None:
    """Without --run-dir the run folder is a fresh temporary one, made when the job starts: a
    launch refused up front (here an unknown model) left an empty netsense-launch-* folder behind,
    eleven per test-suite run."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(["launch", "--insecure", "--no-progress", "--model", "no_such_module_xyz:factory"]) == 2
    assert "no_such_module_xyz" in capsys.readouterr().err
    assert not list(tmp_path.glob("netsense-launch-*"))
