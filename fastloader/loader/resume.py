"""Loader-level resume: one :class:`ResumeCursor` per DataLoaderX holds its epoch state.

The cursor is the one home of what ``state_dict()`` saves and ``load_state_dict()`` restores (the format:
``fastloader.loader.resume_state``). torchdata's StatefulDataLoader contract is the model:

* ``load_state_dict`` applies to the next ``iter()``, which delivers the rest of that epoch in the order an
  uninterrupted run would have (the same sequence with ``in_order=True``; exactly the batches not yet
  received with ``in_order=False``), whatever ``num_workers`` for a map-style dataset. Persistent workers
  that already run are restarted for it (their processes hold the state of the run they made).
* A state taken after the last batch of an epoch, before the loop saw its end, resumes into that finished
  epoch (it delivers nothing; the next ``iter()`` is the next epoch); a state taken after the end names the
  next epoch at its first batch. A state taken before the first batch of an epoch (before or after ``iter()``)
  fixes that epoch's seeds: loading it gives the very batches the interrupted run had.
* What the order is made of, per sampler: fastloader's samplers (``seed=``, or the split by ``local_rank`` /
  ``distributed=True``) start at the position themselves (with another world size the rest of the epoch is
  re-split over the new ranks; ranks are assumed to advance in lockstep, as DDP makes them); a sampler with
  its own ``state_dict`` (the Stateful protocol, on the sampler or its iterator) has its state after the last
  received batch restored; torch's samplers are *replayed*: the epoch's order is rebuilt from what decided it
  (the seed torch's RandomSampler draws, see ``TorchRandomSampler``; a generator's state when the epoch
  began; the epoch of a DistributedSampler) and the batches already received are left out, unloaded. A
  ``RandomSampler`` without a generator that the user passed is refused: nothing records its draw.
* The workers' side (each worker's dataset / iterator state and random generators, restored in the worker
  that plays its role): ``fastloader.loader.worker_state``.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import itertools
import weakref
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterableDataset

from fastloader.loader.resume_samplers import (
    ordering_generator,
    place,
    sampler_size,
    seed_of,
    snapshot_indexer,
    stateful_indexer,
    world_of,
)
from fastloader.loader.resume_state import check_state, encode_rng, encode_workers
from fastloader.loader.stage_clock import stamp
from fastloader.loader.worker_state import Delivery, WorkerState
from fastloader.samplers.torch_random import TorchRandomSampler

if TYPE_CHECKING:
    from fastloader.loader.dataloader import DataLoaderX


@dataclasses.dataclass
class Plan:
    """How an iteration starts: from a loaded state, from the end of the previous epoch, or afresh."""

    epoch: int
    start: int = 0  # global position at which the sampler's order starts (fastloader's samplers, replay)
    layout: int | None = None  # world size that order is laid out for; None: the current one
    skip: int = 0  # replay: batches of the rebuilt order left out
    before: int = 0  # IterableDataset: batches the loop received in this epoch before the resume
    after: frozenset[int] = frozenset()  # batches (from the start) received before, out of order: left out
    rng: torch.Tensor | None = None  # the ordering generator's state when the epoch began
    seed: int | None = None  # TorchRandomSampler's seed for the epoch
    base_seed: int | None = None  # the workers' base seed; None: torch draws it
    sampler: dict[str, Any] | None = None  # a Stateful sampler's {"sampler", "iterator"} states
    next_worker: int = 0  # the worker that gets the iteration's first request
    workers: Mapping[int, WorkerState] = dataclasses.field(default_factory=dict)  # what each worker restores
    loaded: dict[str, Any] | None = None  # the state as loaded: state_dict() gives it back until iter()


@dataclasses.dataclass(frozen=True)
class _Indexing:
    """What an iteration's index stream is made of, fixed at ``iter()`` (the loader may be gone since)."""

    iterable: bool
    indexer: Any  # a Stateful sampler or batch sampler; None: the loader's index sampler as it is
    batch_size: int | None  # batches the indexer's items into lists of this size (None: it yields batches)
    drop_last: bool

    @classmethod
    def of(cls, loader: DataLoaderX[Any]) -> _Indexing:
        iterable = isinstance(loader.dataset, IterableDataset)
        indexer = None if iterable else stateful_indexer(loader)
        batch_size = None if loader._user_batch_sampler else loader.batch_size
        return cls(iterable, indexer, batch_size, loader.drop_last)


class Progress:
    """One iteration: what its training loop has received, and the state after it."""

    def __init__(self, plan: Plan, rng: torch.Tensor | None, seed: int | None, indexing: _Indexing) -> None:
        self.plan = plan
        self.indexing = indexing
        self.rng, self.seed = rng, seed
        self.base_seed = plan.base_seed
        self.batches = 0  # batches the loop received (or that raised) in this iteration
        self.done = False  # StopIteration reached
        self.prefix = 0  # the first batches of the order, all received
        self.received = set(plan.after)  # received beyond the prefix
        self.workers: dict[int, WorkerState] = dict(plan.workers)
        self.last_worker: int | None = None
        self.sampler_state = plan.sampler
        self._drawn: collections.deque[tuple[int, dict[str, Any]]] = collections.deque()

    def drew(self, ordinal: int, state: dict[str, Any]) -> None:
        """The Stateful sampler's state after its batch ``ordinal`` was drawn (main process, ahead of the loop)."""
        self._drawn.append((ordinal, state))

    def record(self, delivery: Delivery | None) -> None:
        """The training loop received a batch (``delivery``: its worker's state; None: not tracked)."""
        if delivery is not None:
            self.workers[delivery.worker] = delivery.worker_state()
            if delivery.end:
                return
            self.last_worker = delivery.worker
        self.batches += 1
        task = delivery.task if delivery is not None else None
        self.received.add(task if task is not None else self.prefix)
        while self.prefix in self.received:
            self.received.discard(self.prefix)
            self.prefix += 1

    def failed(self) -> None:
        """A batch raised instead (torch goes on with the next one): it counts as received."""
        self.record(None)

    def batches_of(self, inner: Any) -> Iterator[tuple[int | None, Any]]:
        """The iteration's batches of indices, each with its place in the order (None: IterableDataset)."""
        indexing = self.indexing
        if indexing.iterable:
            for indices in inner:
                yield None, indices
            return
        plan = self.plan
        if indexing.indexer is None:
            stream: Iterator[Any] = itertools.islice(iter(inner), plan.skip, None)
        else:
            stream = self._stateful_stream(indexing)
        for ordinal, indices in enumerate(stream):
            if ordinal not in plan.after:
                yield ordinal, indices

    def _stateful_stream(self, indexing: _Indexing) -> Iterator[Any]:
        indexer = indexing.indexer
        saved = self.plan.sampler or {}
        if saved.get("sampler") is not None:
            indexer.load_state_dict(saved["sampler"])
        iterator = iter(indexer)
        if saved.get("iterator") is not None:
            iterator.load_state_dict(saved["iterator"])
        size = indexing.batch_size
        stream = iterator if size is None else _batched(iterator, size, indexing.drop_last)
        self.drew(-1, snapshot_indexer(indexer, iterator))
        for ordinal, indices in enumerate(stream):
            self.drew(ordinal, snapshot_indexer(indexer, iterator))
            yield indices

    def sampler_after_prefix(self) -> dict[str, Any] | None:
        while self._drawn and self._drawn[0][0] < self.prefix:
            self.sampler_state = self._drawn.popleft()[1]
        return self.sampler_state


class ResumeCursor:
    """A DataLoaderX's epoch and resume state: the epoch counter, a loaded state waiting for the next
    ``iter()``, and the progress of the current iteration."""

    def __init__(self, loader: DataLoaderX[Any]) -> None:
        self.bind(loader)
        self.epoch = 0  # the epoch of the current (or next) iteration
        self.epoch_set = False  # set_epoch or load_state_dict since the last iter()
        self.started = False
        self.sampler_epoch_at_iter: int | None = None  # the sampler's own epoch at the last iter()
        self.pending: Plan | None = None
        self.current: Progress | None = None
        self.workers_base_seed: int | None = None  # of the workers running now

    def bind(self, loader: DataLoaderX[Any]) -> None:
        # A weak reference: a loader <-> cursor cycle would leave every loader (and its persistent workers'
        # iterator) to the garbage collector, which may then run torch's __del__ in a forked worker.
        self._loader = weakref.ref(loader)

    @property
    def loader(self) -> DataLoaderX[Any]:
        loader = self._loader()
        if loader is None:
            raise RuntimeError("the DataLoaderX of this ResumeCursor is gone")
        return loader

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_loader"]  # DataLoaderX.__setstate__ binds the copy to its loader
        return state

    # --- epochs -----------------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        if self.pending is not None and self.pending.epoch != epoch:
            self.pending = None  # another epoch than the loaded one: start it from the beginning
        self.epoch, self.epoch_set = epoch, True

    def next_plan(self) -> Plan:
        """At ``iter()``: advance the epoch (unless it was set since the last one) and say how the iteration starts."""
        loader = self.loader
        if self.started and not self.epoch_set:
            external = loader._sampler_epoch()
            if external is not None and external != self.sampler_epoch_at_iter:
                self.epoch = external  # a framework set the sampler's epoch itself (Lightning does): keep it
            else:
                loader.set_epoch(self.epoch + 1)
        self.started, self.epoch_set = True, False
        if self.pending is not None:
            return self.pending
        current = self.current
        if current is not None and current.done and current.plan.epoch + 1 == self.epoch:
            return self._after(current)
        return Plan(self.epoch)

    def reuses_workers(self, plan: Plan) -> bool:
        """Whether the iteration runs on the persistent workers already running (they keep their state)."""
        loader = self.loader
        running = loader.persistent_workers and loader.num_workers > 0 and loader._iterator is not None
        return running and plan.loaded is None

    def begin(self, plan: Plan, fresh: bool) -> Progress:
        """Before torch's iterator exists: put back (or record) what decides the order, fix the seeds."""
        generator = ordering_generator(self.loader)
        if plan.rng is not None and generator is not None:
            generator.set_state(plan.rng)
        rng = generator.get_state() if generator is not None else None
        seed = plan.seed
        sampler = self.loader.sampler
        if isinstance(sampler, TorchRandomSampler) and sampler.generator is None:
            if seed is None:
                seed = self._peek(fresh)[1]
            if seed is not None:
                sampler.pin_next_seed(seed)
        progress = Progress(plan, rng, seed, _Indexing.of(self.loader))
        self.pending, self.current = None, progress
        self.sampler_epoch_at_iter = self.loader._sampler_epoch()
        return progress

    def started_workers(self, progress: Progress, base_seed: int, fresh: bool) -> None:
        """torch's iterator exists: the seed its workers got (a pinned one, or the one torch drew)."""
        if fresh:
            self.workers_base_seed = progress.base_seed if progress.base_seed is not None else base_seed
        progress.base_seed = self.workers_base_seed

    def _peek(self, fresh: bool) -> tuple[int | None, int | None]:
        """What the next iteration will draw, without drawing it: the workers' base seed (when torch makes a
        new iterator), then TorchRandomSampler's seed (torch's global generator, when it has none)."""
        loader = self.loader
        own = loader.generator
        state = torch.get_rng_state()
        own_state = own.get_state() if own is not None else None
        try:
            base = int(torch.empty((), dtype=torch.int64).random_(generator=own).item()) if fresh else None
            sampler = loader.sampler
            needs_seed = isinstance(sampler, TorchRandomSampler) and sampler.generator is None
            seed = int(torch.empty((), dtype=torch.int64).random_().item()) if needs_seed else None
        finally:
            torch.set_rng_state(state)
            if own is not None and own_state is not None:
                own.set_state(own_state)
        return base, seed

    # --- the training loop's side ------------------------------------------------------------------------

    # --- state_dict / load_state_dict ---------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The state after what the training loop received (see the module docstring); never raises."""
        pending = self.pending
        if pending is not None:
            return copy.deepcopy(pending.loaded) if pending.loaded is not None else self._encode_plan(pending)
        current = self.current
        if current is None or current.plan.epoch != self.epoch:
            plan = Plan(self.epoch)
        elif current.done:
            plan = self._after(current)
        else:
            return self._encode_progress(current)
        self.pending = self._pinned(plan)  # the next iteration keeps the seeds this state names
        return self._encode_plan(self.pending)

    def load(self, state: Mapping[str, Any]) -> None:
        """Resume from a state (applies to the next ``iter()``); ValueError for a foreign or impossible one."""
        if isinstance(state, Mapping) and len(state) == 0:
            return  # torchdata's convention: an empty state changes nothing
        values = check_state(state)
        plan = Plan(**place(self.loader, values))
        plan.loaded = copy.deepcopy(dict(state))
        self.pending = plan
        self.epoch, self.epoch_set = plan.epoch, True

    def _after(self, progress: Progress) -> Plan:
        """The next epoch's start: the workers' state goes on only where their processes would have."""
        loader = self.loader
        keeps = loader.num_workers == 0 or loader.persistent_workers
        workers = {}
        if keeps:
            workers = {key: {**state, "batches": 0, "iterator": None} for key, state in progress.workers.items()}
        return Plan(progress.plan.epoch + 1, workers=workers)

    def _pinned(self, plan: Plan) -> Plan:
        generator = ordering_generator(self.loader)
        base, seed = self._peek(fresh=not self.reuses_workers(plan))
        return dataclasses.replace(
            plan,
            rng=generator.get_state() if generator is not None else None,
            seed=seed,
            base_seed=base if base is not None else self.workers_base_seed,
        )

    def _encode_plan(self, plan: Plan) -> dict[str, Any]:
        return self._encode(plan, plan.rng, plan.seed, plan.base_seed, 0, plan.sampler, plan.workers, plan.next_worker)

    def _encode_progress(self, progress: Progress) -> dict[str, Any]:
        loader = self.loader
        iterable = isinstance(loader.dataset, IterableDataset)
        next_worker = progress.plan.next_worker
        workers: Mapping[int, WorkerState] = progress.workers
        if loader.num_workers > 0:
            if loader.in_order and progress.last_worker is not None:
                next_worker = (progress.last_worker + 1) % int(loader.num_workers)
            elif not loader.in_order and not iterable:
                workers, next_worker = {}, 0  # batches went to whichever worker was free: no order to keep
        if not iterable:  # a map-style dataset's workers need their count for nothing
            workers = {key: state for key, state in workers.items() if _kept(state)}
        count = progress.plan.before + progress.batches if iterable else progress.prefix
        sampler_state = progress.sampler_after_prefix()
        after = sorted(ordinal - progress.prefix for ordinal in progress.received)
        seeds = (progress.rng, progress.seed, progress.base_seed)
        return self._encode(progress.plan, *seeds, count, sampler_state, workers, next_worker, after)

    def _encode(
        self,
        plan: Plan,
        rng: torch.Tensor | None,
        seed: int | None,
        base_seed: int | None,
        count: int,
        sampler_state: dict[str, Any] | None,
        workers: Mapping[int, WorkerState],
        next_worker: int,
        after: list[int] | None = None,
    ) -> dict[str, Any]:
        loader = self.loader
        sampler = loader.sampler
        world, rank = world_of(sampler)
        layout = plan.layout or world
        batch = loader.batch_size or 1
        total = sampler_size(sampler, layout)
        position = plan.start + count * batch * world
        samples = count * batch
        if total is not None:
            position = min(position, total)
            samples = min(samples, len(sampler))  # type: ignore[arg-type]
        encoded = encode_workers(int(loader.num_workers), next_worker, workers) if workers else None
        return {
            "version": 3,
            "epoch": plan.epoch,
            "samples_yielded": samples,
            "batches_yielded": count,
            "seed": seed_of(loader, seed),
            "world_size": world,
            "rank": rank,
            "start": position if count == 0 else plan.start,
            "layout": layout,
            "rng": encode_rng(rng),
            "base_seed": base_seed,
            "after": after or [],
            "sampler": copy.deepcopy(sampler_state),
            "workers": encoded,
        }


class EpochIndices:
    """The index sampler torch's iterator takes (and keeps, with persistent workers): each iteration of it
    asks the cursor for the current iteration's batches, stamped with their place in the order."""

    def __init__(self, cursor: ResumeCursor, inner: Any, in_workers: bool) -> None:
        self.cursor = cursor
        self.inner = inner
        self.in_workers = in_workers

    def __iter__(self) -> Iterator[Any]:
        # A generator: torch calls iter() twice when its iterator starts and uses the second one.
        progress = self.cursor.current
        if progress is None:
            raise RuntimeError("EpochIndices iterated outside DataLoaderX.__iter__")
        for ordinal, indices in progress.batches_of(self.inner):
            yield stamp(indices, ordinal, self.in_workers)

    def __len__(self) -> int:
        return len(self.inner)


def _kept(state: WorkerState) -> bool:
    return any(state.get(key) is not None for key in ("dataset", "iterator", "rng"))


def _batched(indices: Iterator[Any], size: int, drop_last: bool) -> Iterator[list[Any]]:
    """torch's BatchSampler over an iterator (the sampler's, whose state is saved)."""
    while True:
        batch = list(itertools.islice(indices, size))
        if not batch or (drop_last and len(batch) < size):
            return
        yield batch
