"""Atomic checkpoints of the store: exact round trip, corrupt files skipped, old ones pruned."""

from __future__ import annotations

import io
import pickle

import pytest
import torch

from netsense.compression import make_codec
from netsense.errors import ConfigError
from netsense.ps import checkpoint
from netsense.ps.store import ParameterStore
from netsense.transport.wire import Push

pytestmark = pytest.mark.reliability
FP32 = make_codec("fp32")


def _store(opt: dict) -> ParameterStore:
    torch.manual_seed(0)
    s = ParameterStore()
    s.initialize({"w": FP32.encode(torch.randn(4, 3)), "b": FP32.encode(torch.randn(3))}, opt)
    s.join("a")
    s.join("b")
    return s


def _step(s: ParameterStore, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for w in ("a", "b"):
        grads = {k: FP32.encode(torch.randn(v.shape, generator=g)) for k, v in s.params.items()}
        s.push(w, Push(s.version, 4, 2, grads))


@pytest.mark.parametrize("opt", [{"name": "sgd", "lr": 0.1, "momentum": 0.9}, {"name": "adam", "lr": 0.01}])
def test_restored_store_continues_bit_identically(tmp_path, opt) -> None:
    ref, crashed = _store(opt), _store(opt)
    for i in range(5):
        _step(ref, i)
        _step(crashed, i)
    path = checkpoint.save(tmp_path, crashed.state())
    assert path.name == "ckpt-000000000005.nsckpt" and not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*"))
    state, found = checkpoint.load_latest(tmp_path)
    restored = ParameterStore()
    restored.restore(state)
    assert found == path and restored.version == 5 and restored.applied_steps == 5 and restored.live == {"a", "b"}
    for i in range(5, 10):
        _step(ref, i)
        _step(restored, i)
    for k in ref.params:
        assert torch.equal(ref.params[k], restored.params[k]), k
    assert restored.pull(-1).full and restored.version == 10


def test_corrupt_or_truncated_newest_falls_back_to_previous(tmp_path) -> None:
    s = _store({"name": "sgd", "lr": 0.1})
    checkpoint.save(tmp_path, s.state())
    _step(s, 0)
    newest = checkpoint.save(tmp_path, s.state())
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])  # a crash mid-write cannot do this (rename), a disk can
    state, path = checkpoint.load_latest(tmp_path)
    assert state["version"] == 0 and path.name.endswith("000000.nsckpt")
    flipped = bytearray(data)
    flipped[-10] ^= 0xFF
    newest.write_bytes(bytes(flipped))
    assert checkpoint.load_latest(tmp_path)[0]["version"] == 0


def test_only_the_last_k_are_kept_and_missing_dir_is_a_clear_error(tmp_path) -> None:
    s = _store({"name": "sgd", "lr": 0.1})
    for i in range(6):
        checkpoint.save(tmp_path, s.state(), keep=2)
        _step(s, i)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["ckpt-000000000005.nsckpt", "ckpt-000000000004.nsckpt"]
    with pytest.raises(ConfigError, match="no valid checkpoint"):
        checkpoint.load_latest(tmp_path / "empty")


def test_the_name_does_not_promise_torch_load_and_old_pt_checkpoints_still_resume(tmp_path) -> None:
    """Issue #16: a checkpoint named ``.pt`` was not a file `torch.load` reads (header + digest).
    New ones are ``.nsckpt``; those written under the old name are still found, newest first, and
    pruned with the rest."""
    s = _store({"name": "sgd", "lr": 0.1})
    path = checkpoint.save(tmp_path, s.state())
    assert path.suffix == ".nsckpt" and not list(tmp_path.glob("*.pt"))
    with pytest.raises(Exception):
        torch.load(path, weights_only=True)  # still not a torch file: only the name changed
    for i in range(2):  # versions 0 and 1 as an older PS left them
        old = tmp_path / f"ckpt-{s.version:012d}.pt"
        checkpoint.save(tmp_path, s.state()).rename(old)
        _step(s, i)
    state, found = checkpoint.load_latest(tmp_path)
    assert found.name == "ckpt-000000000001.pt" and state["version"] == 1  # what --resume restores
    restored = ParameterStore()
    restored.restore(state)
    assert restored.version == 1 and all(torch.equal(restored.params[k], v) for k, v in _params_at(1).items())
    newest = checkpoint.save(tmp_path, s.state(), keep=2)  # version 2, the new name
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == [newest.name, "ckpt-000000000001.pt"]
    again = checkpoint.save(tmp_path, checkpoint.load(found), keep=3)  # version 1 rewritten: supersedes the .pt
    assert again.name == "ckpt-000000000001.nsckpt" and not (tmp_path / "ckpt-000000000001.pt").exists()


def _params_at(version: int) -> dict[str, torch.Tensor]:
    s = _store({"name": "sgd", "lr": 0.1})
    for i in range(version):
        _step(s, i)
    return s.params


class _Evil:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (print, ("pwned",))


def test_a_pickle_with_code_is_refused_even_with_a_valid_digest(tmp_path) -> None:
    import hashlib

    buf = io.BytesIO()
    torch.save({"version": 1, "x": _Evil()}, buf, pickle_module=pickle)
    body = buf.getvalue()
    path = checkpoint.checkpoint_path(tmp_path, 1)
    path.write_bytes(checkpoint.MAGIC + hashlib.sha256(body).digest() + body)
    with pytest.raises(Exception, match="(?i)weights|unsupported|global"):
        checkpoint.load(path)
    with pytest.raises(ConfigError):
        checkpoint.load_latest(tmp_path)


def test_ps_resume_without_a_checkpoint_is_a_clear_error(tmp_path, certs, capsys) -> None:
    from netsense.cli import main

    rc = main(["ps", "--port", "0", "--certs", str(certs.ca.parent), "--resume", str(tmp_path / "none")])
    assert rc == 2
    assert "no valid checkpoint" in capsys.readouterr().err


def test_a_rejoin_discards_the_partial_push_of_the_old_connection() -> None:
    s = _store({"name": "sgd", "lr": 0.1})
    s.push("a", Push(0, 4, 2, {"w": FP32.encode(torch.zeros(4, 3))}))
    s.join("a")  # the worker reconnected: it will push the whole step again
    s.push("a", Push(0, 4, 2, {"w": FP32.encode(torch.zeros(4, 3)), "b": FP32.encode(torch.zeros(3))}))
    assert s.version == 0 and s._core.complete("a")  # no keys applied ahead here: the whole step
