"""The loader's side of its batch ring: which slots are free, and when a slot comes back.

The protocol is written down once, in ``fastloader.image.batch_ring``; this module keeps its books, in the
loader's process only. Three parts:

* :class:`SlotBook`: each slot is FREE, DISPATCHED (to one worker set: the workers of one torch iterator)
  or HELD (views of it exist here), or LOST, MOVED or SHARED for a while (see the class). Dispatch takes the
  most recently freed slot first, so a ring larger than the pipeline needs leaves its extra slots untouched
  (their pages never committed).
* :class:`LoaderRing`: a loader's ring and its book, made before the first workers start, kept across
  epochs while the batch shape fits (and in the process that made it: a forked child makes its own), pinned
  for CUDA once.
* :class:`RingDispatch`: one torch iterator's view of the ring: it stamps slots on that iterator's batches
  of indices, hears which worker each went to, and takes back the slots whose batches never came: those of a
  worker torch found dead (:meth:`RingDispatch.worker_lost`), and all of them once no worker of it can write
  them any more (:meth:`RingDispatch.epoch_starts`, :meth:`RingDispatch.workers_stopped`).

The finalizers that free a HELD slot run in whatever thread lets go of the last view, at any time (even
inside this module, through the garbage collector): they only append to a deque, which dispatch drains
under the lock. The lock is re-entrant because torch's iterator may be collected, and shut its workers down
(:meth:`RingDispatch.workers_stopped`), inside a dispatch.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterableDataset, Subset

from fastloader.image import ring_fork
from fastloader.image.batch_ring import BatchRing, RingHandle, SlotRef
from fastloader.torch_internals import drop_storage_ref, storage_gone, worker_processes

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
    """The state of each slot of one ring (the ring's :class:`~fastloader.image.batch_ring.SlotKeeper`).

    Beyond FREE, DISPATCHED and HELD, a slot may be kept out of use for a while, each time because something may
    still read or write it: LOST (dispatched to a worker torch found dead: back once no message of that worker
    can still be on its way), MOVED (its views' storage moved its data elsewhere, arrays may still point into the
    slot: back when that storage is gone) and SHARED (a forked child may see it: back, once let go here, when
    every such child is gone; ``fastloader.image.ring_fork``).
    """

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._lock = threading.RLock()
        self._free = collections.deque(range(slots - 1, -1, -1))  # popped from the right: slot 0 first
        self._tickets = 0  # dispatches so far: each dispatch's number (its ticket)
        self._dispatched: dict[int, tuple[object, int]] = {}  # slot -> (the RingDispatch it went with, ticket)
        self._held: set[int] = set()
        self._released: collections.deque[tuple[int, int]] = collections.deque()  # from finalizers
        self._lost: dict[int, tuple[object, int, int]] = {}  # slot -> (owner, its ticket, back from this ticket)
        self._moved: dict[int, int] = {}  # slot -> a weak reference to the storage that moved away
        self._shared: collections.Counter[int] = collections.Counter()  # slot -> forked children that see it
        self._guards: list[tuple[ring_fork.ChildGuard, frozenset[int]]] = []
        self._parked: set[int] = set()  # let go here while a forked child may still see them
        self.reused = 0  # batches given a slot
        self.fresh = 0  # batches given none (every slot in use): a fresh buffer
        ring_fork.watch(self)

    def take(self, owner: object) -> tuple[int, int] | None:
        """A FREE slot, now DISPATCHED with ``owner``, and its ticket; None (counted) when every slot is in use."""
        with self._lock:
            self._collect()
            if not self._free:
                self.fresh += 1
                return None
            slot = self._free.pop()
            ticket = self._tickets
            self._tickets += 1
            self._dispatched[slot] = (owner, ticket)
            self.reused += 1
            return slot, ticket

    def held(self, slot: int, ticket: int) -> None:
        with self._lock:
            if not self._landed(slot, ticket):
                raise RuntimeError(f"batch ring slot {slot} arrived but was not dispatched: refusing to view it")
            self._held.add(slot)

    def released(self, slot: int, storage: int) -> None:
        self._released.append((slot, storage))  # a finalizer: no lock (it may run inside a locked section)

    def arrived(self, slot: int, ticket: int) -> None:
        with self._lock:
            if self._landed(slot, ticket):
                self._give_back(slot)

    def _landed(self, slot: int, ticket: int) -> bool:
        """The batch of ``ticket`` reached this process: its slot is no longer DISPATCHED (or LOST); a message
        sent after a worker's death came, so none of that worker's can still come: its LOST slots are back."""
        sent = self._dispatched.get(slot)
        lost = self._lost.get(slot)
        if sent is not None and sent[1] == ticket:
            del self._dispatched[slot]
            owner = sent[0]
        elif lost is not None and lost[1] == ticket:
            del self._lost[slot]  # the dead worker's batch, finished before it died: the slot is its own
            owner = lost[0]
        else:
            return False
        for other, (lost_owner, _, back_from) in list(self._lost.items()):
            if lost_owner is owner and ticket >= back_from:
                del self._lost[other]
                self._give_back(other)
        return True

    def lost(self, owner: object, slots: dict[int, int]) -> int:
        """The slots ``slots`` (slot -> ticket) that ``owner`` sent to a worker now dead are LOST: that worker
        writes them no more, but its last messages may still be on their way (a batch it finished views its
        slot when it arrives). Each comes back once a batch ``owner`` dispatched from now on has arrived (the
        workers' results come through one pipe, in the order they were sent), or with ``owner``'s other slots
        (:meth:`reclaim`); how many."""
        with self._lock:
            back_from = self._tickets
            count = 0
            for slot, ticket in slots.items():
                if self._dispatched.get(slot) == (owner, ticket):
                    del self._dispatched[slot]
                    self._lost[slot] = (owner, ticket, back_from)
                    count += 1
            return count

    def unsent(self, owner: object, slot: int, ticket: int) -> None:
        """``owner`` drew ``slot`` for indices no worker got (torch had no worker to send them to): FREE."""
        with self._lock:
            if self._dispatched.get(slot) == (owner, ticket):
                del self._dispatched[slot]
                self._give_back(slot)

    def reclaim(self, owner: object) -> int:
        """``owner``'s DISPATCHED and LOST slots are FREE again (no worker of it can write them, no message of
        its workers is still on its way); how many."""
        with self._lock:
            slots = [slot for slot, (sent_with, _) in self._dispatched.items() if sent_with is owner]
            slots += [slot for slot, (sent_with, _, _) in self._lost.items() if sent_with is owner]
            for slot in slots:
                self._dispatched.pop(slot, None)
                self._lost.pop(slot, None)
                self._give_back(slot)
            return len(slots)

    def _give_back(self, slot: int) -> None:
        if self._shared[slot]:
            self._parked.add(slot)
        else:
            self._free.append(slot)

    def _collect(self) -> None:
        while self._released:
            slot, storage = self._released.popleft()
            self._held.discard(slot)
            self._moved[slot] = storage
        for slot, storage in list(self._moved.items()):
            if storage_gone(storage):  # else the data moved away (share_memory_) and arrays may point here
                del self._moved[slot]
                drop_storage_ref(storage)
                self._give_back(slot)
        if self._guards:
            self._children_gone()

    def _children_gone(self) -> None:
        gone = ring_fork.gone(guard for guard, _ in self._guards)
        if not gone:
            return
        for guard, slots in [entry for entry in self._guards if entry[0] in gone]:
            self._guards.remove((guard, slots))
            self._shared.subtract(slots)
            for slot in slots:
                if not self._shared[slot]:
                    del self._shared[slot]
                    if slot in self._parked:
                        self._parked.discard(slot)
                        self._free.append(slot)

    def in_use(self) -> int:
        with self._lock:
            self._collect()
            return self.slots - len(self._free)

    # --- os.fork() (fastloader.image.ring_fork) ---

    def fork_begins(self) -> frozenset[int]:
        self._lock.acquire()  # released in fork_parent / fork_child: no view is made or let go meanwhile
        self._collect()
        return frozenset(self._held | self._moved.keys())

    def fork_parent(self, slots: frozenset[int], guard: ring_fork.ChildGuard | None) -> None:
        try:
            if guard is not None:
                self._guards.append((guard, slots))
                self._shared.update(slots)
        finally:
            self._lock.release()

    def fork_child(self) -> None:
        self._lock.release()


class LoaderRing:
    """A loader's batch ring (:class:`~fastloader.image.batch_ring.BatchRing`) and its :class:`SlotBook`."""

    def __init__(self, slots: int, slot_bytes: int, device: torch.device) -> None:
        self.book = SlotBook(slots)
        self.ring = BatchRing(slots, slot_bytes, self.book)
        if device.type == "cuda":
            self.ring.pin(device)

    def fits(self, slots: int, slot_bytes: int) -> bool:
        """Whether this ring serves batches of that many slots and bytes here: never in a forked child of the
        process that made it (its slots are that process's to hand out; the child makes its own ring)."""
        return self.ring.pid == os.getpid() and self.ring.slots >= slots and self.ring.slot_bytes >= slot_bytes

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
    """The ring as one torch iterator (one set of workers) uses it: its :class:`WorkerEvents
    <fastloader.torch_internals.WorkerEvents>`, so it knows which worker has which slot."""

    def __init__(self, ring: LoaderRing) -> None:
        self.ring = ring  # kept: markers of this iterator's batches unpickle into it
        self._pid = os.getpid()
        self._drawn: tuple[int, int] | None = None  # the slot (and ticket) of the indices drawn, not yet sent
        self._sent: dict[int, tuple[int, int]] = {}  # slot -> (the worker it was sent to, its ticket)

    def slot(self) -> SlotRef | None:
        """A slot for the next batch of indices (None: every slot in use, the batch gets a fresh buffer; or
        this is a forked child of the process that made the ring, which must never hand out its slots)."""
        if os.getpid() != self._pid:
            return None
        taken = self.ring.book.take(self)
        if taken is None:
            return None
        self._sent.pop(taken[0], None)
        self._drawn = taken
        return SlotRef(self.ring.ring.id, *taken)

    def sent(self, worker: int | None) -> None:
        """torch sent the indices just drawn to ``worker`` (None: to none; the slot they carry is FREE again)."""
        drawn, self._drawn = self._drawn, None
        if drawn is None:
            return
        if worker is None:
            self.ring.book.unsent(self, *drawn)
        else:
            self._sent[drawn[0]] = (worker, drawn[1])

    def worker_lost(self, worker: int) -> int:
        """``worker`` is dead (torch found it so, or a restart replaces it): the slots sent to it that no batch
        came back in are LOST (:meth:`SlotBook.lost`), back once a batch dispatched from now on arrives. Indices
        sent to it again must be stamped anew (:meth:`slot`), never with the slot they had. How many."""
        slots = {slot: ticket for slot, (to, ticket) in self._sent.items() if to == worker}
        for slot in slots:
            del self._sent[slot]
        count = self.ring.book.lost(self, slots)
        if count:
            log.debug("worker %d died: %d batch ring slots come back after its last messages", worker, count)
        return count

    def epoch_starts(self) -> None:
        """The iterator draws the first indices of an epoch. With persistent workers torch's reset has heard
        every worker acknowledge it first, and a worker answers its earlier tasks before: none of them is
        still writing a slot of an earlier epoch, nor is a message of theirs on its way (a fresh iterator has
        sent nothing)."""
        self._sent.clear()
        self._drawn = None
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
        self._sent.clear()
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
