"""Run the documentation's examples, each in a fresh process, paying for the imports once.

    python tests/doc_examples.py < jobs.json > results.json

``jobs``: a list of ``{"name", "language", "code", "cwd"}``; ``results``: ``{name: {"returncode",
"output"}}``. A python example runs in a forked copy of this interpreter, which has imported torch,
torchvision and fastloader once (a fresh interpreter per example would import torch two dozen times);
the copy changes into the example's directory and runs the code as ``__main__``, as ``python
example.py`` would. A bash example runs under ``bash -euo pipefail``. tests/test_docs.py drives this.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TIMEOUT_S = 120


def _run_forked(code: str, cwd: Path) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="fastloader-example-"))  # beside the example's directory, not in it
    log, script = scratch / "output.log", scratch / "example.py"
    script.write_text(code)
    pid = os.fork()
    if pid == 0:  # the example's process: its own group, so that a timeout stops its workers too
        os.setpgrp()
        os._exit(_child(script, cwd, log))
    deadline = time.monotonic() + TIMEOUT_S
    done, status = os.waitpid(pid, os.WNOHANG)
    while not done and time.monotonic() < deadline:
        time.sleep(0.05)
        done, status = os.waitpid(pid, os.WNOHANG)
    if not done:
        os.killpg(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    output = log.read_text() if log.exists() else ""
    shutil.rmtree(scratch)
    if not done:
        output += f"\n(killed after {TIMEOUT_S} s)"
    return {"returncode": os.waitstatus_to_exitcode(status), "output": output}


def _child(script: Path, cwd: Path, log: Path) -> int:
    import gc
    import multiprocessing
    import runpy
    import traceback

    # `python tests/doc_examples.py` put tests/ first on sys.path, where tests/datasets would shadow Hugging
    # Face's `datasets` for an example that imports it: a reader's `python example.py` has no tests/ there.
    here = Path(__file__).resolve().parent
    sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != here]
    os.chdir(cwd)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.argv = [str(script)]
    status = 0
    try:
        runpy.run_path(str(script), run_name="__main__")
    except BaseException:  # noqa: BLE001 - whatever the example raises is its failure, reported in full
        traceback.print_exc()
        status = 1
    gc.collect()  # the example's loaders stop their threads and workers
    for child in multiprocessing.active_children():
        child.terminate()
    sys.stdout.flush()
    sys.stderr.flush()
    return status


def _run_bash(code: str, cwd: Path) -> dict[str, Any]:
    try:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", code], cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired as error:
        return {"returncode": -9, "output": f"{error.stdout}\n{error.stderr}\n(killed after {TIMEOUT_S} s)"}
    return {"returncode": done.returncode, "output": done.stdout + done.stderr}


def main() -> None:
    jobs = json.load(sys.stdin)
    # Imported here, before any fork, so that every example's process starts with them loaded.
    import torch  # noqa: F401
    import torchvision  # noqa: F401

    import fastloader.datasets  # noqa: F401
    import fastloader.pack  # noqa: F401
    import fastloader.transforms  # noqa: F401

    results = {}
    for job in jobs:
        cwd, start = Path(job["cwd"]), time.monotonic()
        run = _run_forked if job["language"] == "python" else _run_bash
        results[job["name"]] = dict(run(job["code"], cwd), seconds=round(time.monotonic() - start, 2))
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
