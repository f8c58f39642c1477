"""A ring of batch buffers in shared memory, made once per loader and reused: the protocol, written down once.

A fresh batch buffer per batch costs 70-120 µs per image in page faults (``fastloader.image.pages``), in
the worker that fills it and again in the loader's process that reads it. A DataLoaderX whose dataset
decodes into a fixed-size buffer (``ImageDataset.batch_buffer_size()``) instead gives each batch a *slot*
of a ring allocated once, and a slot is written again only when nothing in the loader's process can
still see it. The parts:

* **The memory** (:class:`BatchRing`): one anonymous shared file (``memfd_create``: no name in /dev/shm,
  so nothing to unlink, even after a SIGKILL; not bounded by a container's small /dev/shm), ``slots``
  slots of ``slot_bytes`` each (page-aligned), made and mapped by the loader's process before its workers
  start. Workers get a :class:`RingHandle` with their ``worker_init_fn`` (the file descriptor travels as
  multiprocessing passes descriptors: inherited under fork, sent under spawn and forkserver) and map it
  once (:func:`attach`). Pages are committed on first use: slots never needed cost no memory.
* **The bookkeeping**, all of it in the loader's process (``fastloader.loader.batch_slots``). A slot is
  FREE, DISPATCHED (stamped on a batch of indices sent to a worker, with a ticket: one number per dispatch)
  or HELD (its batch arrived; tensors view it), or kept out of use while something may still read or write it
  (below). Workers never decide anything: they write the slot they are told to, or a fresh buffer.

One batch, step by step:

1. *Dispatch* (loader's process, where torch's iterator draws the next batch of indices from the
   loader's index sampler): a FREE slot, if any, is stamped on the indices (``SlotRef``), now DISPATCHED
   to that iterator's workers. None free (the user keeps many batches): the batch gets a fresh buffer,
   counted (``stats()["batch_ring"]["fresh"]``). Nothing ever waits for a slot.
2. *Fetch* (worker): unpickling the indices marks the fetch's slot (:func:`begin_fetch`);
   ``allocate_batch`` takes it once (:func:`take`) if the batch fits, and the dataset decodes into it.
3. *Hand-off*: the batch pickles its tensors that view the slot as markers (ring, slot, geometry;
   :func:`pack`), never the pixels, and its small tensors (the labels) by value. Unpickling a marker in the
   loader's process makes the slot HELD and rebuilds the tensor as a view of that process's own mapping:
   ``np.frombuffer`` of the mapping → ``torch.from_numpy``, with ``weakref.finalize`` on that one ndarray.
   ``from_numpy`` keeps a reference to the ndarray until the tensor's storage frees its data, and every view,
   ``.numpy()`` array or storage keeps the storage: the finalizer runs when the last of them is let go, and
   the slot becomes FREE. Unless the storage lives on: ``share_memory_()`` (and a ``torch.multiprocessing``
   queue, which shares what it pickles) copies a storage's data to new shared memory and frees the old, while
   arrays made before still point into the slot and keep only the tensor. The finalizer holds a weak reference
   to the storage: a storage still alive keeps the slot booked until it is gone. The batch also carries the
   slot it was given (:func:`arrived`): a batch that did not use it (a sample skipped, a ``collate_fn`` that
   copied) frees it on arrival.
4. *Reuse*: the slot goes to a worker again only through step 1.

Why no flag in shared memory needs ordering: the loader's last read of a slot happens before its finalizer
runs (same thread, or another thread through the GIL), which happens before the slot is stamped again, which
happens before torch's index queue writes the indices to a pipe (a system call), which happens before the
worker's read of that pipe and so before its first write into the slot. Likewise the worker's writes happen
before its result's pipe write, before the loader reads the marker. System calls on a pipe order memory on
every CPU architecture; nothing here relies on x86's ordering.

A slot whose batch never arrives (the worker raised for that task, was killed, or the loop broke off with
persistent workers) stays DISPATCHED until no worker can write it any more: after torch's iterator has
shut its workers down and every one of them is dead, or after a persistent iterator's reset has heard every
worker acknowledge (each worker answers its earlier tasks first). A worker torch finds dead (and goes on
without) writes nothing more, but a batch it finished may still be on its way: its slots come back once a
batch dispatched after that has arrived (the workers' results come through one pipe, in the order they were
written). Until then it only costs a slot. A slot in use is never written: a user who keeps every batch makes
the ring fall back to fresh buffers, never wait.

A forked child (``os.fork()``, a fork-start ``multiprocessing.Process``) inherits the shared mapping, and with
it the batches held at the fork: those slots are not dispatched again until every such child has exited or
exec'd (``fastloader.image.ring_fork``). A child never hands out its parent's slots: a loader it inherited
makes a ring of its own there, and the markers of one process's ring never unpickle in another.

On CUDA the ring is registered as pinned memory once (``cudaHostRegister``): a batch is one DMA from the
slot the worker wrote, torch's pin-memory thread passes it through (it is already pinned) and the copier
(``fastloader.loader.device``) keeps the host batch referenced until the copy's CUDA event has completed,
so the slot cannot be freed while the copy engine still reads it. Never by timing.
"""

from __future__ import annotations

import logging
import mmap
import os
import secrets
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import reduction
from typing import Any, Protocol

import numpy as np
import torch

from fastloader.image import pages
from fastloader.torch_internals import storage_ref

log = logging.getLogger("fastloader")


class SlotKeeper(Protocol):
    """The loader's bookkeeping of a ring's slots (``fastloader.loader.batch_slots``), as the ring tells it."""

    def held(self, slot: int, ticket: int) -> None:
        """A view of ``slot`` is made in this process (its batch, dispatched as ``ticket``, arrived): -> HELD."""

    def released(self, slot: int, storage: int) -> None:
        """The slot's memory object was let go (a finalizer: any thread, any time). ``storage`` (a weak reference
        to the storage its views shared, :func:`~fastloader.torch_internals.storage_ref`) tells whether every
        view went with it (HELD -> FREE) or the storage moved its data elsewhere (``share_memory_()``, a
        ``torch.multiprocessing`` queue) while arrays made from it may still point into the slot: then the slot
        stays booked until that storage is gone."""

    def arrived(self, slot: int, ticket: int) -> None:
        """The batch stamped with ``slot`` (as ``ticket``) arrived; unless it viewed the slot, -> FREE."""


@dataclass(frozen=True)
class SlotRef:
    """One slot of one ring, dispatched as ``ticket`` (one number per dispatch): stamped on a batch of indices,
    carried back with its batch."""

    ring: int
    slot: int
    ticket: int = 0


def _page_round(nbytes: int) -> int:
    return -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE


class BatchRing:
    """The ring in the process that made it (the loader's): its memory and the views of its slots."""

    def __init__(self, slots: int, slot_bytes: int, keeper: SlotKeeper) -> None:
        if slots < 1 or slot_bytes < 1:
            raise ValueError(f"a batch ring needs slots >= 1 and slot_bytes >= 1, got {slots} and {slot_bytes}")
        self.slots, self.slot_bytes = slots, _page_round(slot_bytes)
        self.nbytes = slots * self.slot_bytes
        self.id = secrets.randbits(62)
        self.pid = os.getpid()
        self.keeper = keeper
        self.pinned = False
        fd = os.memfd_create("fastloader-batch-ring", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, self.nbytes)
            mapping = mmap.mmap(fd, self.nbytes)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        weakref.finalize(self, os.close, fd)
        # The one ndarray over the mapping: each slot's ndarray is a slice of it (its base), so the mapping
        # outlives the ring while any batch still views it.
        self._memory = np.frombuffer(mapping, dtype=np.uint8)
        self._populated = bytearray(slots)
        _OWNED[self.id] = self

    def handle(self) -> RingHandle:
        """What a worker needs to map this ring (pickled with its worker_init_fn)."""
        return RingHandle(self.id, self.fd, self.slots, self.slot_bytes)

    def view(self, slot: int, ticket: int = 0) -> torch.Tensor:
        """Slot ``slot`` (dispatched as ``ticket``) as a 1-D uint8 tensor of this process's mapping; the keeper
        hears when its last view goes."""
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} out of range for a batch ring of {self.slots} slots")
        self.keeper.held(slot, ticket)
        start = slot * self.slot_bytes
        memory = self._memory[start : start + self.slot_bytes]
        if not self._populated[slot]:  # first read of this slot here: its pages in one call, not fault by fault
            pages.populate(memory.ctypes.data, self.slot_bytes, pages.POPULATE_READ)
            self._populated[slot] = 1
        tensor = torch.from_numpy(memory)  # keeps `memory` (only it) until the storage frees or moves its data
        weakref.finalize(memory, self.keeper.released, slot, storage_ref(tensor))
        return tensor

    def pin(self, device: torch.device) -> bool:
        """Register the whole ring as pinned memory for CUDA (once); False (and a warning) when refused."""
        if self.pinned:
            return True
        address = int(self._memory.ctypes.data)
        error = int(torch.cuda.cudart().cudaHostRegister(address, self.nbytes, 1))  # 1: cudaHostRegisterPortable
        if error != 0:
            log.warning(
                "the batch ring (%d MB) could not be pinned (cudaError %d): batches are copied unpinned",
                self.nbytes >> 20,
                error,
            )
            return False
        self.pinned = True
        # When the mapping goes (no ring, no batch left), before it is unmapped: no copy may still read it.
        weakref.finalize(self._memory, _unpin, address, device)
        return True


def _unpin(address: int, device: torch.device) -> None:
    torch.cuda.synchronize(device)
    torch.cuda.cudart().cudaHostUnregister(address)


_OWNED: weakref.WeakValueDictionary[int, BatchRing] = weakref.WeakValueDictionary()


def owned(ring: int) -> BatchRing | None:
    """The ring ``ring`` if this process made it (a forked worker's inherited copy does not count)."""
    found = _OWNED.get(ring)
    return found if found is not None and found.pid == os.getpid() else None


def arrived(ref: SlotRef) -> None:
    """The batch stamped with ``ref`` arrived in the loader's process (its markers, if any, rebuilt already)."""
    ring = owned(ref.ring)
    if ring is not None:
        ring.keeper.arrived(ref.slot, ref.ticket)


# --- the workers' side ------------------------------------------------------------------------------------


class RingHandle:
    """A ring as a worker maps it: its id, geometry and file descriptor (which pickling passes on)."""

    def __init__(self, ring: int, fd: int, slots: int, slot_bytes: int, own_fd: bool = False) -> None:
        self.ring, self.fd, self.slots, self.slot_bytes = ring, fd, slots, slot_bytes
        self.own_fd = own_fd  # a descriptor received for this process: closed once mapped

    def __reduce__(self) -> tuple[Callable[..., RingHandle], tuple[Any, ...]]:
        return _received, (self.ring, reduction.DupFd(self.fd), self.slots, self.slot_bytes)


def _received(ring: int, fd: Any, slots: int, slot_bytes: int) -> RingHandle:
    return RingHandle(ring, fd.detach(), slots, slot_bytes, own_fd=True)


@dataclass
class _Attached:
    """A ring mapped in this worker process."""

    pid: int
    memory: np.ndarray
    slot_bytes: int
    populated: bytearray

    @property
    def address(self) -> int:
        return int(self.memory.ctypes.data)


_ATTACHED: dict[int, _Attached] = {}
_ATTACHING = threading.Lock()  # the subprocess pipeline's worker threads attach at once


def attach(handle: RingHandle) -> None:
    """Map ``handle``'s ring in this process (once per ring); the loader's WorkerStart calls it in each worker."""
    with _ATTACHING:
        if _attached(handle.ring) is None:
            _map(handle)


def _map(handle: RingHandle) -> None:
    mapping = mmap.mmap(handle.fd, handle.slots * handle.slot_bytes)
    if handle.own_fd:
        os.close(handle.fd)  # the mapping keeps its own
    memory = np.frombuffer(mapping, dtype=np.uint8)
    _ATTACHED[handle.ring] = _Attached(os.getpid(), memory, handle.slot_bytes, bytearray(handle.slots))


def _attached(ring: int) -> _Attached | None:
    found = _ATTACHED.get(ring)
    return found if found is not None and found.pid == os.getpid() else None


class _Fetch(threading.local):
    """The slot the fetch running in this thread was given, and whether its batch took it."""

    def __init__(self) -> None:
        self.given: SlotRef | None = None
        self.taken = False


_FETCH = _Fetch()


def begin_fetch(ref: SlotRef | None) -> None:
    """A fetch starts in this thread with slot ``ref`` (None: no slot)."""
    _FETCH.given, _FETCH.taken = ref, False


def end_fetch() -> SlotRef | None:
    """The fetch is over: the slot it was given (used or not), forgotten here."""
    ref, _FETCH.given = _FETCH.given, None
    return ref


def take(nbytes: int) -> torch.Tensor | None:
    """The running fetch's slot as ``nbytes`` of writable uint8 memory (a 1-D tensor), once per fetch; None when
    it has no slot, took it already, or the batch does not fit. In the loader's own process (num_workers=0)
    it is a view of the loader's mapping, held like an arrived batch."""
    ref = _FETCH.given
    if ref is None or _FETCH.taken:
        return None
    ring = owned(ref.ring)
    if ring is not None:
        if nbytes > ring.slot_bytes:
            return None
        _FETCH.taken = True
        return ring.view(ref.slot, ref.ticket)[:nbytes]
    attached = _attached(ref.ring)
    if attached is None or nbytes > attached.slot_bytes:
        return None
    _FETCH.taken = True
    start = ref.slot * attached.slot_bytes
    memory = attached.memory[start : start + nbytes]
    if not attached.populated[ref.slot]:  # first use of this slot in this worker
        pages.populate(memory.ctypes.data, attached.slot_bytes, pages.POPULATE_WRITE)
        attached.populated[ref.slot] = 1
    return torch.from_numpy(memory)


# --- the hand-off: markers instead of pixels -----------------------------------------------------------


class _SlotMemory:
    """A slot's memory in a pickled batch: one per batch, so pickle's memo makes every view of the slot share
    the one ndarray the loader's process rebuilds."""

    def __init__(self, ref: SlotRef) -> None:
        self.ref = ref

    def __reduce__(self) -> tuple[Callable[[int, int, int], torch.Tensor], tuple[int, int, int]]:
        return _slot_memory, (self.ref.ring, self.ref.slot, self.ref.ticket)


class _SlotView:
    """A tensor viewing a slot, pickled as its geometry."""

    def __init__(self, memory: _SlotMemory, size: tuple[int, ...], stride: tuple[int, ...], offset: int) -> None:
        self.memory, self.size, self.stride, self.offset = memory, size, stride, offset

    def __reduce__(self) -> tuple[Callable[..., torch.Tensor], tuple[Any, ...]]:
        return _slot_view, (self.memory, self.size, self.stride, self.offset)


def _slot_memory(ring: int, slot: int, ticket: int = 0) -> torch.Tensor:
    found = owned(ring)
    if found is None:
        raise RuntimeError(
            f"a batch in slot {slot} of batch ring {ring:#x} was unpickled in process {os.getpid()}, which does not"
            " own that ring: ring batches travel only from a DataLoaderX's workers to the DataLoaderX"
        )
    return found.view(slot, ticket)


def _slot_view(memory: torch.Tensor, size: tuple[int, ...], stride: tuple[int, ...], offset: int) -> torch.Tensor:
    return memory.as_strided(size, stride, offset)


def pack(batch: Any, ref: SlotRef) -> Any:
    """``batch`` (a worker's, about to be pickled) with its tensors in slot ``ref`` replaced by markers that
    unpickle as views of the loader's mapping, and its small tensors (labels) by value. Plain lists, tuples and
    dicts are looked into (what collate functions make); a slot tensor anywhere else travels as torch sends any
    tensor (a copy: correct, slower)."""
    attached = _attached(ref.ring)
    if attached is None:
        return batch
    start = attached.address + ref.slot * attached.slot_bytes
    end = start + attached.slot_bytes
    memory = _SlotMemory(ref)

    def marker(value: Any) -> Any:
        if type(value) is not torch.Tensor or value.device.type != "cpu":
            return value
        storage = value.untyped_storage()
        address = storage.data_ptr()
        if value.dtype != torch.uint8 or not start <= address or address + storage.nbytes() > end:
            return _small(value)
        return _SlotView(memory, tuple(value.shape), value.stride(), address - start + int(value.storage_offset()))

    return _replace(batch, marker)


_SMALL_BYTES = 64 << 10
_NUMPY_DTYPES = frozenset(
    {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
    | {torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128}
)


class _Bytes:
    """A small tensor (the labels) pickled by value: torch would share it through a new shared-memory file and a
    descriptor handed over a socket, which costs both processes more than copying a few KB."""

    def __init__(self, value: torch.Tensor) -> None:
        self.data, self.dtype, self.shape = value.numpy().tobytes(), value.dtype, tuple(value.shape)

    def __reduce__(self) -> tuple[Callable[..., torch.Tensor], tuple[Any, ...]]:
        return _from_bytes, (self.data, self.dtype, self.shape)


def _from_bytes(data: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).view(shape)


def _small(value: torch.Tensor) -> Any:
    """``value`` by value when it is small, plain and numpy can hold it; else as it is (torch shares it)."""
    if value.dtype not in _NUMPY_DTYPES or value.nbytes > _SMALL_BYTES or value.layout != torch.strided:
        return value
    if not value.is_contiguous() or value.requires_grad or value.is_conj() or value.is_neg():
        return value
    return _Bytes(value)


def _replace(value: Any, fn: Callable[[Any], Any]) -> Any:
    kind = type(value)
    if kind is list or kind is tuple:
        return kind(_replace(item, fn) for item in value)
    if kind is dict:
        return {key: _replace(item, fn) for key, item in value.items()}
    return fn(value)
