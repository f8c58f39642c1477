"""Thread workers (``worker_method="thread"``): ``num_workers`` threads of the training process run the dataset
and collate, behind the interface of :mod:`fastloader.loader.workers`.

torch 2.14 defines what a thread worker looks like (``WorkerInfo(worker_method="thread", rng=...)``,
``torch.random.thread_safe_generator()``) but its DataLoader runs none; so torch's multi-process iterator runs
them, with this backend in place of ``multiprocessing``: its order, ``prefetch_factor``, persistent workers,
``timeout``, ``in_order`` and exception re-raise are torch's, and the rest of DataLoaderX does not know the
difference. The thread loop (:func:`thread_worker_loop`) is torch's worker loop less what belongs to a
process: no signal handlers, no ``torch.set_num_threads(1)``, no seeding of the global generators (they are
the training loop's); each thread has its own ``WorkerInfo`` (thread-local: ``get_worker_info()``, through
every alias, answers per thread, ``fastloader.torch_internals.enable_thread_workers``) with its seed
(``base_seed + id``) and ``rng``, its generators seeded as torch seeds a worker process's globals.

Each thread works on a shallow copy of the dataset (torch's "copy of the dataset in this worker": attributes a
``worker_init_fn`` sets on ``get_worker_info().dataset`` are the thread's own; arrays, indexes and handles
inside it are shared, as a forked worker shares its pages). Batches stay in this process's ordinary memory
(no shared memory, no batch ring): a result queue hands over the objects themselves. A thread cannot be
killed: a worker stuck in the dataset keeps running until its call returns, and a sample that kills its
worker (a crash, SIGKILL) kills the training process.
"""

from __future__ import annotations

import copy
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import IterDataPipe

from fastloader.loader.stage_clock import StampedIndices
from fastloader.torch_internals import (
    LoaderView,
    MultiProcessIterStartingAt,
    enable_thread_workers,
    index_sampler,
    set_thread_worker,
    thread_worker,
    thread_worker_info,
    thread_worker_parts,
)


class WorkerQueue(queue.Queue[Any]):
    """A queue between threads, with the methods torch's iterator calls on a ``multiprocessing.Queue``."""

    def close(self) -> None:
        pass

    def cancel_join_thread(self) -> None:
        pass

    def join_thread(self) -> None:
        pass


class WorkerThread(threading.Thread):
    """A thread worker where torch's iterator keeps a worker process: started by ``Process(target, args)``."""

    def __init__(self, target: Callable[..., None], args: tuple[Any, ...]) -> None:
        if target is not thread_worker_parts().worker_loop:
            raise ValueError(f"thread workers run torch's worker loop's protocol, not {target!r}")
        super().__init__(target=thread_worker_loop, args=args, name=f"fastloader-worker-{args[10]}", daemon=True)

    @property
    def pid(self) -> int:
        return os.getpid()  # the training process: the watchdog names it

    @property
    def exitcode(self) -> int | None:
        return None if self.is_alive() else 0

    def terminate(self) -> None:
        """Nothing: a thread cannot be killed (it ends once its current fetch returns and it reads the stop)."""


class ThreadBackend:
    """What torch's iterator takes as its ``multiprocessing_context``: queues, events and workers as threads."""

    threads = True  # the workers are this process (torch_internals.MultiProcessIterStartingAt)

    def __init__(self) -> None:
        enable_thread_workers()

    def Queue(self) -> WorkerQueue:  # noqa: N802 - multiprocessing's name
        return WorkerQueue()

    def Event(self) -> threading.Event:  # noqa: N802
        return threading.Event()

    def Process(self, target: Callable[..., None], args: tuple[Any, ...]) -> WorkerThread:  # noqa: N802
        return WorkerThread(target, args)


def iterate(loader: Any) -> Any:
    """torch's multi-process iterator over a plain torch ``loader`` (autotune's trials), with thread workers."""
    view = LoaderView(loader, index_sampler(loader), multiprocessing_context=ThreadBackend())
    return MultiProcessIterStartingAt(view, lambda: 0)


def _received(index: Any) -> Any:
    """Indices as a worker process receives them: StampedIndices mark the fetch's start when unpickled
    (``fastloader.loader.stage_clock``); in a thread that moment is now, through the same function."""
    if isinstance(index, StampedIndices):
        rebuild, args = index.__reduce__()
        return rebuild(*args)
    return index


def thread_worker_loop(
    dataset_kind: Any,
    dataset_holder: list[Any],
    index_queue: WorkerQueue,
    data_queue: WorkerQueue,
    done_event: threading.Event,
    auto_collation: bool,
    collate_fn: Any,
    drop_last: bool,
    base_seed: int,
    init_fn: Callable[[int], None] | None,
    worker_id: int,
    num_workers: int,
    persistent_workers: bool,
    shared_seed: int | None,
    *,
    where_suffix: str = "",
) -> None:
    """torch's ``_worker_loop`` (same arguments, same messages) for one thread: see the module docstring.
    ``where_suffix`` follows "in DataLoader worker thread N" in a re-raised exception (the subprocess pipeline
    names its process)."""
    parts = thread_worker_parts()
    dataset = copy.copy(dataset_holder.pop())
    shared_rng = None
    if isinstance(dataset, IterDataPipe) and shared_seed is not None:  # torch's sharding of a DataPipe
        shared_rng = torch.Generator()
        shared_rng.manual_seed(shared_seed)
        dataset = parts.apply_random_seed(dataset, shared_rng)
    where = f"in DataLoader worker thread {worker_id} {where_suffix}".rstrip()
    set_thread_worker(thread_worker_info(worker_id, num_workers, base_seed, dataset))
    try:
        init_exception = None
        fetcher = None
        try:
            if init_fn is not None:
                init_fn(worker_id)
            fetcher = thread_worker()[1](dataset_kind, dataset, auto_collation, collate_fn, drop_last)
        except Exception:
            init_exception = parts.exception_wrapper(where=where)
        iteration_end = False
        while True:
            try:
                message = index_queue.get(timeout=parts.check_interval)
            except queue.Empty:
                continue
            if isinstance(message, parts.resume):
                data_queue.put((message, None))  # acknowledged: the new epoch starts
                iteration_end = False
                if shared_rng is not None:
                    shared_rng.manual_seed(message.seed)
                    dataset = parts.apply_random_seed(dataset, shared_rng)
                fetcher = thread_worker()[1](dataset_kind, dataset, auto_collation, collate_fn, drop_last)
                continue
            if message is None:
                break
            if done_event.is_set() or iteration_end:
                continue  # stopping: only the final None is awaited
            task, index = message
            data: Any
            if init_exception is not None:
                data, init_exception = init_exception, None
            else:
                try:
                    data = fetcher.fetch(_received(index))  # type: ignore[union-attr]
                except StopIteration:
                    if dataset_kind != parts.iterable_kind:
                        data = parts.exception_wrapper(where=where)
                    else:
                        data = parts.stop(worker_id)
                        iteration_end = True
                except Exception:
                    data = parts.exception_wrapper(where=where)
            data_queue.put((task, data))
            del data, task, index, message
    finally:
        set_thread_worker(None)
