"""The loader's side of its batch ring: which slots are free, and when a slot comes back.

The protocol is written down once, in ``fastloader.image.batch_ring``; this module keeps its books, in the
loader's process only. Three parts:

* :class:`SlotBook`: each slot is FREE, DISPATCHED (to one worker set: the workers of one torch iterator)
  or HELD (views of it exist here). Dispatch takes the most recently freed slot first, so a ring larger
  than the pipeline needs leaves its extra slots untouched (their pages never committed).
* :class:`LoaderRing`: a loader's ring and its book, made before the first workers start, kept across
  epochs while the batch shape fits, pinned for CUDA once.
* :class:`RingDispatch`: one torch iterator's view of the ring: it stamps slots on that iterator's batches
  of indices and takes back the slots whose batches never came, when no worker of it can write them any
  more (:meth:`RingDispatch.epoch_starts`, :meth:`RingDispatch.workers_stopped`).

The finalizers that free a HELD slot run in whatever thread lets go of the last view, at any time (even
inside this module, through the garbage collector): they only append to a deque, which dispatch drains
under the lock. The lock is re-entrant because torch's iterator may be collected, and shut its workers down
(:meth:`RingDispatch.workers_stopped`), inside a dispatch.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterableDataset, Subset

from fastloader.image.batch_ring import BatchRing, RingHandle, SlotRef
from fastloader.torch_internals import worker_processes

if TYPE_CHECKING:
    from fastloader.loader.dataloader import DataLoaderX

log = logging.getLogger("fastloader")

# Slots beyond the batches torch keeps in flight (prefetch_factor x num_workers) and DataLoaderX's queue
# (max_prefetch): the batch the producer thread holds while the queue is full, the training loop's batch and
# the previous one (alive while next() runs), one spare; on CUDA, the copies whose events are not complete.
_SPARE = 4
_SPARE_CUDA = 2
_JOIN_S = 1.0  # how long a shut-down worker torch terminated may take to die before its slots are given up


class SlotBook:
    """The state of each slot of one ring (the ring's :class:`~fastloader.image.batch_ring.SlotKeeper`)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._lock = threading.RLock()
        self._free = collections.deque(range(slots - 1, -1, -1))  # popped from the right: slot 0 first
        self._dispatched: dict[int, object] = {}  # slot -> the RingDispatch it went out with
        self._held: set[int] = set()
        self._released: collections.deque[int] = collections.deque()  # from finalizers, drained under the lock
        self.reused = 0  # batches given a slot
        self.fresh = 0  # batches given none (every slot in use): a fresh buffer

    def take(self, owner: object) -> int | None:
        """A FREE slot, now DISPATCHED with ``owner``; None (counted) when every slot is in use."""
        with self._lock:
            self._collect()
            if not self._free:
                self.fresh += 1
                return None
            slot = self._free.pop()
            self._dispatched[slot] = owner
            self.reused += 1
            return slot

    def held(self, slot: int) -> None:
        with self._lock:
            if self._dispatched.pop(slot, None) is None:
                raise RuntimeError(f"batch ring slot {slot} arrived but was not dispatched: refusing to view it")
            self._held.add(slot)

    def released(self, slot: int) -> None:
        self._released.append(slot)  # a finalizer: no lock (it may run inside a locked section)

    def arrived(self, slot: int) -> None:
        with self._lock:
            if self._dispatched.pop(slot, None) is not None:
                self._free.append(slot)

    def reclaim(self, owner: object) -> int:
        """``owner``'s DISPATCHED slots are FREE again (no worker of it can write them any more); how many."""
        with self._lock:
            slots = [slot for slot, sent_with in self._dispatched.items() if sent_with is owner]
            for slot in slots:
                del self._dispatched[slot]
                self._free.append(slot)
            return len(slots)

    def _collect(self) -> None:
        while self._released:
            slot = self._released.popleft()
            self._held.discard(slot)
            self._free.append(slot)

    def in_use(self) -> int:
        with self._lock:
            self._collect()
            return self.slots - len(self._free)


class LoaderRing:
    """A loader's batch ring (:class:`~fastloader.image.batch_ring.BatchRing`) and its :class:`SlotBook`."""

    def __init__(self, slots: int, slot_bytes: int, device: torch.device) -> None:
        self.book = SlotBook(slots)
        self.ring = BatchRing(slots, slot_bytes, self.book)
        if device.type == "cuda":
            self.ring.pin(device)

    def fits(self, slots: int, slot_bytes: int) -> bool:
        return self.ring.slots >= slots and self.ring.slot_bytes >= slot_bytes

    def handle(self) -> RingHandle:
        return self.ring.handle()

    def stats(self) -> dict[str, Any]:
        ring, book = self.ring, self.book
        return {
            "slots": ring.slots,
            "slot_bytes": ring.slot_bytes,
            "bytes": ring.nbytes,
            "reused": book.reused,
            "fresh": book.fresh,
            "in_use": book.in_use(),
            "pinned": ring.pinned,
        }


class RingDispatch:
    """The ring as one torch iterator (one set of workers) uses it."""

    def __init__(self, ring: LoaderRing) -> None:
        self.ring = ring  # kept: markers of this iterator's batches unpickle into it

    def slot(self) -> SlotRef | None:
        """A slot for the next batch of indices (None: every slot in use, the batch gets a fresh buffer)."""
        slot = self.ring.book.take(self)
        return None if slot is None else SlotRef(self.ring.ring.id, slot)

    def epoch_starts(self) -> None:
        """The iterator draws the first indices of an epoch. With persistent workers torch's reset has heard
        every worker acknowledge it first, and a worker answers its earlier tasks before: none of them is
        still writing a slot of an earlier epoch (a fresh iterator has sent nothing)."""
        self.ring.book.reclaim(self)

    def workers_stopped(self, iterator: Any) -> None:
        """torch's iterator shut its workers down: once every one is dead, none will write its slots."""
        processes = worker_processes(iterator)
        for process in processes:
            if process.is_alive():
                process.join(_JOIN_S)
        if any(process.is_alive() for process in processes):
            log.debug("a worker outlived its shutdown: its batch ring slots stay out of use")
            return
        self.ring.book.reclaim(self)


def _buffer_size(dataset: Any) -> tuple[int, int] | None:
    while isinstance(dataset, Subset):  # torch's Subset forwards __getitems__
        dataset = dataset.dataset
    size = getattr(dataset, "batch_buffer_size", None)
    return size() if callable(size) else None


def ring_dispatch(loader: DataLoaderX[Any]) -> RingDispatch | None:
    """The ring for the torch iterator about to start (made or kept in the loader's runtime), or None: no
    ring for a dataset without a fixed-size batch buffer, a batch sampler of the user's, GPU decode, an
    IterableDataset, or a platform without ``memfd_create``."""
    plan = loader._plan
    if not plan.batch_ring or plan.gpu_decode or plan.user_batch_sampler or loader.batch_size is None:
        return None
    if isinstance(loader.dataset, IterableDataset):
        return None
    size = _buffer_size(loader.dataset)
    if size is None:
        return None
    slot_bytes = int(loader.batch_size) * size[0] * size[1] * 3
    workers = int(loader.num_workers)
    in_workers = int(loader.prefetch_factor or 2) * workers if workers > 0 else 0
    slots = in_workers + plan.max_prefetch + _SPARE + (_SPARE_CUDA if plan.to_cuda else 0)
    runtime = loader._runtime
    if runtime.ring is None or not runtime.ring.fits(slots, slot_bytes):
        try:
            runtime.ring = LoaderRing(slots, slot_bytes, plan.device)
        except (OSError, AttributeError) as error:  # no memfd_create (not Linux), or no memory for it
            log.debug("no batch ring (%s): batches get fresh buffers", error)
            runtime.ring = None
            return None
    return RingDispatch(runtime.ring)
