"""The lease book of remote workers (``fastloader.loader.workers.lease_book``), without Ray: bounded leases,
re-issued on a worker's death, late results dropped, in-order delivery, a batch that kills its workers named."""

from __future__ import annotations

import random

import pytest

from fastloader.errors import BatchKillsWorkers
from fastloader.loader.workers.lease_book import Lease, LeaseBook


def _batches(count: int, size: int = 2) -> list[tuple[int, list[int]]]:
    return [(n, list(range(n * size, n * size + size))) for n in range(count)]


def _book(count: int, in_flight: int = 3, max_deaths: int = 2) -> LeaseBook:
    return LeaseBook(7, iter(_batches(count)), in_flight, max_deaths)


def _take_all(book: LeaseBook) -> list[tuple[int, Lease]]:
    out = []
    while (taken := book.take()) is not None:
        out.append(taken)
    return out


def test_no_more_than_in_flight_leases_are_held_until_the_loop_receives_one() -> None:
    book = _book(10, in_flight=3)
    taken = _take_all(book)
    assert [lease.number for _, lease in taken] == [0, 1, 2] and book.take() is None
    for ticket, lease in taken[1:]:
        assert book.done(ticket, f"batch {lease.number}")
    assert book.take() is None  # done ahead of the loop still counts: batch 0 holds the line
    assert book.deliver() is None  # in order: 1 and 2 wait for 0
    assert book.done(*taken[0][0:1], "batch 0")
    assert [book.deliver()[1] for _ in range(3)] == ["batch 0", "batch 1", "batch 2"]  # type: ignore[index]
    assert [lease.number for _, lease in _take_all(book)] == [3, 4, 5]
    assert all(lease.epoch == 7 for _, lease in taken)


def test_a_lost_lease_goes_out_again_first_and_its_late_result_is_dropped() -> None:
    book = _book(5, in_flight=3)
    (t0, l0), (t1, l1), (t2, l2) = _take_all(book)
    assert book.lost(t1) == l1
    again = book.take()
    assert again is not None and again[1] == l1 and again[0] not in (t0, t1, t2)
    assert book.done(t1, "late") is False and book.dropped == 1  # the dead worker's answer after all
    assert book.done(again[0], "b1") and book.done(t0, "b0") and book.done(t2, "b2")
    assert book.done(again[0], "twice") is False and book.dropped == 2
    assert [book.deliver()[1] for _ in range(3)] == ["b0", "b1", "b2"]  # type: ignore[index]
    assert book.reissued == 1


def test_lost_leases_go_out_again_in_the_order_of_the_batches() -> None:
    book = _book(6, in_flight=4)
    taken = _take_all(book)
    for ticket, _ in reversed(taken[:3]):
        book.lost(ticket)
    assert [book.take()[1].number for _ in range(3)] == [0, 1, 2]  # type: ignore[index]


def test_a_batch_out_on_two_dying_workers_is_named() -> None:
    book = _book(4, in_flight=2, max_deaths=2)
    (t0, _), _ = _take_all(book)
    book.lost(t0)
    again = book.take()
    assert again is not None
    with pytest.raises(BatchKillsWorkers, match=r"batch 0 of epoch 7 \(sample indices \[0, 1\]\)"):
        book.lost(again[0])


def test_a_loss_after_the_result_came_changes_nothing() -> None:
    book = _book(2, in_flight=2)
    (t0, _), (t1, _) = _take_all(book)
    assert book.done(t0, "b0")
    assert book.lost(t0) is None and book.take() is None


@pytest.mark.parametrize("seed", range(20))
def test_any_schedule_of_results_and_deaths_delivers_every_batch_once_in_order(seed: int) -> None:
    """A random driver: results in any order, workers dying with leases out, late answers of the dead."""
    rng = random.Random(seed)
    book = LeaseBook(0, iter(_batches(40)), rng.randint(1, 6), max_deaths=100)
    out: list[tuple[int, Lease]] = []
    dead: list[tuple[int, Lease]] = []
    delivered = []
    while not book.finished:
        while (taken := book.take()) is not None:
            out.append(taken)
            assert book.held() <= book.in_flight or book.reissued  # re-issues are never held back
        rng.shuffle(out)
        if out:
            ticket, lease = out.pop()
            roll = rng.random()
            if roll < 0.2:
                book.lost(ticket)
                dead.append((ticket, lease))
            else:
                book.done(ticket, lease.number)
        if dead and rng.random() < 0.3:
            book.done(*dead.pop())  # a dead worker's answer arrives after all: dropped
        while (item := book.deliver()) is not None:
            delivered.append(item[1])
    assert delivered == list(range(40))
