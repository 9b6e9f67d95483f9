"""docs/ARCHITECTURE.md's module map ("Where things live") names every module of the tree, and
every folder it names exists: a newcomer reads the map, so a module added or moved without it
fails here."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_docs_citations import repo_files

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("compression", "transport", "ps", "worker", "netsense")


def module_map(text: str) -> dict[str, str]:
    """Folder -> the words the map gives it (its line and the indented lines under it)."""
    block = text.split("**Where things live.**", 1)[1].split("```", 2)[1]
    folders: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        m = re.match(r"^(\S+/)\s+(.*)$", line)
        if m:
            current = m.group(1).rstrip("/")
            folders[current] = m.group(2)
        elif current is not None and line.strip():
            folders[current] += " " + line.strip()
    return folders


def package_dirs() -> list[Path]:
    return sorted(p.parent for top in PACKAGES for p in (ROOT / top).rglob("__init__.py"))


def test_every_package_folder_is_mapped_and_every_mapped_folder_exists() -> None:
    mapped = module_map((ROOT / "docs" / "ARCHITECTURE.md").read_text())
    found = {str(d.relative_to(ROOT)) for d in package_dirs()}
    assert set(mapped) == found, f"unmapped: {sorted(found - set(mapped))}; gone: {sorted(set(mapped) - found)}"


def test_every_module_is_named_under_its_folder() -> None:
    mapped = module_map((ROOT / "docs" / "ARCHITECTURE.md").read_text())
    missing = []
    for folder in package_dirs():
        words = set(re.findall(r"[a-z0-9_]+", mapped.get(str(folder.relative_to(ROOT)), "")))
        for module in sorted(folder.glob("*.py")):
            if module.stem not in ("__init__", "__main__") and module.stem not in words:
                missing.append(str(module.relative_to(ROOT)))
    assert not missing, f"docs/ARCHITECTURE.md, 'Where things live', does not name: {missing}"


def test_the_map_parser_sees_a_missing_module() -> None:
    text = "**Where things live.**\n```\nps/    server, optim\n       store\n```\n"
    assert module_map(text) == {"ps": "server, optim store"}


def test_no_file_cites_documents_outside_the_repo() -> None:
    """A user's clone has only the repo: design notes the code needs live in docs/ (the names are
    built here so that this file does not cite them itself)."""
    outside = re.compile("|".join(re.escape(n) for n in ("DESIGN" + ".md", "TRANSPORT-FACTS" + ".md", "../" + "shared")))
    cites = []
    for path in repo_files((".py", ".md", ".toml", ".sh", ".cfg"), skip=frozenset({"history"})):
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if outside.search(line):
                cites.append(f"{path.relative_to(ROOT)}:{n}")
    assert not cites, f"these cite documents that are not in the repo (put what they need in docs/): {cites}"
