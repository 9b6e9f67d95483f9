"""The model registry: named tasks, plus ``package.module:factory`` for a user's own.

`digits-cnn` trains on scikit-learn's bundled 8x8 digits (1797 images inside the installed
package: no download) with a fixed, stratified held-out split.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from netsense.errors import ConfigError
from netsense.ps.optim import OptimizerSettings
from netsense.worker.task import TrainTask

log = logging.getLogger(__name__)

_REGISTRY: dict[str, Callable[[], TrainTask]] = {}


def register_model(name: str, factory: Callable[[], TrainTask]) -> None:
    """Make `factory` available as ``--model name``."""
    _REGISTRY[name] = factory


def model_names() -> list[str]:
    return sorted(_REGISTRY)


def load_task(spec: str) -> TrainTask:
    """A registered name, or ``package.module:factory`` returning a `TrainTask`.

    Every way a spec can be wrong (unknown name, a module that does not import, a factory that is
    missing, raises or returns something else) is one `ConfigError` line with the same words in
    `launch`, `worker` and `bench`, so each refuses it before any process starts (`check_model`)."""
    factory = _REGISTRY.get(spec) or _import_factory(spec)
    if not callable(factory):
        raise ConfigError(f"model factory {spec!r} is {type(factory).__name__}, not a callable returning a TrainTask")
    try:
        task = factory()
    except ConfigError:
        raise  # already one line that says what is wrong (a built-in task's missing file)
    except Exception as exc:  # noqa: BLE001 - a user's factory may raise anything; say what, in one line
        log.debug("model factory %r failed", spec, exc_info=True)  # -vv: the traceback
        raise ConfigError(f"model factory {spec!r} raised {_one_line(exc)}") from exc
    if not isinstance(task, TrainTask):
        raise ConfigError(f"model factory {spec!r} returned {type(task).__name__}, expected netsense.worker.TrainTask")
    return task


def check_model(spec: str, optimizer: Mapping[str, Any] | None = None) -> TrainTask:
    """`load_task(spec)` with the task's optimizer settings (under the config's `optimizer`
    overrides) checked as the PS would at INIT: what `launch` runs before it starts anything.

    The factory runs under a forked torch RNG, so checking leaves the caller's seeds as they were."""
    with torch.random.fork_rng(devices=[]):
        task = load_task(spec)
    task_optimizer(task, spec, optimizer)
    return task


def task_optimizer(task: TrainTask, spec: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The PS optimizer settings of `task` under `overrides`, validated; `ConfigError` names the
    model (the PS would refuse them only at INIT, after the connection)."""
    merged = {**task.optimizer, **(overrides or {})}
    try:
        OptimizerSettings.from_dict(merged)
    except ConfigError as exc:
        raise ConfigError(f"optimizer of model {spec!r} (with the config's overrides): {exc}") from None
    return merged


def _import_factory(spec: str) -> object:
    if ":" not in spec:
        raise ConfigError(f"unknown model {spec!r}; registered: {', '.join(model_names())}; or use package.module:factory")
    module_name, _, attr = spec.partition(":")
    cwd = _import_from_cwd()
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"cannot load model factory {spec!r}: {exc} (modules are found in the current directory {cwd} "
            "and on PYTHONPATH; run from the folder that holds the package, or set PYTHONPATH)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - the module itself fails at import (its own bug)
        log.debug("importing %r failed", module_name, exc_info=True)
        raise ConfigError(f"cannot load model factory {spec!r}: {_one_line(exc)} (raised while importing {module_name!r})") from exc


def _one_line(exc: BaseException) -> str:
    """``Type: message`` with the message's line breaks folded, for a one-line error."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _import_from_cwd() -> str:
    """Put the current directory on sys.path, as ``python -m`` does and the console script does not,
    so `launch`, `worker` and `bench` resolve ``--model pkg.mod:factory`` from the same folders."""
    cwd = os.getcwd()
    if not any(os.path.abspath(p or ".") == cwd for p in sys.path):
        sys.path.insert(0, cwd)
    return cwd


class DigitsCNN(nn.Module):
    """A small CNN for 8x8 digits (~12k parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def digits_cnn() -> TrainTask:
    """scikit-learn's digits, 80/20 stratified split with a fixed seed."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    idx_train, idx_test = train_test_split(range(len(y)), test_size=0.2, random_state=0, stratify=digits.target)
    return TrainTask(
        name="digits-cnn",
        build_model=DigitsCNN,
        train_inputs=x[idx_train],
        train_targets=y[idx_train],
        test_inputs=x[idx_test],
        test_targets=y[idx_test],
        batch_size=32,
        optimizer={"name": "sgd", "lr": 0.05, "momentum": 0.9},
        steps=300,
    )


register_model("digits-cnn", digits_cnn)


# --- charlm: next-character prediction on the standard library's own source ----------------------

CHARLM_FILES = ("argparse.py", "difflib.py", "textwrap.py", "string.py", "dataclasses.py", "functools.py")
"""Standard-library modules whose text is the corpus (present in every CPython 3.x install)."""
CHARLM_SEQ_LEN = 64
CHARLM_VOCAB = "\t\n" + "".join(chr(c) for c in range(32, 127))
"""Tab, newline and printable ASCII; anything else maps to one extra "unknown" index."""
_CHARLM_TEST_SEQS = 256


def charlm_corpus() -> str:
    """The concatenated text of `CHARLM_FILES` from this interpreter's standard library.

    The text differs between Python versions, so figures are comparable on one interpreter only.
    """
    import sysconfig
    from pathlib import Path

    root = Path(sysconfig.get_paths()["stdlib"])
    parts = [(root / name).read_text(encoding="utf-8") for name in CHARLM_FILES if (root / name).is_file()]
    if not parts:
        raise ConfigError(f"charlm: none of {CHARLM_FILES} found under {root}")
    return "\n".join(parts)


def encode_text(text: str) -> torch.Tensor:
    """Character indices (int64) in `CHARLM_VOCAB`, unknown characters as len(CHARLM_VOCAB)."""
    table = {ch: i for i, ch in enumerate(CHARLM_VOCAB)}
    unknown = len(CHARLM_VOCAB)
    return torch.tensor([table.get(ch, unknown) for ch in text], dtype=torch.long)


class CharGRU(nn.Module):
    """Embedding -> one GRU layer -> per-position logits (~75k parameters at hidden 128)."""

    def __init__(self, vocab: int = len(CHARLM_VOCAB) + 1, embed: int = 32, hidden: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.rnn = nn.GRU(embed, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(x))
        return self.head(out)


def sequence_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every position of (batch, length, vocab) logits."""
    return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def sequence_accuracy(output: torch.Tensor, target: torch.Tensor) -> float:
    """Next-character accuracy over every position."""
    return (output.argmax(dim=-1) == target).float().mean().item()


def charlm() -> TrainTask:
    """Char-level GRU; train on the first 90 % of the corpus, test on 256 windows of the last 10 %.

    The split is contiguous (no window straddles it), so the test text is never seen in training.
    """
    ids = encode_text(charlm_corpus())
    cut = int(len(ids) * 0.9)
    n = CHARLM_SEQ_LEN

    def windows(seq: torch.Tensor, limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        count = (len(seq) - 1) // n
        if limit is not None:
            count = min(count, limit)
        x = seq[: count * n].reshape(count, n)
        y = seq[1 : count * n + 1].reshape(count, n)
        return x, y

    train_x, train_y = windows(ids[:cut])
    test_x, test_y = windows(ids[cut:], _CHARLM_TEST_SEQS)
    return TrainTask(
        name="charlm",
        build_model=CharGRU,
        train_inputs=train_x,
        train_targets=train_y,
        test_inputs=test_x,
        test_targets=test_y,
        loss=sequence_loss,
        accuracy=sequence_accuracy,
        batch_size=32,
        optimizer={"name": "adam", "lr": 0.003},
        steps=400,
    )


register_model("charlm", charlm)


# --- resnet18-synth: ResNet-18-sized model on learnable synthetic CIFAR-shaped data ---------------


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (He et al. 2016)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = nn.functional.relu(self.bn1(self.conv1(x)))
        return nn.functional.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 for 32x32 inputs (3x3 stem, no max-pool): 11.17M parameters with 10 classes."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        layers: list[nn.Module] = []
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1))


def synthetic_images(n_train: int = 4096, n_test: int = 512, classes: int = 10, seed: int = 1234) -> tuple[torch.Tensor, ...]:
    """Gaussian 3x32x32 images labelled by a fixed random linear teacher on their 8x8 average-pooled
    pixels: a deterministic, learnable target (a convnet can represent it exactly) with no download."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_train + n_test, 3, 32, 32, generator=g)
    teacher = torch.randn(3 * 8 * 8, classes, generator=g)
    y = (nn.functional.avg_pool2d(x, 4).flatten(1) @ teacher).argmax(dim=1)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def resnet18_synth() -> TrainTask:
    """ResNet-18 (~11M parameters, ~45 MB of fp32 gradient per step): the bandwidth-bound regime."""
    train_x, train_y, test_x, test_y = synthetic_images()
    return TrainTask(
        name="resnet18-synth",
        build_model=ResNet18,
        train_inputs=train_x,
        train_targets=train_y,
        test_inputs=test_x,
        test_targets=test_y,
        batch_size=16,
        optimizer={"name": "sgd", "lr": 0.05, "momentum": 0.9},
        steps=300,
    )


register_model("resnet18-synth", resnet18_synth)


# --- wide-mlp: a bandwidth-bound model on the digits ----------------------------------------------


class WideMLP(nn.Module):
    """64 -> 544 -> 544 -> 10 (337,290 parameters, 1.35 MB of fp32 gradient, ~1 ms of CPU per step).

    Over 1 MiB of gradient: DDP splits it into two buckets (its first bucket is capped at 1 MiB),
    the case in which torch's PowerSGD hook issued collectives out of order (`netsense.bench.ddp_baseline`).
    """

    def __init__(self, hidden: int = 544) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def wide_mlp() -> TrainTask:
    """`digits_cnn`'s data, split and optimizer with 28x the parameters: the all-reduce dominates a step."""
    import dataclasses

    return dataclasses.replace(digits_cnn(), name="wide-mlp", build_model=WideMLP)


register_model("wide-mlp", wide_mlp)
