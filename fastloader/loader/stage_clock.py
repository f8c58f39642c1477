"""Where a batch's time goes, measured where it is spent: cheap enough to leave on.

A batch crosses three places, and each records its own stages:

* **the worker** (or the producer thread with ``num_workers=0``): the dataset adds ``read``, ``decode``
  and ``transform`` seconds to this thread's tally as it works (``fastloader.timing``, the worker
  half of the clock, which the datasets import; any other dataset's time shows as ``dataset``);
  :class:`TimedCollate` wraps the loader's collate_fn, times ``collate`` and ships the batch with its
  :class:`BatchTiming` in a :class:`TimedBatch`. The fetch starts when the worker unpickles its
  indices (:class:`StampedIndices`), so the time a worker spends idle, waiting for work, is never
  counted as work.
* **the hand-off**: unpickling a :class:`TimedBatch` in the main process times its own arrival
  (``handoff``: rebuilding the batch's tensors from shared memory, or unpickling bytes), and torch's
  pin-memory thread calls :meth:`TimedBatch.pin_memory` (``pin``).
* **the main process**: DataLoaderX's producer thread unwraps the batch and times the copy to the GPU
  (``h2d``); the training loop's thread times its ``wait`` for each batch and its own ``step`` between
  batches (``fastloader.loader.stage_stats``).

``perf_counter`` is CLOCK_MONOTONIC on Linux, one clock for every process of the machine. Every stage
also carries a ``torch.profiler.record_function`` label (``fastloader.read``, ...) while a profiler is
recording in that process (``fastloader.timing.labelled``). torch's profiler
records the thread it was started in: a trace of the training loop shows ``fastloader.wait``; the
stages of a worker show in a profile taken in that worker (or wherever the dataset runs).

Nothing here changes what the training loop receives: the wrappers exist only between torch's workers
and DataLoaderX's producer thread, which unwraps them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from fastloader import read_digests, sample_seeds
from fastloader.image.batch_ring import SlotRef, arrived, begin_fetch, pack
from fastloader.timing import labelled, tally
from fastloader.torch_internals import pin_memory as _pin_memory

_TALLY = tally()  # this module's reference to the worker half's thread-local tally (fastloader.timing)


@dataclass
class BatchTiming:
    """One batch's seconds in each stage (None: not measured for this batch), and where it came from."""

    images: int
    worker: int | None = None  # torch's worker id; None for num_workers=0
    done_at: float = 0.0  # perf_counter when the worker finished collating
    read: float = 0.0
    decode: float = 0.0
    transform: float = 0.0
    dataset: float | None = None  # the rest of the fetch; None when its start is unknown
    collate: float = 0.0
    handoff: float = 0.0
    pin: float = 0.0
    h2d: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


class TimedBatch:
    """A collated batch travelling with its timing (None: not timed), its worker's state (a
    ``fastloader.loader.worker_state.Delivery``, or None) and the batch ring slot its fetch was given (None:
    none), from the worker to DataLoaderX's producer thread.

    Deliberately neither a sequence nor a mapping: torch's pin-memory thread then calls
    :meth:`pin_memory`, which pins the batch inside (as torch would have) and times it; a batch in a pinned
    batch ring slot is pinned already, and torch passes it through untouched.
    """

    __slots__ = ("batch", "timing", "state", "ring")

    def __init__(self, batch: Any, timing: BatchTiming | None, state: Any = None, ring: SlotRef | None = None) -> None:
        self.batch = batch
        self.timing = timing
        self.state = state
        self.ring = ring

    def pin_memory(self) -> TimedBatch:
        start = perf_counter()
        with labelled("pin"):
            self.batch = _pin_memory(self.batch)
        if self.timing is not None:
            self.timing.pin += perf_counter() - start
        return self

    def __reduce__(self) -> tuple[Callable[..., TimedBatch], tuple[Any, ...]]:
        # Unpickling calls perf_counter() first (the arrival starts), then rebuilds the batch, then
        # _arrived: the difference is the hand-off's cost in the receiving process. Tensors in the fetch's
        # ring slot travel as markers (fastloader.image.batch_ring), rebuilt as views before _arrived runs.
        if self.ring is None:
            return _arrived, (_Now(), self.batch, self.timing, self.state)
        return _arrived, (_Now(), pack(self.batch, self.ring), self.timing, self.state, self.ring)


class _Now:
    """Unpickles to the receiving process's ``perf_counter()`` at that moment."""

    def __reduce__(self) -> tuple[Callable[[], float], tuple[()]]:
        return perf_counter, ()


def _arrived(
    started: float, batch: Any, timing: BatchTiming | None, state: Any = None, ring: SlotRef | None = None
) -> TimedBatch:
    if ring is not None:
        arrived(ring)  # a slot the batch does not view is free again
    if timing is not None:
        timing.handoff = perf_counter() - started
    return TimedBatch(batch, timing, state)


class StampedIndices(list[Any]):
    """A batch of indices that marks, when a worker unpickles it, the moment that worker starts the fetch
    (and the batch's place ``task`` in its iteration's order, for resume, its batch ring ``slot``, and
    whether the fetch takes the delivery ledger's ``digests``: ``fastloader.read_digests``, with the
    ``outcomes`` of a batch rebuilt around a sample that kills workers; and with ``seed=`` the ``(seed, epoch)``
    its samples draw from: ``fastloader.sample_seeds``). ``rebuild``
    turns it back into the type the batch sampler made (a tuple, a numpy array, a tensor): the dataset sees
    exactly what it would see in torch's loader."""

    task: int | None = None
    slot: SlotRef | None = None
    digests: bool = False
    rebuild: Callable[[list[Any]], Any] | None = None
    outcomes: tuple[tuple[int, int], ...] = ()
    seeds: tuple[int, int] | None = None

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        args = (list(self), self.task, self.slot, self.digests, self.rebuild, self.outcomes, self.seeds)
        return _fetch_begins, args


def stamped(
    indices: list[Any],
    task: int | None,
    slot: SlotRef | None = None,
    digests: bool = False,
    rebuild: Callable[[list[Any]], Any] | None = None,
    outcomes: tuple[tuple[int, int], ...] = (),
    seeds: tuple[int, int] | None = None,
) -> StampedIndices:
    out = StampedIndices(indices)
    out.task, out.slot, out.digests, out.rebuild = task, slot, digests, rebuild
    out.outcomes, out.seeds = outcomes, seeds
    return out


def _fetch_begins(
    indices: list[Any],
    task: int | None = None,
    slot: SlotRef | None = None,
    digests: bool = False,
    rebuild: Callable[[list[Any]], Any] | None = None,
    outcomes: tuple[tuple[int, int], ...] = (),
    seeds: tuple[int, int] | None = None,
) -> Any:
    start = _TALLY
    start.fetch_start = perf_counter()
    start.task = task
    start.read = start.decode = start.transform = 0.0
    begin_fetch(slot)
    read_digests.begin(digests, outcomes)
    sample_seeds.begin(seeds[0] if seeds else None, seeds[1] if seeds else 0, indices)
    # What torch's sampler made: a plain list, or the batch sampler's own tuple / array / tensor.
    return indices if rebuild is None else rebuild(indices)


def stamp(
    indices: Any,
    task: int | None,
    in_workers: bool,
    slot: SlotRef | None = None,
    digests: bool = False,
    seeds: tuple[int, int] | None = None,
) -> Any:
    """A batch of indices from the loader's index sampler, marking when its fetch starts (and its place
    ``task`` in the iteration's order, the batch ring ``slot`` it may write, and whether its fetch takes
    digests for the ledger, and with ``seed=`` the ``seeds`` (seed, epoch) its samples draw from): with worker
    processes the worker marks it on unpickling (see
    :class:`StampedIndices`); without, the producer thread runs the fetch right after taking the indices, so
    the mark is made now. A batch sampler's tuple, 1-D numpy array or tensor travels as a list marked to be
    rebuilt in the worker; any other kind of batch travels as it is (no mark: the caller gives it no slot,
    and the ledger no digests)."""
    if not in_workers:
        _fetch_begins(indices, task, slot, digests, None, seeds=seeds)
        return indices
    if type(indices) is list:
        return stamped(indices, task, slot, digests, None, seeds=seeds)
    rebuild = _rebuilder(indices)
    if rebuild is None:
        return indices
    # An array's or tensor's items travel as Python ints (a tensor's would each go through shared memory).
    items = indices.tolist() if isinstance(indices, np.ndarray | torch.Tensor) else list(indices)
    return stamped(items, task, slot, digests, rebuild, seeds=seeds)


def _rebuilder(indices: Any) -> Callable[[list[Any]], Any] | None:
    if type(indices) is tuple:
        return tuple
    if type(indices) is np.ndarray and indices.ndim == 1:
        return functools.partial(np.asarray, dtype=indices.dtype)
    if type(indices) is torch.Tensor and indices.dim() == 1:
        return functools.partial(torch.as_tensor, dtype=indices.dtype)
    return None


class TimedCollate:
    """The loader's collate_fn, timed; returns :class:`TimedBatch` (unwrapped by DataLoaderX)."""

    def __init__(self, inner: Callable[[Any], Any]) -> None:
        self.inner = inner

    def __call__(self, samples: Any) -> TimedBatch:
        start = perf_counter()
        counted = _TALLY
        with labelled("collate"):
            batch = self.inner(samples)
        done = perf_counter()
        info = get_worker_info()
        timing = BatchTiming(
            images=len(samples) if isinstance(samples, list) else 1,
            worker=info.id if info is not None else None,
            done_at=done,
            read=counted.read,
            decode=counted.decode,
            transform=counted.transform,
            collate=done - start,
        )
        if counted.fetch_start is not None:
            fetch = start - counted.fetch_start
            timing.dataset = max(0.0, fetch - counted.read - counted.decode - counted.transform)
        counted.fetch_start = None
        counted.read = counted.decode = counted.transform = 0.0
        return TimedBatch(batch, timing)
