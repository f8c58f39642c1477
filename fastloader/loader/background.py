"""Prefetch any iterable in a background thread.

The thread / shutdown protocol (DataLoaderX builds on it, so it is written down once, here):

* One producer thread pulls items from the source and puts them into a bounded ``queue.Queue``.
  It never blocks forever: every ``put`` waits at most ``_POLL_S`` and then re-checks the stop flag,
  so a consumer that went away cannot strand it on a full queue (the flaw of the widely copied
  ``prefetch_generator.BackgroundGenerator``, whose daemon thread leaks blocked on ``queue.put``).
* An exception raised by the source is put into the queue after the items before it (``_Raised``)
  and re-raised by the consumer at exactly that position, with the producer's traceback. Then the
  producer asks the source again, so the iteration goes on exactly as the source's own would: a
  generator ends after raising, torch's DataLoader iterator continues with the next batch. Exhaustion
  is put into the queue as an ``_End`` marker.
* An exception raised in the consumer itself while it waits (Ctrl-C, an error from a signal handler)
  means the consumer is leaving: the generator closes. The frames of a re-raised exception do not
  refer to the generator, so a traceback that is kept (``pytest.raises``, a notebook's last error)
  does not keep its thread alive.
* The producer thread holds no reference to the ``BackgroundGenerator`` object, only to the shared
  ``_Channel``. So dropping the last reference to the generator (an early ``break``, an exception
  in the training loop, KeyboardInterrupt) lets it be garbage-collected, and its finalizer stops the
  thread. ``close()`` and ``with`` do the same explicitly and also wait for the thread to end.
* Stopping: set the flag, drain the queue (frees the producer's pending ``put`` and the memory of
  prefetched items), join. A producer inside a slow ``next(source)`` notices the flag when that call
  returns; the thread is a daemon so it can never keep the interpreter alive.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_POLL_S = 0.05  # how often a blocked producer / consumer re-checks the other side
_JOIN_TIMEOUT_S = 5.0  # close() waits at most this long for a producer stuck in next(source)


@dataclass(frozen=True)
class _End:
    """Marks the end of the stream."""


@dataclass(frozen=True)
class _Raised:
    """An exception the source raised at this position of the stream."""

    error: BaseException


class _Channel:
    """The state shared by the producer thread and the consumer (never the consumer object itself)."""

    def __init__(self, max_prefetch: int) -> None:
        self.queue: queue.Queue[object] = queue.Queue(maxsize=max_prefetch)
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def put(self, item: object) -> bool:
        """Put ``item``, waiting for room; False when asked to stop first."""
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def drain(self) -> None:
        while True:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                return

    def shutdown(self, join_timeout: float) -> None:
        self.stop.set()
        self.drain()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(join_timeout)
        self.drain()  # the producer may have put one last item before it saw the flag


def _produce(
    holder: list[Iterator[object]],
    channel: _Channel,
    on_exit: Callable[[], None] | None,
    context: Callable[[], AbstractContextManager[Any]] | None,
) -> None:
    with context() if context is not None else contextlib.nullcontext():
        _produce_items(holder, channel)
    if on_exit is not None:
        on_exit()


def _produce_items(holder: list[Iterator[object]], channel: _Channel) -> None:
    # The source arrives in a list that is emptied here, so that Thread's saved arguments do not
    # keep it alive after this function lets go of it.
    source = holder.pop()
    end: _End | None = _End()
    try:
        while not channel.stop.is_set():
            try:
                item: object = next(source)
            except StopIteration:
                break
            except BaseException as error:  # noqa: BLE001 - forwarded to the consumer, re-raised there
                item = _Raised(error)
                del error
            if not channel.put(item):
                end = None  # the consumer left: nobody to tell
                break
            del item  # do not keep the last item alive while waiting in next(source)
    finally:
        # Release the source from this thread now that it is done (a DataLoader iterator's
        # workers shut down when their iterator is freed).
        del source
    if end is not None:
        channel.put(end)  # the consumer learns first; cleaning up may take seconds (stuck workers)


class BackgroundGenerator(Iterator[T], Generic[T]):
    """Iterate over ``iterable`` while a background thread prefetches up to ``max_prefetch`` items.

    A drop-in for the popular ``prefetch_generator.BackgroundGenerator`` that never leaks its
    thread::

        for batch in BackgroundGenerator(loader, max_prefetch=6):
            ...

        with BackgroundGenerator(records) as records:   # stops the thread on leaving the block
            first = next(records)

    Exceptions raised by the iterable are re-raised here, after the items produced before them,
    with their original traceback; the next ``next()`` goes on as the iterable's own would (see the
    module docstring). ``on_exit`` (optional) runs in the producer thread once it is
    done, after the end (or the error) was handed over: slow clean-up never delays the consumer.
    ``on_stall(seconds)`` (optional) is called by the waiting consumer each time a ``next()`` has
    waited another ``stall_after`` seconds for an item (a watchdog; it must not raise).
    ``context`` (optional) makes the context manager the producer thread runs in: DataLoaderX makes
    its CUDA device current there, so that a dataset or ``collate_fn`` run in that thread
    (``num_workers=0``) allocates on the loader's GPU, not on cuda:0.
    """

    def __init__(
        self,
        iterable: Iterable[T],
        max_prefetch: int = 1,
        *,
        name: str | None = None,
        on_exit: Callable[[], None] | None = None,
        stall_after: float | None = None,
        on_stall: Callable[[float], None] | None = None,
        context: Callable[[], AbstractContextManager[Any]] | None = None,
    ) -> None:
        if isinstance(max_prefetch, bool) or not isinstance(max_prefetch, int) or max_prefetch < 1:
            raise ValueError(f"max_prefetch must be an int >= 1 (the queue is bounded), got {max_prefetch!r}")
        if stall_after is not None and not stall_after > 0:
            raise ValueError(f"stall_after must be None or > 0 seconds, got {stall_after!r}")
        self.max_prefetch = max_prefetch
        self._stall_after = stall_after if on_stall is not None else None
        self._on_stall = on_stall
        self._channel = _Channel(max_prefetch)
        self._done = False
        thread = threading.Thread(
            target=_produce,
            args=([iter(iterable)], self._channel, on_exit, context),
            name=name or "fastloader-prefetch",
            daemon=True,
        )
        self._channel.thread = thread
        # Stop the thread when this object is collected, or at interpreter exit at the latest.
        self._finalizer = weakref.finalize(self, self._channel.shutdown, 0.0)
        thread.start()

    def __iter__(self) -> BackgroundGenerator[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        try:
            item = self._get()
        except BaseException:
            self.close(timeout=0.0)  # interrupted while waiting: the consumer is leaving
            raise
        if isinstance(item, _Raised):
            error = item.error
            del item, self  # the traceback keeps this frame: it must not keep the generator alive
            try:
                raise error
            finally:
                del error  # no frame -> error -> traceback -> frame cycle
        if not isinstance(item, _End):
            return item  # type: ignore[return-value]
        self._done = True
        # The producer has said its last word; its on_exit clean-up may still run: do not wait for it.
        self.close(timeout=0.0)
        raise StopIteration

    def _get(self) -> object:
        channel = self._channel
        stall_after = self._stall_after
        began = time.monotonic() if stall_after is not None else 0.0
        next_alarm = stall_after
        while True:
            try:
                return channel.queue.get(timeout=_POLL_S)
            except queue.Empty:
                if next_alarm is not None and stall_after is not None and self._on_stall is not None:
                    waited = time.monotonic() - began
                    if waited >= next_alarm:
                        next_alarm += stall_after
                        self._on_stall(waited)
                thread = channel.thread
                if channel.stop.is_set() or thread is None or not thread.is_alive():
                    # Closed, or the producer is gone: take what it left, else end.
                    try:
                        return channel.queue.get_nowait()
                    except queue.Empty:
                        return _End()

    def close(self, timeout: float = _JOIN_TIMEOUT_S) -> None:
        """Stop the producer thread and drop prefetched items, waiting at most ``timeout`` seconds
        for the thread to end (it always ends soon after). Safe to call more than once."""
        self._done = True
        if self._finalizer.alive:
            self._finalizer.detach()
            self._channel.shutdown(timeout)

    def ready(self) -> int:
        """Items prefetched and waiting (approximate while the producer runs)."""
        return self._channel.queue.qsize()

    def is_alive(self) -> bool:
        """True while the producer thread runs."""
        thread = self._channel.thread
        return thread is not None and thread.is_alive()

    def __enter__(self) -> BackgroundGenerator[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
