"""The private parts of torch's DataLoader and its iterators that fastloader relies on (see the package).

The loader (``torch.utils.data.DataLoader``):

* ``DataLoader._get_iterator()``: torch's ``__iter__`` calls it to make each iterator; DataLoaderX overrides it
  to hand torch a view of the loader (``fastloader.loader.torch_iter``).
* ``DataLoader._index_sampler`` (a property): the sampler or batch sampler torch's iterator takes its indices
  from (:func:`index_sampler`);
* torch's iterator reads its configuration from the loader it is given, by attribute (``_index_sampler``,
  ``_dataset_kind``, ``_auto_collation``, ``collate_fn``, ...): a :class:`LoaderView` answers with some
  replaced (the resume cursor's index stream, the stage clock's timed collate) and leaves the loader's own.
* ``DataLoader._iterator``: the one iterator torch keeps with persistent workers (:func:`persistent_iterator`);
  DataLoaderX drops it to restart the workers for a loaded state (:func:`drop_persistent_iterator`).

The iterator (``_BaseDataLoaderIter`` and ``_MultiProcessingDataLoaderIter``):

* ``_base_seed``: the workers' base seed it drew (the resume state and the flips' seed, :func:`base_seed`);
* ``_data_queue``: the batches the workers finished, for the stage clock's queue depth (:func:`batches_in_workers`);
* ``_IterableDataset_len_called``, ``_dataset``, ``_num_workers``: its "more samples than len()" check, which
  DataLoaderX makes in the training loop's thread instead of the producer's (:func:`take_reported_length`);
* ``_shutdown_workers()``: stop the workers from the producer thread (:func:`shutdown_workers`);
* ``_workers``, ``_task_info``, ``_rcvd_idx``: the stall watchdog names the worker holding the awaited batch
  (:func:`worker_processes`, :func:`awaited_batch`);
* subclassing ``_MultiProcessingDataLoaderIter``: ``_reset(loader, first_iter)`` sets
  ``_worker_queue_idx_cycle`` right before the first requests go out; a resumed epoch starts that cycle at
  another worker; ``_shutdown_workers()`` (which sets ``_shutdown`` once it has stopped the workers) is
  followed by a callback: the batch ring takes back the slots of workers now dead; ``_try_put_index()`` draws
  the next indices and sends them as task ``_send_idx`` to the worker it records in ``_task_info`` (or to none:
  no worker can take it), told to the batch ring, which then knows which worker has which slot; and
  ``_mark_worker_as_unavailable(worker_id)`` is where torch's ``_try_get_data`` records a worker it found dead:
  the ring hears of it there (:class:`MultiProcessIterStartingAt`, :class:`WorkerEvents`);
* restarting a dead worker (``fastloader.loader.worker_restart``, through :class:`WorkerSet`): the iterator's
  ``_try_get_data(timeout)`` (where torch notices a dead worker) and ``_next_index()`` (each batch of indices
  before it is sent) are overridden; ``_workers``, ``_index_queues`` (one per worker, replaced for a new
  worker), ``_worker_result_queue`` (its ``get``, ``put``, ``qsize`` and ``close`` are replaced: the workers'
  pipes are read instead; torch's pin-memory thread calls its ``get``, torch puts into it to wake that thread
  and closes it at shutdown), ``_data_queue``, ``_task_info`` (a task is
  outstanding while its entry holds the worker id alone), ``_worker_init_fn``, ``_base_seed``,
  ``_shared_seed``, ``_dataset_kind``, ``_dataset``, ``_auto_collation``, ``_collate_fn``, ``_drop_last``,
  ``_persistent_workers``, ``_workers_done_event``, ``_shutdown``; a worker process is started as torch's
  ``__init__`` starts one (``_utils.worker._worker_loop`` and its arguments); torch's reset sends each worker
  a ``_utils.worker._ResumeIteration`` that the worker sends back; ``_utils.signal_handling._remove_worker_pids``
  and ``_worker_pids_set``: the SIGCHLD handler torch installs ends the run when a registered worker dies;
* subclassing ``_SingleProcessDataLoaderIter``: its ``__init__`` re-made from ``_BaseDataLoaderIter.__init__``,
  ``_DatasetKind.create_fetcher`` and the iterator's ``_dataset_kind``, ``_auto_collation``, ``_collate_fn``,
  ``_drop_last``, ``_timeout``, ``_num_workers``, ``_world_size``, ``_rank``, ``_dataset_fetcher``, so that the
  fetcher can be wrapped (:class:`SingleProcessIterWith`, :func:`fetcher_of`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
import torch.utils.data._utils.signal_handling as _signal_handling
import torch.utils.data._utils.worker as _worker
import torch.utils.data.graph_settings
from torch.utils.data import DataLoader, IterDataPipe, MapDataPipe, _DatasetKind
from torch.utils.data.dataloader import (
    _BaseDataLoaderIter,
    _MultiProcessingDataLoaderIter,
    _SingleProcessDataLoaderIter,
)

# --- the loader -------------------------------------------------------------------------------------------


def index_sampler(loader: DataLoader[Any]) -> Any:
    """What torch's iterator would take its indices from (``DataLoader._index_sampler``)."""
    return DataLoader._index_sampler.fget(loader)  # type: ignore[attr-defined]


def persistent_iterator(loader: DataLoader[Any]) -> Any:
    """The iterator torch keeps with persistent workers; None before the first ``iter()`` (or when dropped)."""
    return loader._iterator


def keep_persistent_iterator(loader: DataLoader[Any], iterator: Any) -> None:
    """Make ``iterator`` the one torch keeps with persistent workers (what :func:`persistent_iterator` sees)."""
    loader._iterator = iterator


def drop_persistent_iterator(loader: DataLoader[Any]) -> None:
    """Forget the persistent iterator and shut its workers down: the next ``iter()`` starts new ones."""
    iterator, loader._iterator = loader._iterator, None
    shutdown_workers(iterator)


class LoaderView:
    """``loader`` as a torch iterator made from this view sees it: ``index_sampler`` and ``overrides`` (public
    arguments such as ``collate_fn``) in place of the loader's, every other attribute the loader's."""

    def __init__(self, loader: DataLoader[Any], index_sampler: Any, **overrides: Any) -> None:
        self._loader = loader
        self._index_sampler = index_sampler
        self.__dict__.update(overrides)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_loader"], name)


# --- the iterator -----------------------------------------------------------------------------------------


def base_seed(iterator: Any) -> int:
    """The base seed the iterator drew for its workers (torch draws it for ``num_workers=0`` too)."""
    return int(getattr(iterator, "_base_seed", 0))


def batches_in_workers(iterator: Any) -> int:
    """Batches done by the workers and not yet taken from torch's result queue (0 when unknown)."""
    queue = getattr(iterator, "_data_queue", None)
    try:
        return int(queue.qsize()) if queue is not None else 0
    except (NotImplementedError, OSError):  # macOS has no sem_getvalue
        return 0


def take_reported_length(iterator: Any) -> tuple[int | None, Any, int]:
    """Take over torch's check that an IterableDataset gives no more samples than ``len(loader)`` said: the
    length reported (None: not asked, the check is off in torch's iterator from now), the dataset and the
    number of workers, for the warning torch would give."""
    reported = getattr(iterator, "_IterableDataset_len_called", None)
    if reported is not None:
        iterator._IterableDataset_len_called = None
    return reported, getattr(iterator, "_dataset", None), int(getattr(iterator, "_num_workers", 0))


def shutdown_workers(iterator: Any) -> None:
    """Stop the iterator's worker processes (and its pin-memory thread); nothing for a single-process one."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if callable(shutdown):
        shutdown()


def worker_processes(iterator: Any) -> list[Any]:
    """The iterator's worker processes (``multiprocessing.Process``), in worker id order."""
    return list(getattr(iterator, "_workers", []) or [])


def awaited_batch(iterator: Any) -> tuple[int, int | None] | None:
    """The task number of the batch the iterator returns next, and the worker it was sent to while that
    worker has not answered (else None); None for an iterator without workers."""
    try:
        awaited = int(iterator._rcvd_idx)
        info = iterator._task_info.get(awaited)
    except AttributeError:
        return None
    return awaited, int(info[0]) if info is not None and len(info) == 1 else None


def fetcher_of(iterator: Any) -> Any:
    """A single-process iterator's fetcher (what turns indices into a batch)."""
    return iterator._dataset_fetcher


class WorkerRecovery(Protocol):
    """What restarts dead workers (``fastloader.loader.worker_restart.WorkerRestarts``), as the iterator calls it."""

    def get(self, timeout: float) -> tuple[bool, Any]: ...

    def filtered(self, index: Any) -> Any: ...


class WorkerEvents(Protocol):
    """What a :class:`MultiProcessIterStartingAt` tells about its workers (the batch ring's dispatch)."""

    def sent(self, worker: int | None) -> None:
        """The indices just drawn went to ``worker`` (None: to no worker, torch dropped them)."""

    def worker_lost(self, worker: int) -> object:
        """torch found ``worker`` dead (it writes nothing any more) and goes on without it."""

    def workers_stopped(self, iterator: Any) -> None:
        """torch's ``_shutdown_workers()`` stopped the workers (once)."""


class MultiProcessIterStartingAt(_MultiProcessingDataLoaderIter):
    """torch's multi-process iterator whose round of requests starts at worker ``first_worker()`` in each epoch
    (torch starts it at worker 0): asked right before the first requests go out. ``events`` hears where each
    batch of indices went, which worker torch found dead, and (once) that ``_shutdown_workers()`` stopped the
    workers (at the end of an epoch, when dropped). ``recovery(workers)``: made once the workers are started,
    before the first request, it takes over the wait for results (a dead worker is restarted, not an error)
    and sees each batch of indices before it is sent; torch's SIGCHLD handler then no longer watches these
    workers, and ``events`` hears of no lost worker (a restarted one keeps its id and its slots)."""

    def __init__(
        self,
        loader: Any,
        first_worker: Callable[[], int],
        events: WorkerEvents | None = None,
        recovery: Callable[[WorkerSet], WorkerRecovery] | None = None,
    ) -> None:
        self._first_worker_of = first_worker
        self._first_worker = 0
        self._events = events  # before torch's __init__: its first requests go out there
        self._make_recovery = recovery
        self._recovery: WorkerRecovery | None = None
        self._mp_context = loader.multiprocessing_context or torch.multiprocessing
        super().__init__(loader)

    def _shutdown_workers(self) -> None:
        super()._shutdown_workers()
        events = self.__dict__.get("_events")
        if events is not None and self.__dict__.get("_shutdown"):  # torch skips it at interpreter exit
            self._events = None  # once: torch calls this again when the iterator is collected
            events.workers_stopped(self)

    def _try_put_index(self) -> None:
        events = self.__dict__.get("_events")
        task = self._send_idx
        super()._try_put_index()
        if events is not None:
            events.sent(self._task_info[task][0] if self._send_idx > task else None)

    def _mark_worker_as_unavailable(self, worker_id: int, shutdown: bool = False) -> None:
        super()._mark_worker_as_unavailable(worker_id, shutdown)
        events = self.__dict__.get("_events")
        restarts = self.__dict__.get("_recovery") is not None  # a worker restarted keeps its slots
        if events is not None and not shutdown and not restarts and not self._workers[worker_id].is_alive():
            events.worker_lost(worker_id)  # (alive: an IterableDataset's worker that ran out of data)

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        self._first_worker = self._first_worker_of()
        if first_iter and self._worker_pids_set and getattr(self._mp_context, "threads", False):
            # thread workers (fastloader.loader.workers.thread) are this process: no child for SIGCHLD to watch
            _signal_handling._remove_worker_pids(id(self))
            self._worker_pids_set = False
        make = self.__dict__.get("_make_recovery")
        if first_iter and make is not None:  # torch's __init__: the workers started, no request sent yet
            if self._worker_pids_set:
                # torch's SIGCHLD handler raises in the main thread as soon as a registered worker dies
                _signal_handling._remove_worker_pids(id(self))
                self._worker_pids_set = False
            self._recovery = make(WorkerSet(self))
        super()._reset(loader, first_iter)

    def _try_get_data(self, timeout: float = _worker.MP_STATUS_CHECK_INTERVAL) -> tuple[bool, Any]:
        recovery = self.__dict__.get("_recovery")
        if recovery is None:
            result: tuple[bool, Any] = super()._try_get_data(timeout)
            return result
        return recovery.get(timeout)

    def _next_index(self) -> Any:
        index = super()._next_index()
        recovery = self.__dict__.get("_recovery")
        return index if recovery is None else recovery.filtered(index)

    @property  # type: ignore[override]
    def _worker_queue_idx_cycle(self) -> Iterator[int]:
        cycle: Iterator[int] = self.__dict__["_cycle"]
        return cycle

    @_worker_queue_idx_cycle.setter
    def _worker_queue_idx_cycle(self, cycle: Iterator[int]) -> None:
        # torch makes a new cycle at each epoch, right before it sends the first requests
        self.__dict__["_cycle"] = itertools.islice(cycle, self._first_worker, None)


@dataclasses.dataclass(frozen=True)
class TaggedResume(_worker._ResumeIteration):
    """torch's "new epoch" message to one worker, which the worker sends back: tagged with the worker's id, so
    the acknowledgement names who sent it."""

    worker: int = -1


def resume_message(item: Any) -> bool:
    """Whether ``item``, put into a worker's index queue, is torch's "new epoch" message."""
    return isinstance(item, _worker._ResumeIteration)


class WorkerSet:
    """The worker processes of one :class:`MultiProcessIterStartingAt` and its queues, for restarting one."""

    def __init__(self, iterator: MultiProcessIterStartingAt) -> None:
        self._it = iterator

    @property
    def processes(self) -> list[Any]:
        return list(self._it._workers)

    @property
    def shut_down(self) -> bool:
        return bool(self._it._shutdown)

    @property
    def init_fn(self) -> Any:
        return self._it._worker_init_fn

    def index_queue(self, worker: int) -> Any:
        return self._it._index_queues[worker]

    def set_index_queue(self, worker: int, index_queue: Any) -> None:
        self._it._index_queues[worker] = index_queue

    def outstanding(self, task: int) -> bool:
        """Whether torch still waits for task ``task``'s result (sent, not received)."""
        info = self._it._task_info.get(task)
        return info is not None and len(info) == 1

    def receive(self, timeout: float) -> Any:
        """The next result (``(task, data)``) the workers sent; raises ``queue.Empty`` after ``timeout`` s."""
        return self._it._data_queue.get(timeout=timeout)

    def guard_results(self, unreadable: Callable[[BaseException], Any]) -> None:
        """A result that cannot be unpickled becomes ``(unreadable(error), None)``, where the workers' results are
        read (this process, or torch's pin-memory thread, which would die of the error). A batch's tensors
        travel as file descriptors its worker hands out on request: once that worker is dead they are gone."""
        results = self._it._worker_result_queue
        get = results.get

        def guarded_get(*args: Any, **kwargs: Any) -> Any:
            try:
                return get(*args, **kwargs)
            except (OSError, EOFError) as error:
                return unreadable(error), None

        results.get = guarded_get  # type: ignore[method-assign]  # the instance's: torch's pin-memory thread looks it up at each call

    def read_results_from(self, reader: Any) -> None:
        """The workers' results are ``reader``'s (its ``get``, ``put``, ``qsize``, ``close``): it takes the place of
        the result queue where it is read (this process, torch's pin-memory thread) and written (torch's wake-up
        of that thread at shutdown)."""
        results = self._it._worker_result_queue
        close = results.close

        def closed() -> None:
            reader.close()
            close()

        # The instance's: torch's pin-memory thread looks get up at each call.
        results.get, results.put, results.qsize = reader.get, reader.put, reader.qsize  # type: ignore[method-assign]
        results.close = closed  # type: ignore[method-assign]

    def new_queue(self) -> Any:
        index_queue = self._it._mp_context.Queue()
        index_queue.cancel_join_thread()
        return index_queue

    def start(self, worker: int, index_queue: Any, init_fn: Any) -> Any:
        """Start worker ``worker`` anew, as torch's ``__init__`` starts it, reading ``index_queue`` and with
        ``init_fn``; it takes the place of the dead one (``_workers``)."""
        it = self._it
        args = (
            it._dataset_kind,
            [it._dataset],
            index_queue,
            it._worker_result_queue,
            it._workers_done_event,
            it._auto_collation,
            it._collate_fn,
            it._drop_last,
            it._base_seed,
            init_fn,
            worker,
            it._num_workers,
            it._persistent_workers,
            it._shared_seed,
        )
        process = it._mp_context.Process(target=_worker._worker_loop, args=args)
        process.daemon = True
        process.start()
        it._workers[worker] = process
        return process


class SingleProcessIterWith(_SingleProcessDataLoaderIter):
    """torch's single-process iterator whose fetcher is ``wrap(torch's fetcher, dataset)``."""

    def __init__(self, loader: Any, wrap: Callable[[Any, Any], Any]) -> None:
        _BaseDataLoaderIter.__init__(self, loader)  # torch's __init__ past this point, with the wrapped fetcher
        if self._timeout != 0 or self._num_workers != 0:
            raise ValueError("the single-process iterator needs timeout=0 and num_workers=0")
        if isinstance(self._dataset, (IterDataPipe, MapDataPipe)):
            torch.utils.data.graph_settings.apply_sharding(self._dataset, self._world_size, self._rank)
        inner = _DatasetKind.create_fetcher(
            self._dataset_kind, self._dataset, self._auto_collation, self._collate_fn, self._drop_last
        )
        self._dataset_fetcher = wrap(inner, self._dataset)
