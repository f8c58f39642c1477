"""The stall watchdog: when no batch comes for a while, say which worker is stuck and where, instead of a silent hang.

* Each worker process, as it starts (:class:`StackDumpInit`, run before the user's ``worker_init_fn``),
  registers ``faulthandler`` on SIGUSR1 to append the Python stack of all its threads to a file of its
  own in a directory the loader owns.
* When the training loop has waited ``stall_warning`` seconds for a batch, :func:`report_stall` asks
  torch's iterator which worker holds the batch the loop waits for, signals every live worker, reads
  what each wrote, adds the training process's own threads (``sys._current_frames``), and logs it all
  as one warning on the ``fastloader`` logger (printed on stderr even where logging is not set up).
  It repeats every ``stall_warning`` seconds while the wait lasts; ``timeout=`` still raises as in torch.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Any

from fastloader.torch_internals import awaited_batch, worker_processes

log = logging.getLogger("fastloader")
_SIGNAL = signal.SIGUSR1
_DUMP_WAIT_S = 1.0  # how long to wait for the workers' dumps


class StackDir:
    """A private directory for the workers' stack files, removed with its owner (the loader)."""

    def __init__(self) -> None:
        self.path = tempfile.mkdtemp(prefix="fastloader-stacks-")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.path, True)

    def file_of(self, pid: int) -> str:
        return os.path.join(self.path, f"{pid}.txt")


class StackDumpInit:
    """A worker_init_fn: SIGUSR1 makes this worker write its threads' stacks to its file, then the user's init."""

    def __init__(self, directory: str, inner: Callable[[int], None] | None) -> None:
        self.directory = directory
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        try:
            # Kept open for the worker's life: faulthandler writes to the descriptor from a signal handler.
            dump = open(os.path.join(self.directory, f"{os.getpid()}.txt"), "a")  # noqa: SIM115
            faulthandler.register(_SIGNAL, file=dump, all_threads=True, chain=False)
            _KEEP.append(dump)
        except (OSError, ValueError, RuntimeError):  # no directory (removed), no signals here: no dumps
            pass
        if self.inner is not None:
            self.inner(worker_id)


_KEEP: list[Any] = []  # the worker's open dump file (never closed: the handler writes to it)


def stalled(source: weakref.ref[Any], stacks: StackDir | None, waited: float) -> None:
    """The alarm of a DataLoaderX epoch, in the waiting training loop: :func:`report_stall` for torch's iterator
    (if it is still there); a failed report never breaks the epoch."""
    iterator = source()
    if iterator is None:
        return
    try:
        report_stall(iterator, stacks, waited)
    except Exception as error:  # noqa: BLE001 - a failed report must not break the epoch
        log.warning("no batch for %.0f s (and the stall report failed: %r)", waited, error)


def report_stall(source: Any, stacks: StackDir | None, waited: float) -> str:
    """Log (and return) where the pipeline is stuck: the awaited worker, every worker's and this process's stacks."""
    lines = [f"no batch for {waited:.0f} s: the training loop is waiting for the data loader"]
    awaited = awaited_batch(source)
    stuck = awaited[1] if awaited is not None else None
    workers = worker_processes(source)
    if awaited is not None and stuck is not None and stuck < len(workers):
        lines.append(f"it waits for batch {awaited[0]} from worker {stuck} (pid {workers[stuck].pid})")
    dumps = _worker_stacks(workers, stacks) if workers else {}
    for worker_id, process in enumerate(workers):
        mark = "  <- the awaited batch" if worker_id == stuck else ""
        alive = "alive" if process.is_alive() else f"exited ({process.exitcode})"
        lines.append(f"--- worker {worker_id} (pid {process.pid}, {alive}){mark}")
        lines.append(dumps.get(process.pid, "    (no stack: the worker did not answer)").rstrip())
    lines.append(f"--- training process (pid {os.getpid()})")
    lines.append(_own_stacks())
    text = "\n".join(lines)
    log.warning(text)
    return text


def _worker_stacks(workers: list[Any], stacks: StackDir | None) -> dict[int, str]:
    if stacks is None:
        return {}
    sizes: dict[int, int] = {}
    for process in workers:
        path = stacks.file_of(process.pid)
        if process.is_alive() and os.path.exists(path):  # registered: the signal will not kill it
            sizes[process.pid] = os.path.getsize(path)
            try:
                os.kill(process.pid, _SIGNAL)
            except OSError:
                sizes.pop(process.pid)
    deadline = time.monotonic() + _DUMP_WAIT_S
    texts: dict[int, str] = {}
    while sizes and time.monotonic() < deadline:
        time.sleep(0.05)
        for pid, before in list(sizes.items()):
            path = stacks.file_of(pid)
            if os.path.getsize(path) > before:
                time.sleep(0.05)  # let the dump finish
                with open(path, encoding="utf-8", errors="replace") as dump:
                    dump.seek(before)
                    texts[pid] = dump.read()
                del sizes[pid]
    return texts


def _own_stacks() -> str:
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue  # this thread is the one reporting
        stack = "".join(traceback.format_stack(frame)).rstrip()
        parts.append(f"thread {names.get(ident, ident)}:\n{stack}")
    return "\n".join(parts) if parts else "    (no other thread)"
