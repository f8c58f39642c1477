"""torch's iterator for one iteration of a DataLoaderX, made from a view of the loader.

torch's iterator reads what it runs from the loader (its collate function, worker_init_fn, index sampler...).
DataLoaderX hands it a view of the loader (``fastloader.torch_internals.LoaderView``) with this iteration's
wrappers in their place (the timed collate of the stage clock, the workers' resume start and the watchdog's stack
dumps, the cursor's index sampler), so the loader's own attributes always stay the user's.
"""

from __future__ import annotations

import copy
import functools
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterableDataset

from fastloader.loader.batch_slots import ring_dispatch
from fastloader.loader.dataset_protocols import stateful
from fastloader.loader.epoch_progress import EpochIndices, Progress
from fastloader.loader.result_pipes import result_pipe
from fastloader.loader.stage_clock import TimedCollate
from fastloader.loader.watchdog import StackDumpInit
from fastloader.loader.worker_restart import WorkerRestarts, restart_policy
from fastloader.loader.worker_state import (
    FetchMarks,
    StatefulFetcher,
    WorkerPlan,
    WorkerStart,
    restore_dataset,
)
from fastloader.loader.workers.subprocess import PipelineWatch, SubprocessBackend
from fastloader.loader.workers.thread import ThreadBackend
from fastloader.torch_internals import (
    LoaderView,
    MultiProcessIterStartingAt,
    SingleProcessIterWith,
    fetcher_of,
    index_sampler,
)

if TYPE_CHECKING:
    from fastloader.loader.dataloader import DataLoaderX
    from fastloader.loader.resume import ResumeCursor


def _next_worker(cursor: ResumeCursor) -> int:
    """The worker the epoch's first request goes to: the one that made no batch of the resumed epoch yet
    (torchdata's StatefulDataLoader turns the same cycle), so each worker resumes its own part of an
    IterableDataset, and with a map-style one the batch goes to the worker whose random state it had."""
    progress = cursor.current
    return progress.plan.next_worker if progress is not None else 0


def make_iterator(loader: DataLoaderX[Any]) -> Any:
    """torch's iterator for the cursor's current iteration (DataLoaderX._get_iterator)."""
    cursor = loader._cursor
    progress = cursor.current
    if progress is None:
        raise RuntimeError("DataLoaderX._get_iterator runs inside DataLoaderX.__iter__ only")
    plan = progress.plan
    workers = loader.num_workers > 0
    method = loader._plan.worker_method if workers else "process"
    threads = method == "thread"  # thread workers: one process, ordinary memory, nothing to restart
    init_fn = loader.worker_init_fn
    stack_dir = loader._runtime.stack_dir
    if stack_dir is not None and workers and not threads:
        init_fn = StackDumpInit(stack_dir.path, init_fn)
    # the batch ring is made before the workers start: they map it (fastloader.image.batch_ring)
    ring = ring_dispatch(loader) if not threads else None
    handle = ring.ring.handle() if ring is not None and workers else None
    # dead workers restarted (worker_restart.py): worker processes only, each a process of its own
    policy = restart_policy(loader) if method == "process" else None
    marks = FetchMarks(loader.num_workers) if policy is not None else None
    # each worker's result pipe (fastloader.loader.result_pipes): made before the workers start, they inherit them
    pipes = [result_pipe() for _ in range(loader.num_workers)] if policy is not None and workers else []
    overrides: dict[str, Any] = {}
    if threads:
        overrides["multiprocessing_context"] = ThreadBackend()
    elif method == "subprocess":  # one child for every worker, started as multiprocessing_context says
        overrides["multiprocessing_context"] = SubprocessBackend(loader.multiprocessing_context)
    if progress.base_draw_aside:  # the loader's generator is at the sampler's draw (ResumeCursor.begin)
        overrides["generator"] = torch.Generator()
    view = LoaderView(
        loader,
        EpochIndices(cursor, index_sampler(loader), in_workers=workers, ring=ring),
        collate_fn=TimedCollate(loader.collate_fn) if loader._plan.stage_clock else loader.collate_fn,
        worker_init_fn=WorkerStart(
            WorkerPlan(plan.base_seed, plan.workers),
            init_fn,
            handle,
            marks,
            {worker: writer for worker, (_reader, writer) in enumerate(pipes)} if pipes else None,
        )
        if workers
        else init_fn,
        **overrides,
    )
    if workers:
        loader.check_worker_number_rationality()
        # A persistent iterator outlives this epoch: it asks the cursor at each epoch's start.
        recovery: Any = None
        if policy is not None and marks is not None:
            readers = [reader for reader, _writer in pipes]
            recovery = functools.partial(
                WorkerRestarts, policy=policy, dataset=loader.dataset, marks=marks, readers=readers
            )
        elif method == "subprocess":
            recovery = PipelineWatch  # its child's death is an error naming the mode, seen while waiting
        return MultiProcessIterStartingAt(view, functools.partial(_next_worker, cursor), events=ring, recovery=recovery)
    return _single_process(loader, view, progress)


def _single_process(loader: DataLoaderX[Any], view: LoaderView, progress: Progress) -> Any:
    """With num_workers=0 the dataset is this process's, and so is its random state: a dataset's own state
    goes back where it was taken, relative to the draws of the epoch's start (torch's base seed, then the
    sampler's): a state from before the epoch's first batch before them, a later one right before the next
    batch is fetched (after them). The fetcher is the stateful one, as in the workers (``restore_later``: the
    dataset's state of a resumed position goes back right before the first batch after it is fetched)."""
    plan = progress.plan
    dataset: Any = loader.dataset
    state = plan.workers.get(0) if plan.loaded is not None else None  # this process's dataset has it already
    later = state is not None and state.get("batches", 0) > 0 and not isinstance(dataset, IterableDataset)
    if not later:
        restore_dataset(dataset, state)
    if not isinstance(dataset, IterableDataset) and stateful(dataset):
        progress.workers.setdefault(0, {"batches": 0, "dataset": copy.deepcopy(dataset.state_dict())})

    def stateful_fetcher(inner: Any, iterated: Any) -> StatefulFetcher:
        return StatefulFetcher(inner, iterated, 0, False, state, restore_later=later)

    single = SingleProcessIterWith(view, stateful_fetcher)
    if isinstance(dataset, IterableDataset):  # its iterator's state exists from here
        progress.workers.setdefault(0, fetcher_of(single).state_now())
    return single
