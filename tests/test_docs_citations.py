"""Every citation of a section of a document in the repo resolves: code and docs point a reader at
`docs/<file>.md, "Section"` for the why and the measurements behind a rule, and a section renamed
or moved (docs/BENCHMARKS.md's dated entries go to docs/history/ as they are superseded) would
leave them pointing at nothing."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = (".py", ".md", ".sh", ".toml")
SKIP = {".venv", ".git", "build", "dist"}
CITATION = re.compile(r'(docs/(?:[A-Za-z0-9_-]+/)*[A-Za-z0-9_-]+\.md),\s+"([^"]+)"')
COMMENT = re.compile(r"^(?:#+\s?|//\s?|>\s?|\*\s)")


def flatten(text: str) -> str:
    """`text` as one line, each line's comment or quote marker dropped: a citation wraps where its
    comment or docstring does."""
    return " ".join(COMMENT.sub("", line.strip()) for line in text.splitlines())


def citations(text: str) -> list[tuple[str, str]]:
    """(document, section) of every citation in `text`."""
    return [(m.group(1), m.group(2)) for m in CITATION.finditer(flatten(text))]


def anchors(text: str) -> list[str]:
    """What a citation may name in a document: its headings, bold and italic terms, and the lead
    words of its list items (docs/POLICIES.md's rules are bullets: "- Probes: ...")."""
    found = []
    for line in text.splitlines():
        heading = re.match(r"^#{1,6}\s+(.*)$", line)
        if heading:
            found.append(heading.group(1))
        lead = re.match(r"^\s*(?:-|\d+\.)\s+([^:(]+)[:(]", line)
        if lead:
            found.append(lead.group(1))
        found += re.findall(r"\*\*([^*]+)\*\*", line)
        found += re.findall(r"(?<!\*)\*([^*\s][^*]*)\*(?!\*)", line)
    return [normal(a) for a in found]


def normal(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("`", "")).strip().lower()


def resolves(section: str, names: list[str]) -> bool:
    """A section is cited by its name, or by the start of a dated heading's ("Name (issue #14; ...)")."""
    want = normal(section)
    return any(name.startswith(want) or want in name for name in names)


def repo_files(suffixes: tuple[str, ...] = SUFFIXES, skip: frozenset[str] = frozenset()) -> list[Path]:
    """The repo's files ending in `suffixes`, without walking a virtual environment, git's store or
    the folders named in `skip`."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP | skip and not d.startswith(".")]
        found += [Path(folder) / f for f in files if f.endswith(suffixes)]
    return found


def test_every_cited_section_exists() -> None:
    names: dict[str, list[str]] = {}
    missing = []
    for path in repo_files():
        for doc, section in citations(path.read_text(errors="replace")):
            target = ROOT / doc
            if doc not in names:
                names[doc] = anchors(target.read_text()) if target.is_file() else []
            if not resolves(section, names[doc]):
                missing.append(f"{path.relative_to(ROOT)}: {doc}, {section!r}")
    assert not missing, "cited sections that do not exist (renamed or moved?):\n" + "\n".join(sorted(missing))


def test_a_wrapped_citation_is_read_and_a_missing_section_is_seen() -> None:
    text = '    # measured (docs/BENCHMARKS.md,\n    # "Joining the step\'s level"): and (docs/POLICIES.md, "Probes")'
    assert citations(text) == [("docs/BENCHMARKS.md", "Joining the step's level"), ("docs/POLICIES.md", "Probes")]
    doc = "# T\n### Joining the step's level (issue #14; 2026-12-07)\n- Probes: when app-limited\n**Bold lead.** x\n"
    names = anchors(doc)
    assert resolves("Joining the step's level", names)
    assert resolves("Probes", names)
    assert resolves("Bold lead", names)
    assert not resolves("Leaving the step's level", names)
