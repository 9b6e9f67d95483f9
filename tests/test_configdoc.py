"""docs/CONFIG.md is exactly what the config dataclasses generate, and every field is documented."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from netsense.config import JobConfig
from netsense.configdoc import field_docs, reference

DOC = Path(__file__).resolve().parents[1] / "docs" / "CONFIG.md"


def test_reference_is_in_sync() -> None:
    assert DOC.read_text().strip() == reference().strip(), "run: python -m netsense.configdoc > docs/CONFIG.md"


def test_every_field_has_a_docstring() -> None:
    def walk(cls: type) -> None:
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            assert f.name in docs, f"{cls.__name__}.{f.name} has no docstring"
            if dataclasses.is_dataclass(f.type) or (f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory())):  # type: ignore[misc]
                walk(type(f.default_factory()))  # type: ignore[misc]

    walk(JobConfig)


def test_every_rule_names_a_real_field() -> None:
    """A rule for a renamed or mistyped field would silently check nothing."""
    from netsense.config import RULES

    config = JobConfig()
    for path in RULES:
        obj = config
        for part in path.split("."):
            assert hasattr(obj, part), f"RULES[{path!r}] names no field"
            obj = getattr(obj, part)
