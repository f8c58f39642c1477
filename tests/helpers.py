"""Small helpers shared by the tests (real threads and processes, polled with a deadline)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# How long a test waits for a child process it launched (a script, a CLI, a torchrun, a framework run) before it
# calls it a hang. A guard against a hang, never a speed assertion: the slowest single launch takes ~40 s on an idle
# 2-core machine and 4-5 times that on one whose load is 8; a child still running after this is stuck. Under
# pytest-timeout's 300 s a test, so that a hang fails with the child's own output (run_child), not pytest's dump of
# the waiting test's stack.
CHILD_TIMEOUT_S = 200.0
# What of a failed or stuck child's stdout and stderr a failure message shows: the end, where the error is.
OUTPUT_TAIL_CHARS = 6000

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


def shm_files() -> set[str]:
    """The files in /dev/shm other than semaphores: any process on the machine makes and removes those
    (multiprocessing's locks, sem.mp-*), so they say nothing of the process that looks; the batch ring's memory
    is a memfd, never a name here."""
    return {name for name in os.listdir("/dev/shm") if not name.startswith("sem.")}


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def blocked_writing(pid: int) -> bool:
    """Whether a thread of process ``pid`` sleeps in a pipe write (Linux names the wait channel ``pipe_write``
    or ``anon_pipe_write``; torch's own workers write from their queue's feeder thread)."""
    try:
        for thread in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{thread}/wchan", encoding="ascii") as wchan:
                if "pipe_write" in wchan.read():
                    return True
    except (FileNotFoundError, ProcessLookupError):
        pass
    return False


def tail(text: str | bytes | None, chars: int = OUTPUT_TAIL_CHARS) -> str:
    """The last ``chars`` characters of a child's output (bytes decoded), marked where cut."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    text = text or ""
    return text if len(text) <= chars else f"[... {len(text) - chars} characters before ...]\n{text[-chars:]}"


def run_child(
    command: Sequence[str], *, timeout: float = CHILD_TIMEOUT_S, input: str | None = None, **popen: Any
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(command, capture_output=True, text=True, timeout=timeout, **popen)``, but the child
    starts a session of its own, and at the timeout the whole session is killed (the ranks of a torchrun, the
    workers of a script: with ``subprocess.run`` they outlive the killed parent, load the machine and hold its
    pipes) and the test fails with what the child wrote, so that a hang says where it hung."""
    with subprocess.Popen(
        command,
        stdin=subprocess.PIPE if input is not None else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **popen,
    ) as process:
        stdout, stderr = finish(process, timeout=timeout, input=input)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def finish(
    process: subprocess.Popen[str], *, timeout: float = CHILD_TIMEOUT_S, input: str | None = None
) -> tuple[str, str]:
    """``process.communicate(input, timeout)`` for a child started with ``stdout`` and ``stderr`` piped; at the
    timeout, kill it (its whole session where it leads one) and fail the test with the end of what it wrote."""
    try:
        return process.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        stdout, stderr = kill(process)
    import pytest  # here, not on import: ddp_worker.py imports this module in each rank

    command = process.args if isinstance(process.args, (list, tuple)) else [process.args]
    pytest.fail(
        f"{' '.join(map(str, command))[:300]}\nstill running after {timeout:.0f} s: killed it (a hang, or a "
        f"machine far slower than any seen).\n"
        f"--- its stdout (end) ---\n{tail(stdout)}\n--- its stderr (end) ---\n{tail(stderr)}",
        pytrace=False,
    )


def kill(process: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGKILL ``process`` (every process of its session where it leads one) unless it has exited; return what
    it wrote to its piped ``stdout`` and ``stderr`` ("" for those not piped)."""
    if process.poll() is None:  # not reaped yet: its pid (and session id) cannot be another process's
        try:
            if os.getsid(process.pid) == process.pid:
                os.killpg(process.pid, signal.SIGKILL)
            else:
                process.kill()
        except ProcessLookupError:
            pass
    try:
        stdout, stderr = process.communicate(timeout=30)
    except subprocess.TimeoutExpired as still:  # a grandchild of another session holds the pipes
        return tail(still.stdout), tail(still.stderr)
    return stdout or "", stderr or ""


def run_python(code: str, *args: str, timeout: float = CHILD_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``python -c code args...`` in a fresh interpreter that imports this checkout; output captured."""
    return run_child(
        [sys.executable, "-c", code, *args], timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
