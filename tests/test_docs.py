"""The README is a start page and docs/ the manual (a newcomer read 710 lines, 9,356 words and no picture before the
report was first explained, and met words no user can resolve: a CI host's numbered stops, issue numbers)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_README_LINES = 150
# the project's internal vocabulary: a numbered stop of a CI host, an issue number of this project's tracker
INTERNAL = re.compile(r"\b(stop|issue)\s+#?\d+", re.IGNORECASE)
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def internal_words(text: str) -> list[str]:
    return [m[0] for m in INTERNAL.finditer(text)]


def broken_links(page: Path) -> list[str]:
    """Relative links of a Markdown page (docs/..., ../README.md, images) whose file does not exist."""
    return [target for target, _ in LINK.findall(page.read_text())
            if "://" not in target and not (page.parent / target).exists()]


def test_readme_is_a_start_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, len(lines)
    assert any(line.startswith("![") and "docs/img/" in line for line in lines)  # one picture of the report
    assert (ROOT / "docs" / "img" / "report.png").stat().st_size < 200_000
    text = "\n".join(lines)
    assert "scripts/job" in text and "scripts/test" in text  # the two commands, as they are


def test_no_internal_vocabulary_in_readme_or_docs():
    found = {p.relative_to(ROOT).as_posix(): internal_words(p.read_text()) for p in pages()}
    assert {p: w for p, w in found.items() if w} == {}
    # the check itself: the review's words are found
    assert internal_words("stop 37's CI host; see issue 31 and Issue #5") == ["stop 37", "issue 31", "Issue #5"]


def test_every_link_of_readme_and_docs_resolves(tmp_path):
    assert {p.relative_to(ROOT).as_posix(): broken_links(p) for p in pages() if broken_links(p)} == {}
    assert any(target.startswith("docs/") for target, _ in LINK.findall((ROOT / "README.md").read_text()))
    page = tmp_path / "README.md"  # the check itself: a link to a page that is not there
    page.write_text("[x](docs/nowhere.md) [y](https://example.org/a.md)")
    assert broken_links(page) == ["docs/nowhere.md"]
