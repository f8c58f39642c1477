"""torch's iterator for one iteration of a DataLoaderX, made from a view of the loader.

torch's iterator reads what it runs from the loader (``loader.collate_fn``, ``loader.worker_init_fn``,
``loader._index_sampler``...). DataLoaderX hands it a :class:`_TorchView` with this iteration's wrappers in
their place (the timed collate of the stage clock, the workers' resume start and the watchdog's stack dumps,
the cursor's index sampler), so the loader's own attributes always stay the user's.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch.utils.data.graph_settings
from torch.utils.data import IterableDataset, IterDataPipe, MapDataPipe, _DatasetKind
from torch.utils.data.dataloader import (
    _BaseDataLoaderIter,
    _MultiProcessingDataLoaderIter,
    _SingleProcessDataLoaderIter,
)

from fastloader.loader.epoch_progress import EpochIndices, Progress
from fastloader.loader.stage_clock import TimedCollate
from fastloader.loader.watchdog import StackDumpInit
from fastloader.loader.worker_state import (
    StatefulFetcher,
    WorkerPlan,
    WorkerStart,
    WorkerState,
    restore_dataset,
    stateful,
)

if TYPE_CHECKING:
    from fastloader.loader.dataloader import DataLoaderX


class _TorchView:
    """A DataLoaderX as torch's iterator sees it: some attributes replaced, the rest the loader's."""

    def __init__(self, loader: DataLoaderX[Any], **overrides: Any) -> None:
        self._loader = loader
        self.__dict__.update(overrides)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_loader"], name)


class _ResumingIterator(_MultiProcessingDataLoaderIter):
    """torch's multi-process iterator whose round of requests starts at the worker that made no batch of the
    resumed epoch yet (torchdata's StatefulDataLoader turns the same cycle): each worker resumes its own part
    of an IterableDataset, and with a map-style one the batch goes to the worker whose random state it had."""

    _first_worker = 0

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        progress = loader._cursor.current
        self._first_worker = progress.plan.next_worker if progress is not None else 0
        super()._reset(loader, first_iter)

    @property  # type: ignore[override]
    def _worker_queue_idx_cycle(self) -> Iterator[int]:
        cycle: Iterator[int] = self.__dict__["_cycle"]
        return cycle

    @_worker_queue_idx_cycle.setter
    def _worker_queue_idx_cycle(self, cycle: Iterator[int]) -> None:
        # torch makes a new cycle at each epoch, right before it sends the first requests
        self.__dict__["_cycle"] = itertools.islice(cycle, self._first_worker, None)


class _ResumingSingleProcess(_SingleProcessDataLoaderIter):
    """torch's single-process iterator with the stateful fetcher (``restore_later``: the dataset's state of a
    resumed position goes back right before the first batch after it is fetched)."""

    def __init__(self, loader: Any, restore: WorkerState | None, restore_later: bool) -> None:
        _BaseDataLoaderIter.__init__(self, loader)  # torch's __init__ past this point, with our fetcher
        if self._timeout != 0 or self._num_workers != 0:
            raise ValueError("the single-process iterator needs timeout=0 and num_workers=0")
        if isinstance(self._dataset, (IterDataPipe, MapDataPipe)):
            torch.utils.data.graph_settings.apply_sharding(self._dataset, self._world_size, self._rank)
        inner = _DatasetKind.create_fetcher(
            self._dataset_kind, self._dataset, self._auto_collation, self._collate_fn, self._drop_last
        )
        self._dataset_fetcher = StatefulFetcher(inner, self._dataset, 0, False, restore, restore_later=restore_later)


def make_iterator(loader: DataLoaderX[Any]) -> Any:
    """torch's iterator for the cursor's current iteration (DataLoaderX._get_iterator)."""
    cursor = loader._cursor
    progress = cursor.current
    if progress is None:
        raise RuntimeError("DataLoaderX._get_iterator runs inside DataLoaderX.__iter__ only")
    plan = progress.plan
    workers = loader.num_workers > 0
    init_fn = loader.worker_init_fn
    if loader._stack_dir is not None and workers:
        init_fn = StackDumpInit(loader._stack_dir.path, init_fn)
    view = _TorchView(
        loader,
        collate_fn=TimedCollate(loader.collate_fn) if loader._stage_clock else loader.collate_fn,
        worker_init_fn=WorkerStart(WorkerPlan(plan.base_seed, plan.workers), init_fn) if workers else init_fn,
        _index_sampler=EpochIndices(cursor, loader._torch_index_sampler(), in_workers=workers),
    )
    if workers:
        loader.check_worker_number_rationality()
        return _ResumingIterator(view)
    return _single_process(loader, view, progress)


def _single_process(loader: DataLoaderX[Any], view: _TorchView, progress: Progress) -> _ResumingSingleProcess:
    """With num_workers=0 the dataset is this process's, and so is its random state: a dataset's own state
    goes back where it was taken, relative to the draws of the epoch's start (torch's base seed, then the
    sampler's): a state from before the epoch's first batch before them, a later one right before the next
    batch is fetched (after them)."""
    plan = progress.plan
    dataset: Any = loader.dataset
    state = plan.workers.get(0) if plan.loaded is not None else None  # this process's dataset has it already
    later = state is not None and state.get("batches", 0) > 0 and not isinstance(dataset, IterableDataset)
    if not later:
        restore_dataset(dataset, state)
    if not isinstance(dataset, IterableDataset) and stateful(dataset):
        progress.workers.setdefault(0, {"batches": 0, "dataset": copy.deepcopy(dataset.state_dict())})
    single = _ResumingSingleProcess(view, state, restore_later=later)
    if isinstance(dataset, IterableDataset):  # its iterator's state exists from here
        progress.workers.setdefault(0, single._dataset_fetcher.state_now())
    return single
