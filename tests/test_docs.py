"""Every citation of the design documents resolves inside the repository.

Code, tests and the docs themselves cite pages as `docs/<page>.md` (in docs: `<page>.md`),
optionally followed by a quoted section heading. Each cited page must exist under `docs/`, and
each cited heading must be one of that page's headings, so a renamed section or page fails here
rather than leaving a dangling reference for the next reader.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: `docs/page.md` then, optionally, `, "Heading"` or ` "Heading"` (the heading may wrap lines).
CITATION = re.compile(r'docs/([\w-]+\.md)(?:,?\s+"([^"]+)")?')
#: Inside docs/: `page.md` links and `[page.md](page.md) "Heading"` references.
DOC_LINK = re.compile(r'\]\(([\w-]+\.md)\)(?:\s+"([^"]+)")?')


def _headings(page: Path) -> set[str]:
    return {
        line.lstrip("#").strip()
        for line in page.read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    }


def _sources() -> list[Path]:
    files = [ROOT / "README.md"]
    for top in ("lab", "mocker", "launch", "tests"):
        files += [p for p in (ROOT / top).rglob("*.py") if "gen" not in p.relative_to(ROOT).parts]
    return [p for p in files if p != Path(__file__)]


def _check(citations: list[tuple[str, str | None]], where: str) -> list[str]:
    problems = []
    for page, heading in citations:
        path = DOCS / page
        if not path.is_file():
            problems.append(f"{where}: docs/{page} does not exist")
        elif heading is not None and " ".join(heading.split()) not in _headings(path):
            problems.append(f'{where}: docs/{page} has no heading "{heading}"')
    return problems


def test_code_citations_resolve() -> None:
    problems: list[str] = []
    seen = 0
    for path in _sources():
        found = CITATION.findall(path.read_text(encoding="utf-8"))
        seen += len(found)
        problems += _check([(p, h or None) for p, h in found], str(path.relative_to(ROOT)))
    assert not problems, "\n".join(problems)
    assert seen >= 25  # the check would pass vacuously if the pattern stopped matching


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_doc_links_resolve(page: str) -> None:
    found = DOC_LINK.findall((DOCS / page).read_text(encoding="utf-8"))
    problems = _check([(p, h or None) for p, h in found], f"docs/{page}")
    assert not problems, "\n".join(problems)


def test_no_citation_points_outside_the_repository() -> None:
    """The specs the lab was built from are not part of it; nothing may cite them."""
    # (spelt in pieces, so that this file does not match the repository-wide grep itself)
    outside = re.compile("shared/" + r"docs|contracts\.md|\bissue \d")
    hits = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in _sources()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if outside.search(line)
    ]
    assert not hits, hits
