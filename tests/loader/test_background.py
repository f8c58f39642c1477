"""BackgroundGenerator: order, bounded prefetch, exceptions at their position, prompt and leak-free stop."""

from __future__ import annotations

import gc
import threading
import time
import traceback
from collections.abc import Iterator

import pytest

from fastloader import BackgroundGenerator
from tests.helpers import prefetch_threads, wait_until


def counting(n: int, pulled: list[int]) -> Iterator[int]:
    for i in range(n):
        pulled.append(i)
        yield i


def endless() -> Iterator[int]:
    i = 0
    while True:
        yield i
        i += 1


@pytest.mark.parametrize("source", [list(range(50)), range(50), (i for i in range(50)), iter(list(range(50)))])
def test_yields_every_item_in_order(source: object) -> None:
    assert list(BackgroundGenerator(source, max_prefetch=3)) == list(range(50))  # type: ignore[arg-type]


def test_empty_iterable() -> None:
    assert list(BackgroundGenerator([])) == []


def test_exhausted_generator_keeps_raising_stop_iteration() -> None:
    gen = BackgroundGenerator([1])
    assert list(gen) == [1]
    with pytest.raises(StopIteration):
        next(gen)


@pytest.mark.parametrize("max_prefetch", [0, -1, 1.5, None, True])
def test_rejects_unbounded_or_bad_max_prefetch(max_prefetch: object) -> None:
    with pytest.raises(ValueError, match="max_prefetch"):
        BackgroundGenerator([1], max_prefetch=max_prefetch)  # type: ignore[arg-type]


def test_prefetch_is_bounded() -> None:
    pulled: list[int] = []
    gen = BackgroundGenerator(counting(1000, pulled), max_prefetch=4)
    assert next(gen) == 0
    time.sleep(0.3)  # let the producer run ahead as far as it can
    # one item handed out + 4 in the queue + 1 held by the producer waiting for room
    assert len(pulled) <= 1 + 4 + 1
    gen.close()


def failing_after(n: int) -> Iterator[int]:
    yield from range(n)
    raise_in_producer()


def raise_in_producer() -> None:
    raise KeyError("item 7 is broken")


def test_exception_raised_at_its_position_with_original_traceback() -> None:
    gen = BackgroundGenerator(failing_after(7), max_prefetch=2)
    got = []
    with pytest.raises(KeyError, match="item 7 is broken") as info:
        for item in gen:
            got.append(item)
    assert got == list(range(7))
    frames = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert "raise_in_producer" in frames and "failing_after" in frames
    assert wait_until(lambda: not gen.is_alive(), 2.0)  # it ends on its own right after its last word
    with pytest.raises(StopIteration):  # a generator ends after raising, so this iteration ends too
        next(gen)


class RaisesOnOddItems:
    """An iterator that raises for some items and goes on after, as torch's DataLoader iterator does."""

    def __init__(self, n: int) -> None:
        self.i, self.n = 0, n

    def __iter__(self) -> RaisesOnOddItems:
        return self

    def __next__(self) -> int:
        i, self.i = self.i, self.i + 1
        if i >= self.n:
            raise StopIteration
        if i % 2:
            raise ValueError(f"item {i} is broken")
        return i


def outcomes(iterator: Iterator[int]) -> list[object]:
    """Every ``next()`` until StopIteration: the item, or the message of the error it raised."""
    seen: list[object] = []
    while True:
        try:
            seen.append(next(iterator))
        except ValueError as error:
            seen.append(str(error))
        except StopIteration:
            return seen


def test_the_iteration_goes_on_after_an_exception_as_the_sources_does() -> None:
    through_the_thread = outcomes(BackgroundGenerator(RaisesOnOddItems(7), max_prefetch=2))
    direct = outcomes(RaisesOnOddItems(7))
    assert through_the_thread == direct == [0, "item 1 is broken", 2, "item 3 is broken", 4, "item 5 is broken", 6]


def test_a_kept_traceback_does_not_keep_the_thread_alive() -> None:
    gen = BackgroundGenerator(RaisesOnOddItems(1000), max_prefetch=2)
    next(gen)
    with pytest.raises(ValueError) as info:
        next(gen)
    thread = gen._channel.thread
    del gen
    assert thread is not None and wait_until(lambda: not thread.is_alive(), 2.0)
    assert info.value is not None  # the traceback is still held here


def test_close_stops_a_producer_blocked_on_a_full_queue_promptly() -> None:
    gen = BackgroundGenerator(endless(), max_prefetch=1)
    next(gen)
    time.sleep(0.1)  # the producer is now blocked on put()
    start = time.monotonic()
    gen.close(timeout=120)
    assert time.monotonic() - start < 60  # it is woken, not waited for until the timeout
    assert not gen.is_alive()
    gen.close()  # idempotent


def test_context_manager_stops_the_thread() -> None:
    with BackgroundGenerator(endless(), max_prefetch=2) as gen:
        assert next(gen) == 0
    assert not gen.is_alive()


def test_dropping_the_generator_stops_its_thread() -> None:
    before = prefetch_threads()
    gen = BackgroundGenerator(endless(), max_prefetch=2)
    next(gen)
    del gen
    gc.collect()
    assert wait_until(lambda: prefetch_threads() <= before, timeout=5.0)


def test_early_break_stops_the_thread() -> None:
    before = prefetch_threads()
    for item in BackgroundGenerator(endless(), max_prefetch=3):
        if item == 5:
            break
    assert wait_until(lambda: prefetch_threads() <= before, timeout=5.0)


def test_a_thousand_abandoned_generators_leave_no_thread() -> None:
    baseline = threading.active_count()
    for _ in range(1000):
        gen = BackgroundGenerator(endless(), max_prefetch=2)
        next(gen)
    del gen
    gc.collect()
    assert wait_until(lambda: threading.active_count() <= baseline, timeout=10.0)


def test_consumer_in_another_thread_than_creator() -> None:
    gen = BackgroundGenerator(range(100), max_prefetch=5)
    out: list[int] = []
    reader = threading.Thread(target=lambda: out.extend(gen))
    reader.start()
    reader.join(10)
    assert out == list(range(100))
