"""The batch ring's memory: a slot is let go exactly when its last view goes, workers write what the loader's
process then views (fork, spawn, forkserver), markers travel instead of pixels, nothing is left behind."""

from __future__ import annotations

import gc
import multiprocessing
import pickle
from multiprocessing.reduction import ForkingPickler
from typing import Any

import pytest
import torch

from fastloader.image import batch_ring
from fastloader.image.batch_ring import BatchRing, RingHandle, SlotRef
from fastloader.torch_internals import storage_gone
from tests.helpers import shm_files


class Keeper:
    """The loader's book, reduced to what these tests look at (the real one: fastloader.loader.batch_slots)."""

    def __init__(self) -> None:
        self.dispatched: set[int] = set()
        self.held_slots: set[int] = set()
        self.freed: list[int] = []
        self.moved: list[tuple[int, int]] = []

    def held(self, slot: int, ticket: int) -> None:
        if slot not in self.dispatched:
            raise RuntimeError(f"slot {slot} not dispatched")
        self.dispatched.discard(slot)
        self.held_slots.add(slot)

    def released(self, slot: int, storage: int) -> None:
        self.held_slots.discard(slot)
        if storage_gone(storage):
            self.freed.append(slot)
        else:
            self.moved.append((slot, storage))  # the views' storage lives on, its data elsewhere

    def arrived(self, slot: int, ticket: int) -> None:
        if slot in self.dispatched:
            self.dispatched.discard(slot)
            self.freed.append(slot)


def ring_maps() -> int:
    """How many mappings of a batch ring this process has."""
    with open("/proc/self/maps") as maps:
        return sum("fastloader-batch-ring" in line for line in maps)


def test_a_slot_is_let_go_exactly_when_its_last_view_goes() -> None:
    keeper = Keeper()
    ring = BatchRing(3, 4096, keeper)
    keeper.dispatched.update({0, 1, 2})
    base = ring.view(0)
    image = base[:48].view(4, 4, 3).permute(2, 0, 1)[1:]  # a view of a view
    storage = image.untyped_storage()
    del base
    gc.collect()
    assert keeper.freed == []
    del image
    assert keeper.freed == []  # the storage alone still holds the slot
    del storage
    assert keeper.freed == [0]
    pixels = ring.view(1).numpy()  # an ndarray of the tensor keeps the tensor, so the slot
    gc.collect()
    assert keeper.freed == [0]
    del pixels
    assert keeper.freed == [0, 1]
    assert keeper.moved == []
    with pytest.raises(RuntimeError, match="not dispatched"):
        ring.view(0)  # free again: a view of it now would be a view of memory a worker may write
    with pytest.raises(ValueError, match="out of range"):
        ring.view(3)


def test_a_slot_whose_storage_moved_its_data_is_not_let_go_while_the_storage_lives() -> None:
    """share_memory_() (and pickling through a torch.multiprocessing queue) copies a storage's data to new shared
    memory and frees the slot's memory object; an array made before still points into the slot."""
    keeper = Keeper()
    ring = BatchRing(1, 4096, keeper)
    keeper.dispatched.add(0)
    images = ring.view(0)[:48].view(4, 4, 3)
    images.copy_(torch.arange(48, dtype=torch.uint8).view(4, 4, 3))
    pixels = images.numpy()  # points at the slot, keeps the tensor (not the slot's memory object)
    images.share_memory_()
    assert images.is_shared() and keeper.freed == [] and [slot for slot, _ in keeper.moved] == [0]
    assert pixels.ctypes.data == ring._memory.ctypes.data  # still the slot
    _, storage = keeper.moved[0]
    del images
    assert not storage_gone(storage)  # the array keeps the tensor, and so the storage
    del pixels
    assert storage_gone(storage)


def test_a_fetch_takes_its_slot_once_and_only_when_the_batch_fits() -> None:
    keeper = Keeper()
    ring = BatchRing(2, 1000, keeper)  # slots are page-rounded
    assert ring.slot_bytes % 4096 == 0 and ring.slot_bytes >= 1000
    keeper.dispatched.update({0, 1})
    batch_ring.begin_fetch(SlotRef(ring.id, 1))
    assert batch_ring.take(ring.slot_bytes + 1) is None  # too large: a fresh buffer instead
    taken = batch_ring.take(300)
    assert taken is not None and taken.numel() == 300 and keeper.held_slots == {1}  # this process's own ring
    assert batch_ring.take(10) is None  # one slot per fetch
    assert batch_ring.end_fetch() == SlotRef(ring.id, 1) and batch_ring.end_fetch() is None
    assert batch_ring.take(10) is None  # no fetch, no slot
    batch_ring.begin_fetch(SlotRef(12345, 0))
    assert batch_ring.take(10) is None  # a ring this process neither made nor mapped
    batch_ring.end_fetch()


def _worker(handle: RingHandle, ref: SlotRef, connection: Any) -> None:
    """A stand-in for a DataLoader worker: map the ring, fill the fetch's slot, send the batch pickled."""
    batch_ring.attach(handle)
    batch_ring.begin_fetch(ref)
    memory = batch_ring.take(2 * 8 * 8 * 3)
    assert memory is not None
    images = memory.view(2, 8, 8, 3)
    images.copy_(torch.arange(images.numel(), dtype=torch.int64).remainder(251).to(torch.uint8).view(2, 8, 8, 3))
    channels_first = images.permute(0, 3, 1, 2)
    outside = {"nested": [images[1]]}  # plain containers are looked into
    small = (torch.tensor(2.5), torch.ones(3, dtype=torch.bfloat16), torch.tensor([True, False]), torch.arange(6)[::2])
    batch = [channels_first, torch.tensor([3, 4]), outside, "key", small]
    assert batch_ring.end_fetch() == ref
    connection.send_bytes(bytes(ForkingPickler.dumps(batch_ring.pack(batch, ref))))
    connection.recv()  # torch shares some tensors from this process (bfloat16, views): alive until unpickled
    connection.close()


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_worker_writes_a_slot_and_the_loader_views_it_without_a_copy(method: str) -> None:
    keeper = Keeper()
    ring = BatchRing(4, 8 * 8 * 3 * 2, keeper)
    keeper.dispatched.add(2)
    ref = SlotRef(ring.id, 2)
    context = multiprocessing.get_context(method)
    receiver, sender = context.Pipe()
    process = context.Process(target=_worker, args=(ring.handle(), ref, sender))
    process.start()
    images, labels, outside, key, small = pickle.loads(receiver.recv_bytes())
    receiver.send("done")
    process.join(30)
    assert process.exitcode == 0
    expected = torch.arange(2 * 8 * 8 * 3).remainder(251).to(torch.uint8).view(2, 8, 8, 3).permute(0, 3, 1, 2)
    assert torch.equal(images, expected) and labels.tolist() == [3, 4] and key == "key"
    assert not labels.is_shared()  # small tensors travel by value, not through a shared file and a socket
    assert small[0].item() == 2.5 and small[1].dtype == torch.bfloat16 and small[1].tolist() == [1.0, 1.0, 1.0]
    assert small[2].tolist() == [True, False] and small[3].tolist() == [0, 2, 4]
    assert images.stride() == expected.stride()  # the same geometry: channels_last memory
    slot_start = ring._memory.ctypes.data + 2 * ring.slot_bytes
    assert images.untyped_storage().data_ptr() == slot_start  # a view of this process's mapping
    assert outside["nested"][0].untyped_storage().data_ptr() == slot_start  # one ndarray for the slot
    assert torch.equal(outside["nested"][0], expected[1].permute(1, 2, 0))
    assert keeper.held_slots == {2}
    del images, outside
    gc.collect()
    assert keeper.freed == [2]


def test_a_slot_tensor_in_a_container_of_its_own_travels_as_a_copy() -> None:
    """Only plain lists, tuples and dicts are looked into; a tensor elsewhere goes torch's way (a copy), and the
    slot it was written in is freed when its batch arrives."""

    class Box:
        def __init__(self, tensor: torch.Tensor) -> None:
            self.tensor = tensor

    keeper = Keeper()
    ring = BatchRing(1, 64, keeper)
    batch_ring.attach(ring.handle())  # this process as its own worker, to see the pickled form
    try:
        keeper.dispatched.add(0)
        ref = SlotRef(ring.id, 0)
        slot = batch_ring._attached(ring.id)
        assert slot is not None
        tensor = torch.from_numpy(slot.memory[:16])
        tensor.fill_(9)
        packed = batch_ring.pack([Box(tensor)], ref)
        assert isinstance(packed[0], Box) and packed[0].tensor is tensor
    finally:
        batch_ring._ATTACHED.pop(ring.id)


def test_a_marker_unpickled_where_the_ring_is_not_owned_says_so() -> None:
    with pytest.raises(RuntimeError, match="does not own that ring"):
        batch_ring._slot_memory(999, 1)


def test_the_ring_leaves_nothing_in_dev_shm_and_its_memory_goes_with_its_last_view() -> None:
    gc.collect()
    gc.collect()  # a ring an earlier test left to the collector goes now, not while this one counts
    before_shm, before = shm_files(), ring_maps()
    keeper = Keeper()
    ring = BatchRing(2, 1 << 20, keeper)
    keeper.dispatched.add(0)
    view = ring.view(0)
    view.fill_(1)
    assert shm_files() <= before_shm  # an anonymous memfd: no name to unlink, ever
    assert ring_maps() == before + 1
    del ring
    gc.collect()
    assert ring_maps() == before + 1 and int(view.sum()) == 1 << 20  # the batch still views the mapping
    del view
    gc.collect()
    assert ring_maps() == before
