"""One iteration of a DataLoaderX, as the resume cursor sees it: how it starts (:class:`Plan`), what its
training loop has received (:class:`Progress`), and the index sampler torch's iterator takes from it
(:class:`EpochIndices`). See ``fastloader.loader.resume``."""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Iterator, Mapping, Sized
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import BatchSampler, IterableDataset

from fastloader.loader.batch_slots import RingDispatch
from fastloader.loader.resume_samplers import snapshot_indexer, stateful_indexer
from fastloader.loader.stage_clock import stamp
from fastloader.loader.worker_state import Delivery, WorkerState

if TYPE_CHECKING:
    from fastloader.loader.dataloader import DataLoaderX
    from fastloader.loader.ledger_writer import EpochLedger
    from fastloader.loader.resume import ResumeCursor


@dataclasses.dataclass
class Plan:
    """How an iteration starts: from a loaded state, from the end of the previous epoch, or afresh."""

    epoch: int
    start: int = 0  # global position at which the sampler's order starts (fastloader's samplers, replay)
    layout: int | None = None  # world size that order is laid out for; None: the current one
    skip: int = 0  # replay: samples of this rank's rebuilt order left out (a replayed batch sampler: its batches)
    before: int = 0  # IterableDataset, Stateful sampler: batches the loop received this epoch before the resume
    samples_before: int = 0  # samples this rank's loop received this epoch before the resume
    after: frozenset[int] = frozenset()  # batches (from the start) received before, out of order: left out
    # The ordering generator's state right before the sampler draws the epoch's order (after the workers' base
    # seed, which torch draws first from the loader's generator when it makes a new iterator). States saved
    # before version 5 hold its state before that draw (``rng_at_sampler`` False).
    rng: torch.Tensor | None = None
    rng_at_sampler: bool = True
    seed: int | None = None  # TorchRandomSampler's seed for the epoch
    base_seed: int | None = None  # the workers' base seed; None: torch draws it
    sampler: dict[str, Any] | None = None  # a Stateful sampler's {"sampler", "iterator"} states
    next_worker: int = 0  # the worker that gets the iteration's first request
    workers: Mapping[int, WorkerState] = dataclasses.field(default_factory=dict)  # what each worker restores
    loaded: dict[str, Any] | None = None  # the state as loaded: state_dict() gives it back until iter()
    # torch's global RNG (or the cursor's stream of it, ResumeCursor.seed_stream) after this epoch's draws of
    # the workers' base seed and TorchRandomSampler's seed: where the next epoch's draws begin. None: not drawn.
    next_rng: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class Indexing:
    """What an iteration's index stream is made of, fixed at ``iter()`` (the loader may be gone since)."""

    iterable: bool
    indexer: Any  # a Stateful sampler or batch sampler; None: the loader's index sampler as it is
    batch_size: int | None  # batches the indexer's items into lists of this size (None: it yields batches)
    drop_last: bool
    batched: bool  # each item of the index stream is a batch of indices (else one index: batch_size=None)

    @classmethod
    def of(cls, loader: DataLoaderX[Any]) -> Indexing:
        iterable = isinstance(loader.dataset, IterableDataset)
        indexer = None if iterable else stateful_indexer(loader)
        batch_size = None if loader._plan.user_batch_sampler else loader.batch_size
        return cls(iterable, indexer, batch_size, loader.drop_last, loader.batch_sampler is not None)


class Progress:
    """One iteration: what its training loop has received, and the state after it."""

    def __init__(self, plan: Plan, rng: torch.Tensor | None, seed: int | None, indexing: Indexing) -> None:
        self.plan = plan
        self.indexing = indexing
        self.rng, self.seed = rng, seed
        self.base_seed = plan.base_seed
        self.next_rng = plan.next_rng
        # torch's draw of the base seed goes to a generator of its own: the ordering generator is at the
        # sampler's draw already (a loaded state's, on a new iterator; ``fastloader.loader.torch_iter``).
        self.base_draw_aside = False
        self.batches = 0  # batches the loop received (or that raised) in this iteration
        self.done = False  # StopIteration reached (or the loop ended the iteration: ResumeCursor.end_loaded)
        self.drawn = False  # the index stream began: the sampler drew the epoch's order
        self.prefix = 0  # the first batches of the order, all received
        self.prefix_samples = 0  # the samples of those batches
        self._sizes: dict[int, int] = {}  # samples of each batch drawn beyond the prefix
        self.received = set(plan.after)  # received beyond the prefix
        self.workers: dict[int, WorkerState] = dict(plan.workers)
        self.last_worker: int | None = None
        self.sampler_state = plan.sampler
        self._drawn: collections.deque[tuple[int, dict[str, Any]]] = collections.deque()
        self.ledger: EpochLedger | None = None  # ledger=: this iteration's deliveries written (open_epoch sets it)
        # seed=: the (seed, epoch) each sample's random draws are a function of, with its index
        # (fastloader.sample_seeds); None: the workers' generators, as torch's loader (ResumeCursor.begin sets it).
        self.sample_seeds: tuple[int, int] | None = None

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
            self.prefix_samples += self._sizes.pop(self.prefix, 0)
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
            whole = indexing.batched and indexing.batch_size is None  # a batch sampler of the user's: its batches
            stream: Iterator[Any] = _skipped(inner, plan.skip, whole)
        else:
            stream = self._stateful_stream(indexing)
        for ordinal, indices in enumerate(_marked(stream, self)):
            # Before the batch exists: record() counts its samples when the loop receives it.
            self._sizes[ordinal] = _samples_in(indices, indexing.batched)
            if ordinal not in plan.after:
                if self.ledger is not None:
                    self.ledger.asked(ordinal, indices)
                yield ordinal, indices

    def _stateful_stream(self, indexing: Indexing) -> Iterator[Any]:
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


class EpochIndices:
    """The index sampler torch's iterator takes (and keeps, with persistent workers): each iteration of it
    asks the cursor for the current iteration's batches, stamped with their place in the order and, with a
    batch ring (``ring``: that iterator's :class:`~fastloader.loader.batch_slots.RingDispatch`), a free slot."""

    def __init__(self, cursor: ResumeCursor, inner: Any, in_workers: bool, ring: RingDispatch | None = None) -> None:
        self.cursor = cursor
        self.inner = inner
        self.in_workers = in_workers
        self.ring = ring

    def __iter__(self) -> Iterator[Any]:
        # A generator: torch calls iter() twice when its iterator starts and uses the second one.
        progress = self.cursor.current
        if progress is None:
            raise RuntimeError("EpochIndices iterated outside DataLoaderX.__iter__")
        ring = self.ring
        if ring is not None:
            ring.epoch_starts()
        digests = progress.ledger is not None  # the workers take digests of what they read for the ledger
        seeds = progress.sample_seeds
        for ordinal, indices in progress.batches_of(self.inner):
            slot = ring.slot() if ring is not None and type(indices) is list else None
            yield stamp(indices, ordinal, self.in_workers, slot, digests, seeds)

    def __len__(self) -> int:
        return len(self.inner)


def _marked(stream: Iterator[Any], progress: Progress) -> Iterator[Any]:
    """``stream``, with ``progress.drawn`` set once its first item (or its end) came: the sampler drew."""
    try:
        first = next(stream)
    except StopIteration:
        progress.drawn = True
        return
    progress.drawn = True
    yield first
    yield from stream


def _samples_in(indices: Any, batched: bool) -> int:
    if not batched:
        return 1
    # A batch sampler of the user's may yield any iterable: one without len() is not counted.
    return len(indices) if isinstance(indices, Sized) else 0


def _skipped(inner: Any, skip: int, whole: bool) -> Iterator[Any]:
    """The index sampler's batches with the first ``skip`` indices of its order left out, unloaded: whole
    batches when ``skip`` falls on a batch boundary, else the rest of the order batched afresh. ``whole``:
    ``skip`` counts the batches of a batch sampler of the user's."""
    if skip == 0:
        return iter(inner)
    if isinstance(inner, BatchSampler) and not whole:
        if skip % inner.batch_size == 0:
            return itertools.islice(iter(inner), skip // inner.batch_size, None)
        return _batched(itertools.islice(iter(inner.sampler), skip, None), inner.batch_size, inner.drop_last)
    return itertools.islice(iter(inner), skip, None)  # batch_size=None: one index at a time


def _batched(indices: Iterator[Any], size: int, drop_last: bool) -> Iterator[list[Any]]:
    """torch's BatchSampler over an iterator (the sampler's, whose state is saved)."""
    while True:
        batch = list(itertools.islice(indices, size))
        if not batch or (drop_last and len(batch) < size):
            return
        yield batch
