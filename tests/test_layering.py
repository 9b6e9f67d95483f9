"""The layers import one way (docs/ARCHITECTURE.md, "Layers"), checked on the source with `ast`.

compression <- transport <- ps, worker <- netsense: a lower layer never imports a higher one, ps and
worker never import each other, and compression stays pure (no asyncio, no aioquic). Module-level
and function-local imports count alike, so an import hidden inside a function cannot bend the rule.
`netsense/errors.py` imports nothing from the project, so every layer may raise its exceptions.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LAYERS: dict[str, str] = {
    "compression": "netsense.compression",
    "transport": "netsense.transport",
    "ps": "netsense.ps",
    "worker": "netsense.worker",
    "netsense": "netsense",
}
"""Source folder -> the package it installs as (pyproject's package-dir)."""

ALLOWED: dict[str, tuple[str, ...] | None] = {
    "compression": ("netsense.errors", "netsense.compression"),
    "transport": ("netsense.errors", "netsense.compression", "netsense.transport"),
    "ps": ("netsense.errors", "netsense.compression", "netsense.transport", "netsense.ps"),
    "worker": ("netsense.errors", "netsense.compression", "netsense.transport", "netsense.worker"),
    "netsense": None,  # the top package (CLI, config, launcher, benchmarks) may import anything
    # The two files every layer depends on: anything more would pull a layer in behind them.
    "netsense/errors.py": (),
    "netsense/__init__.py": ("netsense.errors",),
}
"""Project modules each layer may import (a module or anything below it); None: no limit."""

FORBIDDEN_THIRD_PARTY: dict[str, tuple[str, ...]] = {"compression": ("asyncio", "aioquic")}
"""Outside modules a layer must not import: the codecs and policies are sans-I/O."""


def module_name(path: str) -> str:
    """``compression/policy/x.py`` -> ``netsense.compression.policy.x`` (an ``__init__`` is its package)."""
    parts = path.removesuffix(".py").split("/")
    parts[0] = LAYERS[parts[0]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(tree: ast.AST, path: str) -> list[tuple[int, str]]:
    """(line, dotted target) of every import anywhere in `tree`, relative ones resolved.

    ``from a import b`` yields ``a.b``: `b` may be a submodule (``from netsense import errors``),
    and a name re-exported by a package is judged as part of that package."""
    module = module_name(path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source == "__future__":
                continue
            out += [(node.lineno, f"{source}.{alias.name}" if alias.name != "*" else source) for alias in node.names]
    return out


def _within(target: str, prefixes: tuple[str, ...]) -> bool:
    return any(target == p or target.startswith(p + ".") for p in prefixes)


def rule_for(path: str) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    """(allowed project prefixes or None, forbidden outside modules) of the file at `path`."""
    layer = path.split("/")[0]
    allowed = ALLOWED[path] if path in ALLOWED else ALLOWED[layer]
    return allowed, FORBIDDEN_THIRD_PARTY.get(layer, ())


def violations(source: str, path: str) -> list[str]:
    """``path:line: ...`` for every import in `source` (the file at repo-relative `path`) that breaks its layer's rule."""
    allowed, forbidden = rule_for(path)
    layer = path.split("/")[0]
    problems = []
    for line, target in imported(ast.parse(source, path), path):
        top = target.split(".")[0]
        if top == "netsense" and allowed is not None and not _within(target, allowed):
            may = ", ".join(allowed) or "nothing from the project"
            problems.append(f"{path}:{line}: imports {target}; {layer} may import only {may}")
        elif top in forbidden:
            problems.append(f"{path}:{line}: imports {target}; {layer} must not import {' or '.join(forbidden)}")
    return problems


def source_files() -> list[str]:
    """Repo-relative paths of every .py file of the five layers (links are not followed)."""
    files = []
    for layer in LAYERS:
        for folder, dirs, names in os.walk(ROOT / layer):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            files += [Path(folder, n).relative_to(ROOT).as_posix() for n in sorted(names) if n.endswith(".py")]
    return files


def test_every_layer_imports_one_way() -> None:
    files = source_files()
    assert len(files) > 40 and {f.split("/")[0] for f in files} == set(LAYERS)
    problems = [p for f in files for p in violations((ROOT / f).read_text(), f)]
    assert not problems, "layering violations:\n" + "\n".join(problems)


# --- the checker itself: it must be able to fail ------------------------------------------------


@pytest.mark.parametrize(
    ("path", "source"),
    [
        ("compression/policy.py", "import asyncio\n"),
        ("compression/policy.py", "from aioquic.quic.connection import QuicConnection\n"),
        ("compression/policy.py", "from netsense.transport import wire\n"),
        ("compression/policy.py", "from netsense import config\n"),
        ("compression/policy.py", "def f():\n    from netsense.config import JobConfig\n"),
        ("compression/sub/x.py", "from ...transport.wire import decode_message\n"),
        ("transport/wire.py", "from netsense.ps.server import PSServer\n"),
        ("ps/server.py", "from netsense.worker.client import PSClient\n"),
        ("ps/server.py", "import netsense.config\n"),
        ("worker/client.py", "from ..ps import store\n"),
        ("worker/trainer.py", "class T:\n    def m(self):\n        from netsense.models import load_task\n"),
        ("netsense/errors.py", "from netsense.config import JobConfig\n"),
        ("netsense/__init__.py", "from .cli import main\n"),
    ],
)
def test_checker_flags_a_bad_import(path: str, source: str) -> None:
    problems = violations(source, path)
    assert len(problems) == 1
    line = source.count("\n", 0, source.index("import"))
    assert problems[0].startswith(f"{path}:{line + 1}: imports ")


@pytest.mark.parametrize(
    ("path", "source"),
    [
        ("compression/policy.py", "from __future__ import annotations\nimport torch\nfrom netsense.errors import CompressionError\n"),
        ("compression/policy.py", "from .base import Codec\nfrom netsense import errors\nimport netsense.compression.ladder\n"),
        ("transport/wire.py", "from netsense.compression import make_codec\nimport asyncio\nimport aioquic\n"),
        ("ps/server.py", "from netsense.transport.wire import decode_message\nfrom . import store\n"),
        ("worker/sub/x.py", "from ..client import PSClient\nfrom ...transport import wire\n"),
        ("netsense/cli/ps.py", "from netsense.ps.server import PSServer\nfrom netsense.worker import TrainTask\n"),
        ("netsense/__init__.py", "from .errors import ConfigError\n"),
    ],
)
def test_checker_passes_an_allowed_import(path: str, source: str) -> None:
    assert violations(source, path) == []
