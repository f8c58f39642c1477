"""The subprocess pipeline (``worker_method="subprocess"``): one child process runs the ``num_workers`` workers as
threads, with the collate and the batch ring's writes; only finished batches cross into the training process.

The training process keeps what every mode keeps (``fastloader.loader.workers``): torch's iterator, so the order,
the resume cursor, the ledger and the in-flight bound stay there. It sends each worker's batches of indices and
torch's epoch messages (``_ResumeIteration``) through one queue per worker, as to worker processes, and receives
``(task, batch)`` results; a batch of a dataset with a fixed batch buffer (``batch_buffer_size()``) is written
into a batch ring slot by the child and crosses as a marker (``fastloader.image.batch_ring``), so the training
process's work per batch is taking the marker and wrapping the slot as tensors. A dataset without one sends its
batches pickled through the result pipe (tensors through torch's shared memory, as from a worker process).

How it fits the backend interface: torch's iterator asks :class:`SubprocessBackend` for ``num_workers`` processes;
each is a :class:`PipelineWorker`, a stand-in whose ``start()`` hands its arguments over, and the last one starts
the one child with all of them (:func:`run_pipeline`: the thread workers' loop,
``fastloader.loader.workers.thread``, once per worker). Every stand-in answers ``pid``, ``is_alive()``,
``exitcode``, ``join()`` and ``terminate()`` for that child. A child is started per torch iterator: once per
loader with ``persistent_workers=True``, else once per epoch.

The child is started by ``multiprocessing_context`` (default ``"forkserver"``): a fresh interpreter forked from
the fork server, which never imported the training script's CUDA state, so the child cannot inherit a CUDA
context; the dataset and ``collate_fn`` are pickled to it once (one pickle for all its workers). ``"spawn"`` works
too; ``"fork"`` is the user's choice and safe only while this process has not initialised CUDA (as for torch's
worker processes). Inside, the workers are thread workers: ``get_worker_info()`` per thread, with
``worker_method="thread"`` and its ``rng``, and the same draws as in the other modes.

Lifetimes: the child dies with the training process: a watchdog thread in it exits the process when the pipe the
training process holds open reaches EOF (:func:`_die_with_parent`). A child that dies (SIGKILL, a crash in a
sample) is seen while the training process waits for a batch: the wait looks at the child every :data:`POLL_S`
seconds and raises :class:`~fastloader.errors.PipelineLost` naming the mode, never hangs. A dataset's exception
is re-raised as torch re-raises a worker's, with the original traceback's text and the worker's id.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing

from fastloader.errors import PipelineLost
from fastloader.image import ring_fork
from fastloader.loader.workers.thread import thread_worker_loop
from fastloader.torch_internals import WorkerSet, enable_thread_workers, thread_worker_parts

POLL_S = 0.5  # how often a wait for a batch looks whether the child is alive: the bound on seeing it die
DEFAULT_START = "forkserver"


class SubprocessBackend:
    """What torch's iterator takes as its ``multiprocessing_context``: queues and events between processes,
    and one child for all its workers (see the module docstring)."""

    threads = False  # a child process exists (torch_internals.MultiProcessIterStartingAt)

    def __init__(self, context: Any = None) -> None:
        self._context: Any = torch.multiprocessing.get_context(DEFAULT_START) if context is None else context
        self._pending: list[tuple[Any, ...]] = []
        self.process: Any = None  # the child, once the last worker's arguments arrived
        self._alive: Any = None  # the write end of the pipe the child's watchdog reads

    def Queue(self) -> Any:  # noqa: N802 - multiprocessing's name
        return self._context.Queue()

    def Event(self) -> Any:  # noqa: N802
        return self._context.Event()

    def Process(self, target: Callable[..., None], args: tuple[Any, ...]) -> PipelineWorker:  # noqa: N802
        if target is not thread_worker_parts().worker_loop:
            raise ValueError(f"the subprocess pipeline runs torch's worker loop's protocol, not {target!r}")
        return PipelineWorker(self, args)

    def add(self, args: tuple[Any, ...]) -> None:
        """A worker's arguments (torch's order); the last of ``num_workers`` starts the child with them all."""
        self._pending.append(args)
        if len(self._pending) < int(args[11]):
            return
        reader, self._alive = self._context.Pipe(duplex=False)
        inherited = self._alive.fileno() if self._context.get_start_method() == "fork" else None
        process = self._context.Process(
            target=run_pipeline, args=(self._pending, reader, inherited), name="fastloader-pipeline", daemon=True
        )
        self._pending = []
        process.start()
        reader.close()  # the child's copy is its own: EOF reaches it when this process's end closes
        self.process = process

    def ended(self) -> None:
        """The child is gone: the watchdog's pipe is closed here too."""
        if self._alive is not None and self.process is not None and not self.process.is_alive():
            self._alive.close()
            self._alive = None


class PipelineWorker:
    """One of torch's worker "processes": a part of the one child (its pid, its liveness, its end)."""

    def __init__(self, backend: SubprocessBackend, args: tuple[Any, ...]) -> None:
        self._backend = backend
        self._args: tuple[Any, ...] | None = args
        self.daemon = True
        self.worker_id = int(args[10])

    def start(self) -> None:
        args, self._args = self._args, None
        if args is None:
            raise RuntimeError(f"pipeline worker {self.worker_id} started twice")
        self._backend.add(args)

    @property
    def pid(self) -> int | None:
        process = self._backend.process
        return None if process is None else int(process.pid)

    @property
    def exitcode(self) -> int | None:
        process = self._backend.process
        return None if process is None else process.exitcode

    def is_alive(self) -> bool:
        process = self._backend.process
        return process is not None and bool(process.is_alive())

    def join(self, timeout: float | None = None) -> None:
        process = self._backend.process
        if process is not None:
            process.join(timeout)
            self._backend.ended()

    def terminate(self) -> None:
        process = self._backend.process
        if process is not None and process.is_alive():
            process.terminate()

    def kill(self) -> None:
        process = self._backend.process
        if process is not None and process.is_alive():
            process.kill()


class PipelineWatch:
    """The wait for the next result (torch's ``_try_get_data``): the child is looked at every :data:`POLL_S`
    seconds, and its death is :class:`PipelineLost` (torch's iterator's recovery hook, ``WorkerRecovery``)."""

    def __init__(self, workers: WorkerSet) -> None:
        self._workers = workers

    def filtered(self, index: Any) -> Any:
        return index

    def get(self, timeout: float) -> tuple[bool, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return True, self._workers.receive(max(0.0, min(POLL_S, deadline - time.monotonic())))
            except queue.Empty:
                self._check()
                if time.monotonic() >= deadline:
                    return False, None
            except (OSError, EOFError):  # a batch's shared memory its dead sender cannot hand over
                self._check()
                raise

    def _check(self) -> None:
        processes = self._workers.processes
        if not processes or processes[0].is_alive():
            return
        process = processes[0]
        code = process.exitcode
        how = f"killed by signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        raise PipelineLost(
            f"the worker_method='subprocess' pipeline process (pid {process.pid}) died ({how}): its batches in"
            " flight are lost. A sample that crashes the process kills all its workers in this mode; with"
            " worker_method='process', on_error='skip' or 'replace' restarts a killed worker instead"
        )


# --- in the child -----------------------------------------------------------------------------------------


def run_pipeline(worker_args: list[tuple[Any, ...]], alive: Any, inherited: int | None) -> None:
    """The child's main: its workers' threads (torch's worker loop, one thread each), until every one stops."""
    _die_with_parent(alive, inherited)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's to handle, as torch's workers
    torch.set_num_threads(1)  # as in torch's worker processes: the workers are the parallelism
    enable_thread_workers()
    where = f"of the worker_method='subprocess' pipeline (pid {os.getpid()})"
    data_queue, done_event = worker_args[0][3], worker_args[0][4]
    threads = [
        threading.Thread(
            target=thread_worker_loop,
            args=args,
            kwargs={"where_suffix": where},
            name=f"fastloader-worker-{args[10]}",
            daemon=True,
        )
        for args in worker_args
    ]
    del worker_args  # each thread holds its own arguments (and pops its dataset)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if done_event.is_set():
        data_queue.cancel_join_thread()  # torch's worker loop: results nobody reads any more are not flushed
        data_queue.close()


def _die_with_parent(alive: Any, inherited: int | None) -> None:
    """This child ends when the training process does: a thread exits it once the training process's end of
    ``alive`` is closed, by the training process or by its death (whatever killed it). Not ``PR_SET_PDEATHSIG``:
    the fork server is this child's parent, and under spawn the signal follows the thread that started it."""
    if inherited is not None:
        os.close(inherited)  # forked: this copy of the write end would keep the pipe open forever
        ring_fork.let_go_inherited()  # and this child never reads the batches its parent held

    def watch() -> None:
        try:
            alive.recv_bytes()
        except (EOFError, OSError):
            pass
        os._exit(0)

    threading.Thread(target=watch, name="fastloader-pipeline-watchdog", daemon=True).start()
