"""The `charlm` and `resnet18-synth` tasks of `netsense.models`."""

from __future__ import annotations

import torch

from netsense.models import (
    CHARLM_SEQ_LEN,
    CHARLM_VOCAB,
    ResNet18,
    charlm_corpus,
    encode_text,
    load_task,
    model_names,
    sequence_accuracy,
    sequence_loss,
    synthetic_images,
)


def test_both_are_registered() -> None:
    assert {"charlm", "resnet18-synth", "digits-cnn"} <= set(model_names())


def test_charlm_split_and_shapes() -> None:
    task = load_task("charlm")
    assert task.train_inputs.shape[1] == CHARLM_SEQ_LEN and task.train_inputs.dtype == torch.long
    assert len(task.test_inputs) == 256 and len(task.train_inputs) > 1000
    # Targets are the inputs shifted by one character.
    assert torch.equal(task.train_inputs[0, 1:], task.train_targets[0, :-1])
    ids = encode_text(charlm_corpus())
    cut = int(len(ids) * 0.9)
    # Held out: the test windows are the text after the cut, never seen in training.
    assert torch.equal(task.test_inputs[0], ids[cut : cut + CHARLM_SEQ_LEN])
    assert int(task.train_inputs.max()) <= len(CHARLM_VOCAB)


def test_encode_text_maps_unknown_characters() -> None:
    assert encode_text("a\n\u00e9").tolist() == [CHARLM_VOCAB.index("a"), CHARLM_VOCAB.index("\n"), len(CHARLM_VOCAB)]


def test_charlm_model_learns_a_batch() -> None:
    torch.manual_seed(0)
    task = load_task("charlm")
    model = task.build_model()
    x, y = task.train_inputs[:4, :16], task.train_targets[:4, :16]
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    first = None
    for _ in range(8):
        loss = sequence_loss(model(x), y)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first
    out = model(x)
    assert out.shape == (4, 16, len(CHARLM_VOCAB) + 1)
    assert 0.0 <= sequence_accuracy(out, y) <= 1.0


def test_resnet18_size_and_forward() -> None:
    model = ResNet18()
    n = sum(p.numel() for p in model.parameters())
    assert 11_000_000 < n < 11_300_000  # torchvision's CIFAR ResNet-18: 11.17M
    model.eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_synthetic_images_are_deterministic_and_learnable() -> None:
    a = synthetic_images(n_train=256, n_test=64)
    b = synthetic_images(n_train=256, n_test=64)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    train_x, train_y, _, _ = a
    assert train_x.shape == (256, 3, 32, 32) and len(set(train_y.tolist())) >= 5
    # The labels are a linear function of pooled pixels: least squares on them beats chance by far.
    feats = torch.nn.functional.avg_pool2d(train_x, 4).flatten(1)
    onehot = torch.nn.functional.one_hot(train_y, 10).float()
    w = torch.linalg.lstsq(feats, onehot).solution
    assert ((feats @ w).argmax(1) == train_y).float().mean() > 0.5
    task = load_task("resnet18-synth")
    assert task.train_inputs.shape[1:] == (3, 32, 32) and len(task.test_inputs) == 512


# --- `--model package.module:factory` resolves from the current directory --------------------------

_OWN_MODULE = '''
import torch
from netsense.worker import TrainTask


def task() -> TrainTask:
    x = torch.randn(8, 3)
    return TrainTask("cwd-task", lambda: torch.nn.Linear(3, 2), x, x[:, 0].long().abs() % 2, x, x[:, 0].long().abs() % 2)
'''


def test_model_module_resolves_from_the_current_directory(tmp_path, monkeypatch) -> None:
    """The `netsense` console script does not put the current folder on sys.path (``python -m``
    does): `worker` and `bench` must find ``mypkg.mod:task`` where `launch` finds it."""
    pkg = tmp_path / "mypkg_cwd_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(_OWN_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", ".", str(tmp_path))])
    task = load_task("mypkg_cwd_probe.mod:task")
    assert task.name == "cwd-task"


def test_unknown_model_module_names_the_folders_searched(tmp_path, monkeypatch) -> None:
    import pytest

    from netsense.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))  # load_task adds the cwd: undo it after
    with pytest.raises(ConfigError, match="current directory"):
        load_task("no_such_pkg_xyz.mod:task")
