"""Job identity: a PS that holds one job's state refuses a worker of another job with a clear error,
unless it asks to resume; a resumed job says so; the id survives a checkpoint."""

from __future__ import annotations

import logging

import pytest
import torch

from netsense.errors import ConfigError, ProtocolError
from netsense.ps.server import ServerSettings
from netsense.ps.store import ParameterStore
from netsense.transport.wire import Hello, Welcome, decode_message, encode_message
from netsense.worker.optimizer import NetSenseOptimizer

from tests.conftest import RunningPS, start_ps, stop_ps


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2)


def _steps(opt: NetSenseOptimizer, model: torch.nn.Module, n: int) -> None:
    for _ in range(n):
        opt.zero_grad()
        model(torch.ones(3, 4)).sum().backward()
        opt.step(samples=3)


def _opt(ps: RunningPS, model: torch.nn.Module, job: str, *, resume: bool = False, wid: str = "w0") -> NetSenseOptimizer:
    return NetSenseOptimizer(
        model, connect=ps.connect_settings(job_id=job, resume=resume), worker_id=wid, optimizer={"name": "sgd", "lr": 0.1}
    )


@pytest.fixture
def job_ps(certs):  # type: ignore[no-untyped-def]
    ps = start_ps(certs, ServerSettings(port=0, barrier_timeout_s=2.0))
    yield ps
    stop_ps(ps)


def test_a_new_job_is_refused_by_a_ps_holding_another(job_ps: RunningPS) -> None:
    model = _model()
    with _opt(job_ps, model, "job-a") as opt:
        _steps(opt, model, 3)
    assert job_ps.server.store.job_id == "job-a"
    fresh = _model()
    before = fresh.weight.detach().clone()
    with pytest.raises(ConfigError) as err:
        _opt(job_ps, fresh, "job-b", wid="w0")  # the same model, a new run: it must not continue job-a
    msg = str(err.value)
    assert "job-a" in msg and "job-b" in msg and "version 3" in msg and "--resume" in msg
    assert torch.equal(fresh.weight, before)  # nothing of the old job was pulled into the model
    assert job_ps.server.store.version == 3


def test_resume_continues_the_held_job_and_says_so(job_ps: RunningPS, caplog: pytest.LogCaptureFixture) -> None:
    model = _model()
    with _opt(job_ps, model, "job-a") as opt:
        _steps(opt, model, 2)
    caplog.set_level(logging.WARNING)
    again = _model()
    with _opt(job_ps, again, "job-a2", resume=True) as opt:
        assert opt.version == 2  # continues from the PS's state
        assert torch.equal(again.weight, model.weight)
        _steps(opt, again, 1)
    assert job_ps.server.store.version == 3 and job_ps.server.store.job_id == "job-a"
    text = caplog.text
    assert "resuming job job-a at version 2" in text  # the PS and the worker both say it


def test_the_same_job_reconnecting_is_accepted(job_ps: RunningPS) -> None:
    model = _model()
    with _opt(job_ps, model, "job-a") as opt:
        _steps(opt, model, 1)
    with _opt(job_ps, _model(), "job-a") as opt:
        assert opt.version == 1


def test_job_id_survives_a_checkpoint() -> None:
    from netsense.compression import make_codec

    store = ParameterStore()
    store.initialize({"w": make_codec("fp32").encode(torch.zeros(3))}, {"name": "sgd", "lr": 0.1}, job_id="job-a")
    restored = ParameterStore()
    restored.restore(store.state())
    assert restored.job_id == "job-a"


def test_hello_and_welcome_carry_the_job_and_validate_it() -> None:
    hello = Hello("w0", 0, bytes(32), job_id="digits-cnn-s0-1a2b", resume=True)
    assert decode_message(encode_message(hello)) == hello
    old = Hello("w0", 0, bytes(32))
    assert b"job_id" not in encode_message(old)  # unchanged bytes for a peer without a job id
    assert decode_message(encode_message(Welcome(3, True, 1, -1, "job-a"))).job_id == "job-a"
    with pytest.raises(ProtocolError) as err:
        decode_message(encode_message(Hello("w0", 0, bytes(32), job_id="bad id with spaces")))
    assert err.value.code == "malformed"


def test_job_id_resolution_order() -> None:
    from netsense.launch.env import resolve_job_id

    assert resolve_job_id("digits-cnn", 3, "mine", random_part=True, env={"NETSENSE_JOB_ID": "env"}) == "mine"
    assert resolve_job_id("digits-cnn", 3, "", random_part=True, env={"NETSENSE_JOB_ID": "env"}) == "env"
    assert resolve_job_id("digits-cnn", 3, "", random_part=False, env={}) == "digits-cnn-s3"  # every rank agrees
    assert resolve_job_id("digits-cnn", 3, "", random_part=False, env={"SLURM_JOB_ID": "4242"}) == "digits-cnn-s3-4242"
    assert resolve_job_id("m", 0, "", random_part=False, env={"TORCHELASTIC_RUN_ID": "none"}) == "m-s0"  # torchrun standalone
    a, b = (resolve_job_id("pkg/mod:f", 0, "", random_part=True, env={}) for _ in range(2))
    assert a != b and a.startswith("pkg_mod:f-s0-")  # launch: a new id per run


@pytest.mark.slow  # two launches, ~75 s on 2 busy cores
def test_launch_resume_continues_the_checkpointed_job(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import os
    import subprocess
    import sys

    from netsense.ps import checkpoint

    ckpt = tmp_path / "ckpt"
    cfg = tmp_path / "job.toml"
    cfg.write_text(f'[server]\ncheckpoint_dir = "{ckpt}"\ncheckpoint_every_steps = 1\n[train]\neval_every = 0\n')
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("NETSENSE_JOB_ID", None)

    def launch(steps: int, *extra: str) -> dict:  # type: ignore[type-arg]
        out = subprocess.run(
            [sys.executable, "-m", "netsense", "launch", "--no-progress", "--config", str(cfg), "--steps", str(steps),
             "--run-dir", str(tmp_path / f"run{steps}"), *extra],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout[out.stdout.index("{") :])

    launch(3)
    first, _ = checkpoint.load_latest(ckpt)
    assert first["job_id"].startswith("digits-cnn-s0-")  # launch's id: model, seed and a random part
    launch(5, "--resume")  # a new random id, but it asks to resume: the PS restores and continues
    last, _ = checkpoint.load_latest(ckpt)
    assert last["version"] == 5 and last["job_id"] == first["job_id"]
