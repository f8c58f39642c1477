"""The private parts of torch's worker loop that fastloader relies on, in worker processes and thread workers.

The worker processes (``torch.utils.data._utils.worker``):

* ``_DatasetKind.create_fetcher``: torch's worker loop makes its fetcher with it after ``worker_init_fn``;
  a DataLoaderX worker installs a factory that wraps it (:func:`torch_fetcher_factory`,
  :func:`install_fetcher_factory`);
* ``_worker_loop``'s local ``data_queue`` (its result queue, a ``multiprocessing.Queue``, of which it calls
  ``put``): a worker that may be restarted writes its results into a pipe of its own (:func:`send_results_with`);
* ``_worker_info`` (a frozen dataclass): a resumed worker's seed is set where ``get_worker_info()`` reads it,
  and ``_generate_state``: how the worker loop seeds numpy (:func:`set_worker_seed`, :func:`numpy_seed`).

Thread workers (``worker_method="thread"``, ``fastloader.loader.workers.thread``): torch 2.14 has the parts of
its thread workers (``WorkerInfo.worker_method`` and ``.rng``, ``_utils.worker._RNG``,
``torch.random.thread_safe_generator()``) but no loader that runs them, and ``get_worker_info()`` returns one
module global. :func:`enable_thread_workers` gives that function (its code object: every alias torch has of it,
and every name a user imported of it, is the one function) a thread-local answer first: a thread worker's
``WorkerInfo`` in that thread, torch's global everywhere else (a worker process's, None in the training
process). torch's ``collate_tensor_fn`` (``_utils.collate``) asks it whether to build the batch in shared
memory: a thread worker answers it None (the batch stays in this process). The worker loop's parts a thread
loop reuses: ``_DatasetKind.create_fetcher``, ``_ResumeIteration``, ``_IterableDatasetStopIteration``,
``torch._utils.ExceptionWrapper``, ``MP_STATUS_CHECK_INTERVAL`` and ``graph_settings.apply_random_seed``
(:func:`thread_worker_parts`).
"""

from __future__ import annotations

import dataclasses
import random
import sys
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.utils.data._utils.collate as _collate
import torch.utils.data._utils.worker as _worker
import torch.utils.data.graph_settings
from torch.utils.data import _DatasetKind

# --- the worker processes ---------------------------------------------------------------------------------

FetcherFactory = Callable[[Any, Any, bool, Any, bool], Any]  # (kind, dataset, auto_collation, collate_fn, drop_last)


def torch_fetcher_factory() -> FetcherFactory:
    """The factory torch's worker loop makes its fetcher with (this process's, as installed now; in a thread
    worker, torch's own)."""
    factory: FetcherFactory = _DatasetKind.create_fetcher
    return factory


def install_fetcher_factory(factory: FetcherFactory) -> None:
    """Have this worker's loop make its fetchers with ``factory``: in a worker process torch's class is patched
    (it is the whole process's); in a thread worker the thread's loop is told (:func:`thread_worker`)."""
    if _THREAD_WORKER.info is not None:
        _THREAD_WORKER.create_fetcher = factory
        return
    _DatasetKind.create_fetcher = staticmethod(factory)  # type: ignore[method-assign]


def send_results_with(put: Callable[..., None]) -> None:
    """In a worker process, from its ``worker_init_fn``: torch's worker loop hands each result (and its answer to
    torch's reset) to ``put`` in place of its result queue's ``put`` (which a feeder thread writes, under the
    lock every worker shares)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code is not _worker._worker_loop.__code__:
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        raise RuntimeError("send_results_with runs inside torch's worker loop only")
    frame.f_locals["data_queue"].put = put


def set_worker_seed(seed: int) -> None:
    """Make ``get_worker_info().seed`` say ``seed`` in this worker process (in a thread worker: its ``seed``, and
    its ``rng`` seeded anew, as :func:`thread_worker_info` seeds a thread of base seed ``seed - id``)."""
    info = _THREAD_WORKER.info
    if info is not None:
        _THREAD_WORKER.info = dataclasses.replace(info, seed=seed, rng=_thread_rng(seed - info.id, info.id))
        return
    info = _worker._worker_info
    if info is None:
        raise RuntimeError("set_worker_seed runs in DataLoader worker processes only")
    _worker._worker_info = dataclasses.replace(info, seed=seed)


def numpy_seed(base_seed: int, worker_id: int) -> list[int]:
    """What torch's worker loop seeds numpy with for ``base_seed`` and ``worker_id``."""
    state: list[int] = _worker._generate_state(base_seed, worker_id)
    return state


# --- thread workers ---------------------------------------------------------------------------------------


class _ThreadWorker(threading.local):
    """This thread's worker: its ``WorkerInfo`` (None: not a thread worker) and the fetcher factory its loop
    makes fetchers with (None: torch's)."""

    info: Any = None
    create_fetcher: FetcherFactory | None = None


_THREAD_WORKER = _ThreadWorker()
_THREADS_ENABLED = threading.Lock()
_COLLATE_TENSOR = _collate.collate_tensor_fn.__code__


def _thread_worker_info(process_info: Any) -> Any:
    """What ``get_worker_info()`` returns once :func:`enable_thread_workers` ran (see the module docstring)."""
    info = _THREAD_WORKER.info
    if info is None:
        return process_info
    if sys._getframe(2).f_code is _COLLATE_TENSOR:  # torch's collate asks: shared memory for a process only
        return None
    return info


def _get_worker_info() -> Any:  # its code becomes torch's get_worker_info's (names resolved in torch's module)
    return _fastloader_thread_worker_info(_worker_info)  # type: ignore[name-defined]  # noqa: F821


def enable_thread_workers() -> None:
    """Make torch's ``get_worker_info()`` answer per thread (once per process; see the module docstring)."""
    with _THREADS_ENABLED:
        function = _worker.get_worker_info
        if function.__code__ is _get_worker_info.__code__:
            return
        _worker.__dict__["_fastloader_thread_worker_info"] = _thread_worker_info
        function.__code__ = _get_worker_info.__code__


def thread_worker_info(worker_id: int, num_workers: int, base_seed: int, dataset: Any) -> Any:
    """torch's ``WorkerInfo`` for thread worker ``worker_id``: ``worker_method="thread"``, its seed (``base_seed +
    worker_id``, as a worker process's) and ``rng``: a ``random.Random``, a ``torch.Generator`` and a numpy
    ``RandomState`` of its own, seeded as torch seeds a worker process's global generators (the same draws; a
    saved state of either moves to the other, ``fastloader.loader.rng_states``)."""
    return _worker.WorkerInfo(
        id=worker_id,
        num_workers=num_workers,
        seed=base_seed + worker_id,
        dataset=dataset,
        rng=_thread_rng(base_seed, worker_id),
        worker_method="thread",
    )


def _thread_rng(base_seed: int, worker_id: int) -> Any:
    seed = base_seed + worker_id
    generator = torch.Generator()
    generator.manual_seed(seed)
    numpy = np.random.RandomState(numpy_seed(base_seed, worker_id))
    return _worker._RNG(random_generator=random.Random(seed), torch_generator=generator, numpy_generator=numpy)


def set_thread_worker(info: Any) -> None:
    """This thread is thread worker ``info`` (a :func:`thread_worker_info`) from now; None: no longer."""
    _THREAD_WORKER.info = info
    _THREAD_WORKER.create_fetcher = None


def thread_worker() -> tuple[Any, FetcherFactory]:
    """This thread's ``WorkerInfo`` (None outside a thread worker) and the fetcher factory its loop uses."""
    return _THREAD_WORKER.info, _THREAD_WORKER.create_fetcher or _DatasetKind.create_fetcher


def thread_worker_parts() -> SimpleNamespace:
    """The parts of torch's worker loop a thread worker loop reuses (see the module docstring)."""
    return SimpleNamespace(
        worker_loop=_worker._worker_loop,
        resume=_worker._ResumeIteration,
        stop=_worker._IterableDatasetStopIteration,
        exception_wrapper=torch._utils.ExceptionWrapper,
        iterable_kind=_DatasetKind.Iterable,
        check_interval=_worker.MP_STATUS_CHECK_INTERVAL,
        apply_random_seed=torch.utils.data.graph_settings.apply_random_seed,
    )
