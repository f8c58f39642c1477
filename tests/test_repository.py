"""The repository as committed: no merge left half done, and every docs page has one title.

A conflict resolved by hand can leave its markers in a file git no longer calls conflicted; a page
with two H1s (a merged heading, a setext underline MyST reads as H1) splits the site's navigation.
Both checks read the files ``git ls-files`` lists, so CI fails on them whatever the file's kind.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Built, not written out: a line of this file starting with a marker would be flagged itself.
OPEN, MIDDLE, CLOSE = "<" * 7, "=" * 7, ">" * 7
FENCE = re.compile(r"^(`{3,}|~{3,})(.*)$")


def tracked_files(root: Path) -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, check=True, capture_output=True).stdout
    return [root / name for name in listed.decode().split("\0") if name and (root / name).is_file()]


def conflict_markers(files: Iterable[Path], root: Path) -> list[str]:
    """``path:line: marker`` for each line a merge conflict leaves: ``<<<<<<<`` and ``>>>>>>>`` anywhere
    (nothing else starts a line so), ``=======`` only between them (alone it is a setext underline)."""
    found = []
    for path in files:
        data = path.read_bytes()
        if b"\0" in data:  # binary (images): no text to have markers in
            continue
        inside = False
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            marker = line[:7]
            if marker == OPEN and line[7:8] in ("", " "):
                inside = True
            elif marker == CLOSE and line[7:8] in ("", " "):
                inside = False
            elif not (inside and line.rstrip() == MIDDLE):
                continue
            found.append(f"{path.relative_to(root)}:{number}: {line[:40]}")
    return found


def h1_headings(page: Path) -> list[str]:
    """The H1s MyST makes of ``page``: ``# `` lines and setext ``===`` underlines outside code fences,
    and those of a file ``{include}``-d into it."""
    found: list[str] = []
    fence: str | None = None
    previous = ""
    for line in page.read_text(encoding="utf-8").splitlines():
        opening = FENCE.match(line.strip())
        if fence is None and opening:
            fence = opening.group(1)
            include = re.match(r"\{include\}\s+(\S+)", opening.group(2).strip())
            if include:
                found += h1_headings((page.parent / include.group(1)).resolve())
        elif fence is not None:
            if line.strip().startswith(fence) and not line.strip().lstrip(fence[0]):
                fence = None
        elif line.startswith("# "):
            found.append(line[2:].strip())
        elif re.fullmatch(r"=+\s*", line) and _paragraph(previous):
            found.append(previous.strip())
        previous = line if fence is None else ""
    return found


def _paragraph(line: str) -> bool:
    """A line a setext underline turns into a heading: paragraph text, not a list item, quote, table or code."""
    return bool(line.strip()) and not re.match(r"(\s|[-*+>|]|\d+[.)])", line)


def docs_pages(root: Path) -> list[Path]:
    return sorted(path for path in (root / "docs").rglob("*.md") if "_build" not in path.parts)


def test_no_conflict_markers_are_committed() -> None:
    assert conflict_markers(tracked_files(REPO), REPO) == []


@pytest.mark.parametrize("page", docs_pages(REPO), ids=lambda page: str(page.relative_to(REPO / "docs")))
def test_every_docs_page_has_exactly_one_h1(page: Path) -> None:
    assert len(h1_headings(page)) == 1, h1_headings(page)


def test_the_checks_find_a_planted_conflict_and_a_second_title(tmp_path: Path) -> None:
    """In a copy of two pages: a conflict left in one and a second H1 (setext) in the other are found; the
    setext underline alone is not taken for a conflict."""
    copy = tmp_path / "repo"
    (copy / "docs").mkdir(parents=True)
    for name in ("CHANGELOG.md", "docs/changelog.md", "docs/differences.md"):
        shutil.copy(REPO / name, copy / name)
    changelog = copy / "CHANGELOG.md"
    lines = changelog.read_text(encoding="utf-8").splitlines()
    lines[3:3] = [f"{OPEN} HEAD", "- ours", MIDDLE, "- theirs", f"{CLOSE} feature"]
    changelog.write_text("\n".join(lines) + "\n", encoding="utf-8")
    differences = copy / "docs" / "differences.md"
    differences.write_text(differences.read_text(encoding="utf-8") + "\nMore\n====\n\n```\n# a comment\n```\n")
    files = [changelog, copy / "docs" / "changelog.md", differences]
    assert conflict_markers(files, copy) == [
        f"CHANGELOG.md:4: {OPEN} HEAD",
        f"CHANGELOG.md:6: {MIDDLE}",
        f"CHANGELOG.md:8: {CLOSE} feature",
    ]
    assert h1_headings(differences)[-1] == "More" and len(h1_headings(differences)) == 2
    assert len(h1_headings(copy / "docs" / "changelog.md")) == 1  # the changelog page is CHANGELOG.md's title
    assert len(h1_headings(REPO / "docs" / "differences.md")) == 1


def test_every_benchmark_table_says_when_it_was_measured() -> None:
    """A reader must tell current figures from old ones: each table of the benchmarks page follows a
    `*Measured YYYY-MM-DD (...)*` line."""
    lines = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8").splitlines()
    undated = [
        number
        for number, line in enumerate(lines, 1)
        if line.startswith("|")
        and not lines[number - 2].startswith("|")
        and not re.match(r"\*Measured \d{4}-\d{2}-\d{2} \(", lines[number - 3])
    ]
    assert undated == []


def undescribed_modules(root: Path) -> list[str]:
    """The package's modules (``.py`` but ``__init__``, ``.c``) that CONTRIBUTING.md's layout never names."""
    guide = (root / "CONTRIBUTING.md").read_text(encoding="utf-8")
    named = set(re.findall(r"(?<![\w*])([A-Za-z_][\w]*\.(?:py|c))\b", guide))
    return sorted(
        str(path.relative_to(root))
        for path in tracked_files(root)
        if path.parts[len(root.parts)] == "fastloader"
        and path.suffix in (".py", ".c")
        and path.name != "__init__.py"
        and path.name not in named
    )


def test_contributing_describes_every_module() -> None:
    assert undescribed_modules(REPO) == []


def test_an_undescribed_module_is_named(tmp_path: Path) -> None:
    (tmp_path / "fastloader").mkdir()
    (tmp_path / "fastloader" / "told.py").write_text("")
    (tmp_path / "fastloader" / "untold.py").write_text("")
    (tmp_path / "CONTRIBUTING.md").write_text("  told.py   a module the guide names\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    assert undescribed_modules(tmp_path) == ["fastloader/untold.py"]
