"""The batch ring's books: a slot a dead worker had comes back only once none of that worker's messages can still
arrive; indices torch sent nowhere give their slot back; a slot whose views' storage moved stays booked."""

from __future__ import annotations

import torch

from fastloader.loader.batch_slots import LoaderRing, RingDispatch, SlotBook


def test_a_dead_workers_slot_comes_back_once_a_batch_dispatched_after_its_death_arrived() -> None:
    book, owner = SlotBook(3), object()
    dead, alive = book.take(owner), book.take(owner)
    assert dead is not None and alive is not None
    assert book.lost(owner, {dead[0]: dead[1]}) == 1
    assert book.lost(owner, {alive[0]: alive[1] + 1}) == 0  # another dispatch of that slot: not the dead one's
    book.arrived(*alive)  # sent before the death: a message of the dead worker may still follow it
    assert book.in_use() == 1
    later = book.take(owner)
    assert later is not None and later[0] != dead[0]
    book.held(*later)  # the first batch dispatched after the death: nothing of the dead worker's can follow
    assert book.in_use() == 1  # only `later`, held
    assert book.take(owner) is not None and book.take(owner) is not None  # the dead worker's slot served again


def test_a_batch_the_dead_worker_finished_still_arrives_into_its_slot() -> None:
    book, owner = SlotBook(2), object()
    dead = book.take(owner)
    assert dead is not None
    book.lost(owner, {dead[0]: dead[1]})
    book.held(*dead)  # its last message, already on its way: the slot is its batch's
    assert book.take(owner) is not None and book.take(owner) is None  # the held slot is not handed out
    book.released(dead[0], storage_of_nothing())
    assert book.in_use() == 1


def storage_of_nothing() -> int:
    """A weak reference to a storage already gone (the normal end of a slot's views)."""
    from fastloader.torch_internals import storage_ref

    return storage_ref(torch.empty(1))


def test_the_dispatch_knows_which_worker_has_which_slot() -> None:
    """torch answers each draw with the worker it sent the indices to (or none)."""
    ring = LoaderRing(3, 4096, torch.device("cpu"))
    dispatch = RingDispatch(ring)
    for worker in (0, 1, None):
        assert dispatch.slot() is not None
        dispatch.sent(worker)
    assert ring.book.in_use() == 2  # the indices sent nowhere gave their slot back
    assert dispatch.worker_lost(1) == 1 and dispatch.worker_lost(1) == 0 and dispatch.worker_lost(0) == 1
    assert ring.book.in_use() == 2  # lost: a message of theirs may still come
    dispatch.epoch_starts()  # (a persistent iterator's reset heard every worker): nothing can come any more
    assert ring.book.in_use() == 0
