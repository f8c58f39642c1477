"""The documentation's examples run as written, its links resolve and its API reference covers every door.

Every ```python block in README.md and docs/**/*.md carries a marker, an HTML comment on the line
before it (invisible on GitHub and in the built site):

* ``<!-- test: run -->``: a complete example, run in a fresh process from a temporary directory that
  holds what ``make demo`` makes (``data/sample-2000``, smaller here, and its LMDB pack), as a reader
  who ran ``make demo`` would run it from the repository root. The examples of one page run in order,
  in one directory, as a reader goes through the page: a later one may use what an earlier one made;
* ``<!-- test: skip: REASON -->``: a complete example that needs what CI lacks (a GPU, torchrun, an S3
  store): compiled, then skipped with REASON;
* ``<!-- test: fragment -->``: a piece of a program (its names are defined elsewhere): compiled only.

A ```bash block marked ``run`` runs under ``bash -euo pipefail`` the same way, with this interpreter's
``fastloader`` and ``python`` first on the PATH; unmarked bash blocks are shown, not run.

The site itself is built by ``make docs`` (warnings are errors, so broken internal references fail);
README.md is not part of that build, so its relative links are checked here.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pkgutil
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

import fastloader
from tests.helpers import run_child

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)]
MARKER = re.compile(r"^<!-- test: (run|fragment|skip: (?P<reason>.+?)) -->$")
FENCE = re.compile(r"^(`{3,})(.*)$")
SAMPLE_IMAGES = 80  # make demo makes 2,000; the examples need a few batches


@dataclasses.dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    marker: str | None  # "run", "fragment", "skip" or None
    reason: str
    code: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, each with the marker on the line before it."""
    found, lines, i = [], page.read_text().splitlines(), 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence.group(1)), None)
        if end is None:
            raise ValueError(f"{page}:{i + 1}: unclosed code fence")
        marker = MARKER.match(lines[i - 1]) if i > 0 else None
        kind = None if marker is None else marker.group(1).split(":")[0]
        reason = (marker.group("reason") or "") if marker else ""
        code = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(Block(page, i + 1, fence.group(2).strip(), kind, reason, code))
        i = end + 1
    return found


ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]
RUNNABLE = [b for b in ALL_BLOCKS if b.marker == "run"]
SKIPPED = [b for b in ALL_BLOCKS if b.marker == "skip"]


def test_every_python_block_says_whether_it_runs() -> None:
    unmarked = [b.name for b in ALL_BLOCKS if b.language == "python" and b.marker is None]
    assert not unmarked, f"python blocks without a <!-- test: ... --> marker: {unmarked}"
    for page in PAGES:
        lines = page.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            if line.startswith("<!-- test:"):
                assert MARKER.match(line), f"{page}:{number}: malformed marker {line!r}"
                assert number < len(lines) and FENCE.match(lines[number]), f"{page}:{number}: no code block after"


def test_the_docs_have_examples_that_run() -> None:
    python = [b for b in RUNNABLE if b.language == "python"]
    pages = {b.page.name for b in python}
    assert len(python) >= 10 and {"getting-started.md", "datasets.md", "resume.md"} <= pages


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.language == "python"], ids=lambda b: b.name)
def test_python_blocks_compile(block: Block) -> None:
    compile(block.code, block.name, "exec")


@pytest.mark.parametrize("block", SKIPPED, ids=lambda b: b.name)
def test_skipped_examples(block: Block) -> None:
    pytest.skip(block.reason)


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What `make demo` leaves in data/: the sample folder and its LMDB pack (smaller)."""
    from fastloader.pack import pack
    from fastloader.sample import make_sample_folder

    data = tmp_path_factory.mktemp("demo") / "data"
    make_sample_folder(data / "sample-2000", SAMPLE_IMAGES, workers=1)
    pack(str(data / "sample-2000"), str(data / "sample-2000.lmdb"), workers=0, progress=False)
    return data


def example_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


@pytest.fixture(scope="module")
def example_results(demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every runnable example, run once (tests/doc_examples.py); each page's from its own copy of the data."""
    jobs, folders = [], {}
    for block in RUNNABLE:
        if block.page not in folders:
            folders[block.page] = tmp_path_factory.mktemp(block.page.stem)
            shutil.copytree(demo_data, folders[block.page] / "data")
        cwd = str(folders[block.page])
        jobs.append({"name": block.name, "language": block.language, "code": block.code, "cwd": cwd})
    selfcheck = str(tmp_path_factory.mktemp("selfcheck"))
    jobs += [dict(job, name=f"selfcheck:{job['name']}", cwd=selfcheck) for job in SELFCHECK_JOBS]
    env = dict(example_env(), FASTLOADER_CACHE=str(tmp_path_factory.mktemp("cache")))
    done = run_child(
        [sys.executable, str(ROOT / "tests" / "doc_examples.py")], input=json.dumps(jobs), env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr
    results: dict[str, dict[str, Any]] = json.loads(done.stdout)
    return results


# Run with the examples: the runner reports a failing example as failed, with its output.
SELFCHECK_JOBS = [
    {"name": "raises", "language": "python", "code": "print('before')\nraise OSError('disk gone')\n"},
    {"name": "exits", "language": "bash", "code": "echo start; false; echo never\n"},
    {"name": "works", "language": "python", "code": "import os\nprint(os.getcwd())\n"},
]


@pytest.mark.timeout(600)  # the first test to use example_results runs every example
def test_a_failing_example_is_reported_with_its_traceback(example_results: dict[str, dict[str, Any]]) -> None:
    raises, exits, works = (example_results[f"selfcheck:{job['name']}"] for job in SELFCHECK_JOBS)
    assert raises["returncode"] == 1 and "before" in raises["output"] and "OSError: disk gone" in raises["output"]
    assert exits["returncode"] == 1 and "start" in exits["output"] and "never" not in exits["output"]
    assert works["returncode"] == 0 and works["output"].strip().endswith("selfcheck0")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.name)
def test_example_runs(block: Block, example_results: dict[str, dict[str, Any]]) -> None:
    if block.language not in ("python", "bash"):
        raise ValueError(f"{block.name}: cannot run a {block.language!r} block")
    result = example_results[block.name]
    assert result["returncode"] == 0, f"{block.name} failed:\n{result['output']}"


def test_the_api_reference_has_a_page_for_every_package_with_a_door() -> None:
    """Each package that exports names in ``__all__`` is documented by an automodule of it."""
    # torch_internals is the one place that names torch's private parts, for fastloader's own modules: no user
    # imports it (CONTRIBUTING.md documents it, with the table of which feature needs which name).
    packages = ["fastloader"] + [
        f"fastloader.{info.name}"
        for info in pkgutil.iter_modules(fastloader.__path__)
        if info.ispkg and info.name != "torch_internals"
    ]
    api = "\n".join(page.read_text() for page in (DOCS / "api").glob("*.md"))
    missing = [
        name
        for name in packages
        if hasattr(importlib.import_module(name), "__all__") and f"automodule:: {name}\n" not in api
    ]
    assert not missing, f"packages with __all__ but no page in docs/api: {missing}"


def github_anchor(heading: str) -> str:
    """The id GitHub (and MyST, with myst_heading_anchors) gives a heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)  # no headings in code
    return {github_anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("page", ["README.md", "CONTRIBUTING.md", "CHANGELOG.md"])
def test_relative_links_of_the_top_level_pages_resolve(page: str) -> None:
    source = ROOT / page
    text = re.sub(r"^```.*?^```", "", source.read_text(), flags=re.M | re.S)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert page != "README.md" or len(links) >= 10
    for link in links:
        if re.match(r"[a-z]+://|mailto:", link):
            continue
        path, _, anchor = link.partition("#")
        target = (source.parent / path).resolve() if path else source
        assert target.exists(), f"{page}: the link {link!r} points at nothing"
        if anchor and target.suffix == ".md":
            assert anchor in anchors(target), f"{page}: no heading #{anchor} in {target.relative_to(ROOT)}"
