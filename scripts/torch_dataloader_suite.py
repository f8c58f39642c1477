"""Run PyTorch's own DataLoader test suite (or torchdata's StatefulDataLoader suite) against the stock
loader and against DataLoaderX.

Why this exists: DataLoaderX claims to be a drop-in replacement for ``torch.utils.data.DataLoader``.
The strongest check of that claim is torch's own ``test/test_dataloader.py`` (not shipped in the torch
wheel, and not ours to commit: pass the path of a copy you fetched). This script writes two copies of
that file, runs pytest on both, and reports the tests that pass with torch's loader but fail with
DataLoaderX:

* ``stock``: the file as it is;
* ``dataloaderx``: the same file with ``from fastloader import DataLoaderX as DataLoader`` inserted right
  after its imports, so every ``DataLoader(...)`` the tests build (directly or through
  ``_get_data_loader``) is a DataLoaderX. Call sites spelled ``torch.utils.data.DataLoader(...)`` and the
  scripts the file runs in subprocesses stay torch's; their number is reported.

Both copies keep the file name (the file imports itself by its own name for pickling) and run in their own
folder with an empty ``pytest.ini``, so this project's pytest settings do not apply. torch's test helpers
need ``expecttest`` (``pip install expecttest``, or put a folder holding it on ``PYTHONPATH``).

    python scripts/torch_dataloader_suite.py path/to/test_dataloader.py --out result.json

torchdata's suite (``test/stateful_dataloader/test_state_dict.py`` and ``test_sampler.py`` of torchdata 0.11,
with torchdata and ``parameterized`` importable) runs the same way with ``--name StatefulDataLoader``: the
``dataloaderx`` copy then has ``from fastloader import DataLoaderX as StatefulDataLoader`` after its imports,
and the ``stock`` copy runs torchdata's own loader as the control.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

REBIND_LINE = "from fastloader import DataLoaderX as {name}  # inserted by scripts/torch_dataloader_suite.py\n"
# --worker-method: every loader the tests build runs its workers so (DataLoaderX's worker_method=, forced)
FORCED_LINES = """from typing import TypeVar as _TypeVar  # inserted by scripts/torch_dataloader_suite.py

from fastloader import DataLoaderX as _DataLoaderX

_T = _TypeVar("_T")


class {name}(_DataLoaderX[_T]):  # worker_method={method!r} forced (scripts/torch_dataloader_suite.py)
    def __init__(self, *args, worker_method={method!r}, **kwargs):
        super().__init__(*args, worker_method=worker_method, **kwargs)


"""
VARIANTS = ("stock", "dataloaderx")


@dataclass
class RunResult:
    """Outcome of one pytest run over one copy of the suite."""

    variant: str
    returncode: int
    seconds: float
    timed_out: bool
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    outcomes: dict[str, str] = field(default_factory=dict)  # test id -> passed/failed/error/skipped
    messages: dict[str, str] = field(default_factory=dict)  # test id -> first line of the failure


def rebind_dataloader(source: str, name: str = "DataLoader", worker_method: str | None = None) -> tuple[str, int]:
    """Return ``source`` with ``name`` rebound to DataLoaderX after the module's imports (to a subclass whose
    ``worker_method`` defaults to ``worker_method``, when given), and the number of
    ``torch.utils.data.DataLoader`` attribute call sites the rebinding does not reach.

    Raises ValueError when the module does not import ``name`` at top level or binds it again after
    its imports (the rebinding would then not be what the tests use).
    """
    tree = ast.parse(source)
    body = tree.body
    imports_name = any(
        isinstance(node, ast.ImportFrom) and any((alias.asname or alias.name) == name for alias in node.names)
        for node in body
    )
    if not imports_name:
        raise ValueError(f"the module does not import {name} at top level: nothing to rebind")
    # The import block: leading docstring / imports; the rebinding goes right after its last import.
    last_import: ast.stmt | None = None
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            last_import = node
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and last_import is None:
            continue  # module docstring
        else:
            break
    if last_import is None or last_import.end_lineno is None:
        raise ValueError("no import block found")
    for node in body:
        if node.lineno > last_import.end_lineno and name in _bound_names(node):
            raise ValueError(f"{name} is bound again at line {node.lineno}: the rebinding would not hold")
    lines = source.splitlines(keepends=True)
    cut = last_import.end_lineno
    rebind = (
        REBIND_LINE.format(name=name) if worker_method is None else FORCED_LINES.format(name=name, method=worker_method)
    )
    rewritten = "".join(lines[:cut]) + rebind + "".join(lines[cut:])
    unreached = sum(
        1
        for sub in ast.walk(tree)
        if isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr == "DataLoader"
        and ast.unparse(sub.func.value) == "torch.utils.data"
    )
    return rewritten, unreached


def _bound_names(node: ast.stmt) -> set[str]:
    """Module-level names a top-level statement binds (imports and plain assignments)."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {alias.asname or alias.name.split(".")[0] for alias in node.names}
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {sub.id for target in targets for sub in ast.walk(target) if isinstance(sub, ast.Name)}
    return set()


def write_variant(workdir: Path, variant: str, source: str, name: str) -> Path:
    """Write one copy of the suite into ``workdir/variant`` with an empty pytest.ini; return its path."""
    folder = workdir / variant
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pytest.ini").write_text("[pytest]\n")
    path = folder / name
    path.write_text(source)
    return path


def parse_junit(path: Path, result: RunResult) -> None:
    """Fill ``result``'s counts, outcomes and messages from a pytest junit-xml file."""
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                text = (child.get("message") or child.text or "").strip()
                message = text.splitlines()[0][:300] if text else ""
                if child.tag != "skipped":
                    break
        if test_id in result.outcomes and outcome == "passed":
            continue  # a teardown error is reported as a second testcase; keep the worse outcome
        result.outcomes[test_id] = outcome
        if message:
            result.messages[test_id] = message
    counts = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    for outcome in result.outcomes.values():
        counts[outcome] += 1
    result.passed, result.failed = counts["passed"], counts["failed"]
    result.skipped, result.errors = counts["skipped"], counts["error"]


def run_pytest(
    path: Path, variant: str, per_test_timeout: int, run_timeout: int, keyword: str | None, extra: list[str]
) -> RunResult:
    """Run pytest on ``path`` (in its folder) and return what the junit-xml says."""
    folder = path.parent
    junit = folder / "junit.xml"
    log = folder / "pytest.log"
    junit.unlink(missing_ok=True)
    command = [
        sys.executable,
        "-m",
        "pytest",
        path.name,
        "-p",
        "no:cacheprovider",
        "-q",
        "-rfE",
        f"--timeout={per_test_timeout}",
        f"--junit-xml={junit.name}",
        "-o",
        "junit_family=xunit1",
    ]
    if keyword:
        command += ["-k", keyword]
    command += extra
    started = time.monotonic()
    timed_out = False
    with log.open("w") as out:
        out.write(" ".join(command) + "\n")
        out.flush()
        process = subprocess.Popen(command, cwd=folder, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode = process.wait(timeout=run_timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            process.send_signal(signal.SIGINT)  # pytest stops and still writes the junit-xml of what ran
            try:
                returncode = process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                returncode = -signal.SIGKILL
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # the whole group: pytest and the loaders' workers
            process.wait()
    result = RunResult(variant, returncode, round(time.monotonic() - started, 1), timed_out)
    if junit.exists():
        parse_junit(junit, result)
    return result


def compare(stock: RunResult, ours: RunResult) -> dict[str, list[dict[str, str]]]:
    """Tests whose outcome differs between the two runs, grouped by direction."""
    regressions, fixed, other = [], [], []
    for test_id in sorted(set(stock.outcomes) | set(ours.outcomes)):
        before, after = stock.outcomes.get(test_id, "missing"), ours.outcomes.get(test_id, "missing")
        if before == after:
            continue
        entry = {"test": test_id, "stock": before, "dataloaderx": after, "message": ours.messages.get(test_id, "")}
        if before == "passed" and after in ("failed", "error"):
            regressions.append(entry)
        elif after == "passed" and before in ("failed", "error"):
            fixed.append(entry)
        else:
            other.append(entry)
    return {"pass_stock_fail_dataloaderx": regressions, "fail_stock_pass_dataloaderx": fixed, "other": other}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("suite", type=Path, help="path of torch's test/test_dataloader.py (or a torchdata test file)")
    parser.add_argument(
        "--name", default="DataLoader", help="the loader name to rebind (StatefulDataLoader: torchdata)"
    )
    parser.add_argument("--out", type=Path, help="write the summary here as JSON")
    parser.add_argument("--workdir", type=Path, help="where the two copies run (default: SUITE's folder/runs)")
    parser.add_argument("--timeout", type=int, default=120, help="per-test timeout in seconds (default 120)")
    parser.add_argument("--run-timeout", type=int, default=900, help="limit for one whole run in seconds")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression for both runs (deselect known hangs)")
    parser.add_argument("--only", choices=VARIANTS, help="run one variant only")
    parser.add_argument(
        "--worker-method",
        choices=("process", "thread"),
        help="force DataLoaderX's worker_method in the dataloaderx copy (default: the loader's own default)",
    )
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)

    source = args.suite.read_text()
    ast.parse(source)  # fail early on a truncated copy
    rebound, unreached = rebind_dataloader(source, args.name, args.worker_method)
    workdir = args.workdir or args.suite.resolve().parent / "runs"
    sources = {"stock": source, "dataloaderx": rebound}
    results: dict[str, RunResult] = {}
    for variant in VARIANTS:
        if args.only and variant != args.only:
            continue
        path = write_variant(workdir, variant, sources[variant], args.suite.name)
        print(f"[{variant}] running pytest on {path} ...", flush=True)
        result = run_pytest(path, variant, args.timeout, args.run_timeout, args.keyword, args.pytest_args)
        results[variant] = result
        print(
            f"[{variant}] passed={result.passed} failed={result.failed} skipped={result.skipped} "
            f"errors={result.errors} rc={result.returncode} {result.seconds}s"
            + (" (run timed out)" if result.timed_out else ""),
            flush=True,
        )

    summary: dict[str, object] = {
        "suite": str(args.suite),
        "keyword": args.keyword,
        "per_test_timeout_s": args.timeout,
        "torch_utils_data_DataLoader_call_sites_not_rebound": unreached,
        "runs": {
            name: {k: v for k, v in asdict(r).items() if k not in ("outcomes", "messages")}
            for name, r in results.items()
        },
    }
    if len(results) == 2:
        diff = compare(results["stock"], results["dataloaderx"])
        summary.update(diff)
        print("pass with torch's DataLoader, fail with DataLoaderX:")
        for entry in diff["pass_stock_fail_dataloaderx"]:
            print(f"  {entry['test']} [{entry['dataloaderx']}] {entry['message']}")
        if not diff["pass_stock_fail_dataloaderx"]:
            print("  (none)")
        for entry in diff["fail_stock_pass_dataloaderx"] + diff["other"]:
            print(f"  other difference: {entry['test']}: stock {entry['stock']}, dataloaderx {entry['dataloaderx']}")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
