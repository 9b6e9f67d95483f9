"""The worker's device: validation, the start-up error without CUDA, the training path with an
explicit device, and (on a GPU machine) that only encoded bytes leave the GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from netsense.cli import main
from netsense.compression import make_codec
from netsense.config import load_config
from netsense.errors import ConfigError
from netsense.models import load_task
from netsense.ps.server import ServerSettings
from netsense.worker.device import model_device, parse_device, resolve_device
from netsense.worker.optimizer import NetSenseOptimizer
from netsense.worker.trainer import TrainSettings, build_model, evaluate, train
from tests.conftest import start_ps, stop_ps

HAS_CUDA = torch.cuda.is_available()
skip_without_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
no_cuda = pytest.mark.skipif(HAS_CUDA, reason="a GPU is present: the no-CUDA error cannot happen")


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "expected"), [("cpu", "cpu"), ("cuda", "cuda"), ("cuda:1", "cuda:1")])
def test_device_syntax_accepted(spec: str, expected: str) -> None:
    assert str(parse_device(spec)) == expected
    assert TrainSettings(device=spec).device == spec


@pytest.mark.parametrize("spec", ["gpu", "cuda:x", "mps", "cpu:1", "", "cuda:-1"])
def test_bad_device_strings_rejected(spec: str) -> None:
    with pytest.raises(ValueError, match="device"):
        TrainSettings(device=spec)


def test_bad_device_in_a_config_file_is_a_config_error(tmp_path: Path) -> None:
    cfg = tmp_path / "job.toml"
    cfg.write_text('[train]\ndevice = "tpu"\n')
    with pytest.raises(ConfigError, match="tpu"):
        load_config(cfg)


def test_bad_device_flag_exits_2_with_the_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--device", "gpu", "--insecure", "--ps", "127.0.0.1:9"]) == 2
    assert "'gpu'" in capsys.readouterr().err


# --- CUDA availability --------------------------------------------------------------------------


@no_cuda
def test_cuda_without_cuda_is_a_clear_config_error() -> None:
    with pytest.raises(ConfigError, match="CUDA is not available on this machine.*use --device cpu"):
        resolve_device("cuda")


@no_cuda
def test_worker_with_cuda_fails_at_start_without_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    # Port 9 has no PS: an attempt to connect first would fail with a different message.
    assert main(["worker", "--device", "cuda", "--insecure", "--ps", "127.0.0.1:9", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "CUDA is not available" in err and "Traceback" not in err


@no_cuda
def test_launch_with_cuda_fails_before_any_process_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    assert main(["launch", "--device", "cuda:0", "--no-progress", "--insecure", "--run-dir", str(run_dir)]) == 2
    assert "CUDA is not available" in capsys.readouterr().err
    assert not run_dir.exists()  # nothing was spawned, not even the config written


def test_plain_cuda_spreads_local_ranks_over_the_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [resolve_device("cuda", local_rank=r) for r in range(3)] == [torch.device("cuda", i) for i in (0, 1, 0)]
    assert resolve_device("cuda:1", local_rank=0) == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match="2 CUDA device"):
        resolve_device("cuda:2")
    assert resolve_device("cpu", local_rank=5) == torch.device("cpu")


# --- the training path with an explicit device ----------------------------------------------------


def _train(ps, device: str, steps: int = 3, codec: str = "fp32") -> tuple[torch.nn.Module, NetSenseOptimizer, dict]:  # type: ignore[no-untyped-def]
    task = load_task("digits-cnn")
    model = build_model(task, 0).to(resolve_device(device))
    settings = TrainSettings(steps=steps, eval_every=0, device=device, codec=codec)
    opt = NetSenseOptimizer(model, connect=ps.connect_settings(), rank=0, worker_id="w0", optimizer=task.optimizer, codec=codec)
    try:
        summary = train(task, model, opt, rank=0, world_size=1, settings=settings)
    finally:
        opt.close()
    return model, opt, summary


def _assert_replica_equals_ps(ps, model: torch.nn.Module) -> None:  # type: ignore[no-untyped-def]
    server = ps.call(lambda: {k: v.clone() for k, v in ps.server.store.params.items()})
    for name, p in model.named_parameters():
        assert torch.equal(p.detach().cpu(), server[name]), name


def test_training_on_an_explicit_cpu_device(ps) -> None:  # type: ignore[no-untyped-def]
    model, _, summary = _train(ps, "cpu")
    assert summary["device"] == "cpu" and summary["steps"] == 3 and 0.0 <= summary["test_accuracy"] <= 1.0
    assert model_device(model) == torch.device("cpu")
    _assert_replica_equals_ps(ps, model)


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, skip_without_cuda])]
)
def test_a_gradient_domain_ps_steps_the_replica_as_the_ps(certs, device: str) -> None:  # type: ignore[no-untyped-def]
    """The worker's copy of the PS's optimizer runs on CPU whatever the model's device
    (worker/mirror.py): the replica, on the GPU too, equals the PS bit for bit under a lossy codec."""
    ps = start_ps(certs, ServerSettings(port=0, downlink_domain="gradient"))
    try:
        model, _, _ = _train(ps, device, steps=4, codec="powersgd:2")
        assert all(p.device.type == device for p in model.parameters())
        _assert_replica_equals_ps(ps, model)
    finally:
        stop_ps(ps)


def test_model_device_of_a_model_without_parameters() -> None:
    assert model_device(torch.nn.ReLU()) == torch.device("cpu")


# --- on a GPU ---------------------------------------------------------------------------------


@pytest.mark.cuda
@skip_without_cuda
@pytest.mark.parametrize("codec", ["fp32", "topk:0.05+fp16"])
def test_training_on_cuda_keeps_state_on_the_gpu(ps, codec: str) -> None:  # type: ignore[no-untyped-def]
    model, opt, summary = _train(ps, "cuda", steps=4, codec=codec)
    assert summary["device"] == "cuda:0"
    assert all(p.device.type == "cuda" for p in model.parameters())
    if opt.feedback is not None:  # lossy codec: the residuals stay on the GPU too
        assert all(opt.feedback.residual(s.key).device.type == "cuda" for s in opt.slots)
    _assert_replica_equals_ps(ps, model)  # PARAMS decoded onto the GPU equal the PS exactly
    acc, loss = evaluate(load_task("digits-cnn"), model)  # batches moved to the GPU model
    assert 0.0 <= acc <= 1.0 and loss == loss



def _record_device_to_host(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Bytes of every tensor copied from a GPU to the host through `Tensor.cpu` / `Tensor.to`."""
    moved: list[int] = []
    cpu, to = torch.Tensor.cpu, torch.Tensor.to

    def counted_cpu(self: torch.Tensor, *a: object, **k: object) -> torch.Tensor:
        if self.is_cuda:
            moved.append(self.numel() * self.element_size())
        return cpu(self, *a, **k)  # type: ignore[arg-type]

    def counted_to(self: torch.Tensor, *a: object, **k: object) -> torch.Tensor:
        out = to(self, *a, **k)  # type: ignore[arg-type]
        if self.is_cuda and not out.is_cuda:
            moved.append(out.numel() * out.element_size())
        return out

    monkeypatch.setattr(torch.Tensor, "cpu", counted_cpu)
    monkeypatch.setattr(torch.Tensor, "to", counted_to)
    return moved


@pytest.mark.cuda
@skip_without_cuda
@pytest.mark.parametrize("spec", ["fp32", "fp16", "qsgd:8", "qsgd:4", "topk:0.01+fp16", "topk:0.01+q8"])
def test_encode_on_cuda_copies_only_the_encoded_bytes(spec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    grad = torch.randn(1 << 20, device="cuda")
    codec = make_codec(spec)
    codec.encode(grad)  # warm-up (lazy state, kernels)
    moved = _record_device_to_host(monkeypatch)
    payload = codec.encode(grad)
    wire = sum(len(p) for p in payload.parts)
    assert sum(moved) <= wire + 4096, (spec, moved, wire)  # a few scalars at most besides the payload
    decoded = codec.decode(payload, device=grad.device)
    assert decoded.device == grad.device and decoded.shape == grad.shape


@pytest.mark.slow
def test_launch_with_an_explicit_cpu_device(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    summary = tmp_path / "summary.json"
    argv = ["launch", "--device", "cpu", "--steps", "3", "--eval-every", "0", "--no-progress", "--insecure"]
    assert main([*argv, "--run-dir", str(tmp_path / "run"), "--summary-json", str(summary)]) == 0
    result = json.loads(summary.read_text())
    assert result["device"] == "cpu" and result["steps"] == 3
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["train"]["device"] == "cpu"  # what the workers were started with
