"""The workers' side of resume: each worker's state travels with its batches, and a resumed worker starts there.

What a worker's state is (a :class:`Delivery`, made right after each batch, where the batch is made):

* ``batches``: how many batches this worker has made this epoch;
* ``dataset`` / ``iterator``: the dataset's own ``state_dict()`` and its iterator's, when they implement
  torchdata's Stateful protocol (``fastloader.loader.dataset_protocols``), as its StatefulDataLoader saves them;
* ``rng``: the worker process's random generators (torch, ``random``, numpy), so a resumed worker goes on
  with the same random numbers (never in the main process: its generators are the training loop's).

The training loop's thread records the delivery of each batch it receives (``fastloader.loader.resume``), so
a state always describes what the loop has, never what the workers ran ahead to. The seam: torch's worker
loop keeps the dataset's iterator in a fetcher that only exists inside the loop, so in the worker processes
of a DataLoaderX (they run nothing else) :class:`WorkerStart` has torch's fetcher factory make a
:class:`StatefulFetcher`; with ``num_workers=0`` the loader wraps its iterator's fetcher itself.

A resumed worker ``i`` starts as worker ``i`` of the interrupted run was: with its seeds (also in
``get_worker_info().seed``), then its dataset / iterator state and random generators; a worker whose dataset
keeps no state skips (fetches and drops) the batches it had made: the documented fast-forward. The resumed
epoch's first request goes to the worker that would have made the next batch (``fastloader.loader.torch_iter``).

Under a dataset's ``on_error="skip"`` / ``"replace"`` each worker also says, in :class:`FetchMarks` (shared
memory), which batch it is making right now: a worker killed by a signal names the batch that killed it
(``fastloader.loader.worker_restart``); and :class:`WorkerStart` has it write its results into a pipe of its own
(``fastloader.loader.result_pipes``).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import random
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from fastloader import read_digests, sample_seeds
from fastloader.image import ring_fork
from fastloader.image.batch_ring import RingHandle, SlotRef, arrived, attach, end_fetch
from fastloader.loader import rng_states
from fastloader.loader.dataset_protocols import stateful
from fastloader.loader.result_pipes import ResultWriter
from fastloader.loader.rng_states import RngState
from fastloader.loader.stage_clock import TimedBatch
from fastloader.timing import tally
from fastloader.torch_internals import (
    install_fetcher_factory,
    numpy_seed,
    send_results_with,
    set_worker_seed,
    torch_fetcher_factory,
)

log = logging.getLogger("fastloader")
WorkerState = Mapping[str, Any]  # {"batches": int, "dataset": ..., "iterator": ..., "rng": ... (raw)}


@dataclasses.dataclass(frozen=True)
class Delivery:
    """One worker's state right after it made a batch (or, with ``end``, after its data ran out)."""

    worker: int  # torch's worker id (0 for the main process)
    task: int | None  # the batch's place in the iteration's order of indices (map-style datasets)
    batches: int
    dataset: Any = None
    iterator: Any = None
    rng: RngState | None = None
    end: bool = False
    # The delivery ledger's (ledger=): the (index, CRC32C) of each sample whose encoded bytes the dataset read
    # for this batch (``fastloader.read_digests``); None: none taken. Not part of the worker's state.
    digests: Any = None
    # The samples of the batch an error policy left out or replaced (``read_digests.OUTCOME``); None: none.
    outcomes: Any = None
    # seed=: one uniform draw per sample of the batch for random_flip, from (seed, epoch, index)
    # (``fastloader.sample_seeds.flip_draws``); None: the flips' own generator. Not part of the worker's state.
    flips: Any = None

    def worker_state(self) -> dict[str, Any]:
        return {"batches": self.batches, "dataset": self.dataset, "iterator": self.iterator, "rng": self.rng}


@dataclasses.dataclass(frozen=True)
class WorkerPlan:
    """How the workers of one iteration start: plain data, pickled with each worker's init function."""

    base_seed: int | None = None  # the interrupted run's; None: the seeds torch draws
    workers: Mapping[int, WorkerState] = dataclasses.field(default_factory=dict)  # what each worker restores


IDLE = -1  # FetchMarks: the worker is making no batch


class FetchMarks:
    """Which batch each worker is making, in shared memory: the batch's place (``StampedIndices.task``; a
    negative number for a probe of ``fastloader.loader.worker_restart``), or :data:`IDLE`. Written by the
    workers right before and after each fetch, read by the loader's process once a worker is dead."""

    def __init__(self, workers: int) -> None:
        self.tensor = torch.full((workers,), IDLE, dtype=torch.int64).share_memory_()

    def mark(self, worker: int, task: int) -> None:
        self.tensor[worker] = task

    def read(self, worker: int) -> int:
        return int(self.tensor[worker])


_MARKS: FetchMarks | None = None  # this worker process's (set by WorkerStart)


class StatefulFetcher:
    """torch's fetcher for one worker (or the main process), its batches sent with the worker's state.

    With an IterableDataset the end of the worker's data is sent once as a batch-less delivery (torch's own
    end signal carries nothing), so a state taken after it knows where the dataset stopped.
    """

    def __init__(
        self,
        inner: Any,
        dataset: Any,
        worker: int,
        in_worker: bool,
        restore: WorkerState | None,
        restore_later: bool = False,
    ) -> None:
        self.inner = inner
        self.later = restore if restore_later else None  # the dataset's state, put back at the first fetch
        self.dataset = dataset
        self.worker = worker
        self.in_worker = in_worker
        self.iterable = isinstance(dataset, IterableDataset)
        self.batches = 0
        self.skip = 0
        self.rng_after_skip: RngState | None = None
        self.end_sent = False
        if restore is not None:
            self._restore(restore)

    def _restore(self, restore: WorkerState) -> None:
        iterator = getattr(self.inner, "dataset_iter", None)
        if restore.get("iterator") is not None and iterator is not None and stateful(iterator):
            iterator.load_state_dict(restore["iterator"])
        self.batches = int(restore.get("batches", 0))
        kept = restore.get("iterator") is not None or restore.get("dataset") is not None
        rng = restore.get("rng") if self.in_worker else None
        if self.iterable and not kept and self.batches > 0:
            self.skip = self.batches  # nothing says where the dataset was: make its batches again, unsent
            self.rng_after_skip = rng  # then the generators as they were after the last of them
        elif rng is not None:
            rng_states.restore(rng)

    def fetch(self, index: Any) -> Any:
        if self.later is not None:
            restore_dataset(self.dataset, self.later)
            self.later = None
        if self.skip:
            self._fast_forward(index)
        marks = _MARKS if self.in_worker else None
        if marks is not None:
            task = tally().task
            marks.mark(self.worker, IDLE if task is None else task)
        seeded = sample_seeds.current()
        # With num_workers=0 the global generators are the training loop's: what the samples' seeds did to
        # them is undone after the batch.
        saved = rng_states.capture() if seeded is not None and not self.in_worker else None
        try:
            data = self.inner.fetch(index) if seeded is None else self._seeded_fetch(index)
        except StopIteration:
            if not self.iterable or self.end_sent:
                raise
            self.end_sent = True
            return TimedBatch(None, None, dataclasses.replace(self._delivery(None), end=True))
        finally:
            if marks is not None:
                marks.mark(self.worker, IDLE)
            slot = self._fetch_ended()
            flips = sample_seeds.flip_draws()
            sample_seeds.end()
            if saved is not None:
                rng_states.restore(saved)
        self.batches += 1
        counted = tally()
        delivery = self._delivery(counted.task, *read_digests.take(), flips=flips)
        counted.task = None  # indices that carry no place (not a plain list) must not reuse this one
        batch = data if isinstance(data, TimedBatch) else TimedBatch(data, None)
        batch.state, batch.ring = delivery, slot
        return batch

    def _seeded_fetch(self, index: Any) -> Any:
        """torch's map-style fetch under ``seed=``: the global generators seeded for each sample right before the
        dataset is asked for it (``fastloader.sample_seeds``). A dataset with ``__getitems__`` gets the batch as in
        torch: fastloader's seed each sample themselves; another's finds them seeded for the batch's first sample."""
        inner, dataset = self.inner, self.dataset
        if not inner.auto_collation:
            sample_seeds.seed_for(index)
            return inner.collate_fn(dataset[index])
        if getattr(dataset, "__getitems__", None):
            if not getattr(dataset, "seeds_each_sample", False) and len(index):
                sample_seeds.seed_for(index[0])
            return inner.fetch(index)
        items = []
        for sample in index:
            sample_seeds.seed_for(sample)
            items.append(dataset[sample])
        return inner.collate_fn(items)

    def _fetch_ended(self) -> SlotRef | None:
        """The batch ring slot the fetch was given (``fastloader.image.batch_ring``): in a worker it travels
        with the batch; in the loader's process (num_workers=0) the fetch is over, so the slot is free again
        unless the batch views it."""
        slot = end_fetch()
        if slot is not None and not self.in_worker:
            arrived(slot)
            return None
        return slot

    def state_now(self) -> dict[str, Any]:
        """This worker's state now (before its first batch: what a state at position 0 restores)."""
        return self._delivery(None).worker_state()

    def _fast_forward(self, index: Any) -> None:
        count, self.skip = self.skip, 0
        log.warning(
            "%s keeps no state (no state_dict / load_state_dict on it or its iterator): worker %d makes its"
            " first %d batches again to resume after them",
            type(self.dataset).__name__,
            self.worker,
            count,
        )
        for _ in range(count):
            try:
                self.inner.fetch(index)
            except StopIteration:
                break
        # The batches made again drew from the generators as a fresh worker's seeds left them; the next ones
        # draw as the interrupted worker's did (persistent workers in a later epoch began from other states).
        if self.rng_after_skip is not None:
            rng_states.restore(self.rng_after_skip)
            self.rng_after_skip = None

    def _delivery(self, task: int | None, digests: Any = None, outcomes: Any = None, flips: Any = None) -> Delivery:
        iterator = getattr(self.inner, "dataset_iter", None)
        own = iterator is None or iterator is not self.dataset
        return Delivery(
            worker=self.worker,
            task=task,
            batches=self.batches,
            # Copied now: the dataset goes on changing what its state_dict returned before the batch is sent.
            dataset=copy.deepcopy(self.dataset.state_dict()) if own and stateful(self.dataset) else None,
            iterator=copy.deepcopy(iterator.state_dict()) if iterator is not None and stateful(iterator) else None,
            rng=rng_states.capture() if self.in_worker else None,
            digests=digests,
            outcomes=outcomes,
            flips=flips,
        )

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)


def restore_dataset(dataset: Any, restore: WorkerState | None) -> None:
    """Load a worker's dataset state: before torch's fetcher calls ``iter(dataset)`` (torchdata's order)."""
    if restore is not None and restore.get("dataset") is not None and stateful(dataset):
        dataset.load_state_dict(restore["dataset"])


class _Agent:
    """This worker's stateful fetcher factory (one per worker process)."""

    def __init__(self, dataset: Any, worker: int, restore: WorkerState | None, original: Callable[..., Any]) -> None:
        self.dataset = dataset
        self.worker = worker
        self.restore = restore
        self.original = original

    def create_fetcher(self, kind: Any, dataset: Any, auto_collation: bool, collate_fn: Any, drop_last: bool) -> Any:
        if dataset is not self.dataset:  # a loader the dataset itself runs in this worker: torch's
            return self.original(kind, dataset, auto_collation, collate_fn, drop_last)
        restore, self.restore = self.restore, None  # the first epoch of this worker only
        restore_dataset(dataset, restore)
        inner = self.original(kind, dataset, auto_collation, collate_fn, drop_last)
        return StatefulFetcher(inner, dataset, self.worker, in_worker=True, restore=restore)


class WorkerStart:
    """The worker_init_fn torch's workers get: the seeds of a resumed worker, the stateful fetcher, the batch
    ring's mapping (``ring``: None without one), the fetch marks and each worker's result pipe (``marks``,
    ``results``: the write end by worker id; None unless dead workers are restarted), then ``inner`` (the
    user's worker_init_fn, or the watchdog's wrapper of it)."""

    def __init__(
        self,
        plan: WorkerPlan,
        inner: Callable[[int], None] | None,
        ring: RingHandle | None = None,
        marks: FetchMarks | None = None,
        results: Mapping[int, Connection] | None = None,
    ) -> None:
        self.plan = plan
        self.inner = inner
        self.ring = ring
        self.marks = marks
        self.results = results

    def restarted(self, worker: int, state: WorkerState | None, results: Connection | None) -> WorkerStart:
        """The init function of a worker started in place of a dead worker ``worker``: it restores ``state``
        (the dead worker's last batch's), else what the dead one restored; it writes into ``results``."""
        workers = dict(self.plan.workers)
        if state is not None:
            workers[worker] = state
        pipes = {worker: results} if results is not None else None
        return WorkerStart(WorkerPlan(self.plan.base_seed, workers), self.inner, self.ring, self.marks, pipes)

    def __call__(self, worker_id: int) -> None:
        if self.results is not None:  # first: any result, an error in what follows too, goes through it
            for worker, writer in self.results.items():
                if worker != worker_id:
                    writer.close()  # (inherited from the loader's process) the other workers' pipes
            send_results_with(ResultWriter(self.results[worker_id]).put)
        info = get_worker_info()
        if info is None:
            raise RuntimeError("WorkerStart runs in DataLoader workers only")
        thread = info.worker_method == "thread"  # a thread worker: its own generators, nothing of the process's
        base = self.plan.base_seed
        if base is not None and base + worker_id != info.seed:
            if not thread:
                _seed_like_torch(base, worker_id)
            set_worker_seed(base + worker_id)  # a thread's rng is seeded anew with it
        agent = _Agent(info.dataset, worker_id, self.plan.workers.get(worker_id), torch_fetcher_factory())
        # This process (or thread) is one of this loader's workers: its worker loop makes its fetcher right after
        # this function returns (and again each epoch with persistent workers).
        install_fetcher_factory(agent.create_fetcher)
        if thread:
            if self.ring is not None:  # the subprocess pipeline's threads write the ring's slots
                attach(self.ring)
            if self.inner is not None:
                self.inner(worker_id)
            return
        # Forked from the training process, this worker holds on to the batches that process held, and its
        # batch ring keeps their slots while it may see them (fastloader.image.ring_fork): it never reads them.
        ring_fork.let_go_inherited()
        if self.ring is not None:
            attach(self.ring)
        if self.marks is not None:
            global _MARKS
            _MARKS = self.marks
        if self.inner is not None:
            self.inner(worker_id)


def _seed_like_torch(base_seed: int, worker_id: int) -> None:
    """Seed this worker's generators exactly as torch's worker loop does for ``base_seed`` and ``worker_id``."""
    seed = base_seed + worker_id
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(numpy_seed(base_seed, worker_id))
