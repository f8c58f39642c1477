"""Small helpers shared by the tests (real threads and processes, polled with a deadline)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# CPython before 3.11.10 can leave a forked child deadlocked on the runtime's thread-list lock when a thread with
# no Python state of its own (gloo's, in a DDP process) enters Python at the moment of the fork
# (python/cpython#112275). torch's own DataLoader, the control, hung so in CI. The DDP and framework tests are not
# about the start method: on those versions their workers start from a fork server (no fork of the rank's process).
DDP_WORKER_CONTEXT: str | None = "forkserver" if sys.version_info < (3, 11, 10) else None


def preload_worker_modules() -> None:
    """Where workers start from a fork server (``DDP_WORKER_CONTEXT``), have the server import the running
    script and torch once, before its first worker: each worker then forks with them loaded, where it would
    import torch (and the script's Lightning or accelerate) anew, 1.6-2 s a worker. Call it in ``main()``."""
    if DDP_WORKER_CONTEXT == "forkserver":
        multiprocessing.set_forkserver_preload(["__main__", "torch", "fastloader"])


def wait_until(condition: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def prefetch_threads() -> int:
    """Live fastloader producer threads."""
    return sum(1 for t in threading.enumerate() if t.name.startswith("fastloader-"))


def child_processes() -> int:
    """Live child processes (DataLoader workers are multiprocessing children)."""
    return len(multiprocessing.active_children())


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def run_python(code: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python -c code args...`` in a fresh interpreter that imports this checkout; output captured."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
