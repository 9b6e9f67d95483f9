"""Generate docs/CONFIG.md from the config dataclasses (field, type, default, docstring).

The reference is derived, never hand-written, so it cannot drift: a test regenerates it and
compares. Run ``python -m netsense.configdoc > docs/CONFIG.md`` after changing a settings class.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing

from netsense.config import RULES, JobConfig


def field_docs(cls: type) -> dict[str, str]:
    """The string literal that follows each field in the class body (attribute docstrings)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _type_name(hint: object) -> str:
    text = getattr(hint, "__name__", None) if not typing.get_args(hint) else None
    return (text or str(hint).replace("typing.", "")).replace("|", "\\|")


def _default(f: dataclasses.Field[object]) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
        return "(table)" if dataclasses.is_dataclass(value) else repr(value)
    return "(required)"


def reference() -> str:
    """The whole reference as markdown."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from the settings dataclasses by `python -m netsense.configdoc`; a test keeps it in sync.",
        "A TOML file (`--config job.toml`) sets any of these; flags override the file. Tables nest as",
        "`[train]`, `[server]`, `[transport]`, `[security]`; sites are an array of tables, `[[sites]]`.",
        "Unknown keys are errors.",
        "",
    ]

    def table(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        docs = field_docs(cls)
        nested = []
        lines.extend([f"## `{prefix or 'top level'}` ({cls.__name__})", "", "| key | type | default | meaning |", "|---|---|---|---|"])
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            if dataclasses.is_dataclass(hint):
                nested.append((hint, f"{prefix}{f.name}"))
                continue
            lines.append(f"| `{prefix}{f.name}` | `{_type_name(hint)}` | `{_default(f)}` | {docs.get(f.name, '')} |")
            item = typing.get_args(hint)[0] if typing.get_origin(hint) is tuple else None
            if dataclasses.is_dataclass(item):  # an array of tables, e.g. [[sites]]
                nested.append((item, f"{prefix}{f.name}[]"))
        lines.append("")
        for sub, name in nested:
            table(sub, f"{name}.")

    table(JobConfig, "")
    lines.extend([
        "## Allowed values",
        "",
        "Checked once, for the file and the flags alike, before any process starts or socket opens: a",
        "bad value is one line naming the flag (or the field) and what is allowed, exit status 2.",
        "Unset (None) always passes. `train.policy` and `server.policy` must build over their ladder,",
        "and each `optimizer` key must pass OptimizerSettings' checks.",
        "",
        "| key | allowed |",
        "|---|---|",
        *(f"| `{path}` | {rule.allowed} |" for path, rule in RULES.items()),
        "",
    ])  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference())
