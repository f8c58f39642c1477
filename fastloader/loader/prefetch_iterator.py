"""One epoch of a DataLoaderX as the training loop iterates it: torch's iterator drained by a producer thread.

The producer thread (``fastloader.loader.background``) takes each batch from torch's iterator, unwraps the
stage clock's timing and the worker's resume state, and queues the batch's copy on the side stream
(``fastloader.loader.device``); the training loop's ``next()`` takes it from the bounded queue, waits for the
copy, records the batch with the resume cursor's progress and the stage clock, and logs the verdict every
``report_every`` batches.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fastloader.loader.background import BackgroundGenerator
from fastloader.loader.device import CudaCopier
from fastloader.loader.epoch_progress import Progress
from fastloader.loader.length_check import LengthCheck
from fastloader.loader.nested import iter_tensors
from fastloader.loader.stage_clock import TimedBatch
from fastloader.loader.stage_stats import StageStats
from fastloader.loader.watchdog import StackDir, stalled
from fastloader.loader.worker_state import Delivery
from fastloader.timing import labelled
from fastloader.torch_internals import batches_in_workers, shutdown_workers

_QUICK_JOIN_S = 0.5  # how long the training loop waits for a finished producer thread to end


class PrefetchIterator(Iterator[Any]):
    """One epoch of a DataLoaderX: torch's iterator drained by a producer thread.

    Only the producer thread touches torch's iterator, and it also shuts its workers down when it
    stops (end of epoch, error, close), so no two threads ever drive the iterator at once.
    """

    def __init__(
        self,
        source: Iterator[Any],
        copier: CudaCopier | None,
        max_prefetch: int,
        owns_workers: bool,
        progress: Progress | None = None,
        stats: StageStats | None = None,
        report: Callable[[], None] | None = None,
        report_every: int | None = None,
        stall_warning: float | None = None,
        stack_dir: StackDir | None = None,
        context: Callable[[], Any] | None = None,
        moved_on: Callable[[PrefetchIterator], PrefetchIterator | None] | None = None,
    ) -> None:
        self._moved_on = moved_on  # asked at the first next(): the epoch that takes this one's place, if any
        self._source = source
        self._progress = progress
        self._length = LengthCheck(source)
        self._copier = copier
        self._stats = stats if stats is not None else StageStats()
        self._report, self._report_every = report, report_every
        self._delivered_at: float | None = None  # when the training loop got the previous batch
        self._ahead: Any = None  # at_end(): the producer's next word, taken but not yet handed out (or its error)
        consumer = torch.cuda.current_stream(copier.device) if copier is not None else None
        produced = map(functools.partial(_arrive, copier=copier, consumer=consumer, stats=self._stats), source)
        self._background: BackgroundGenerator[Any] = BackgroundGenerator(
            produced,
            max_prefetch,
            name="fastloader-dataloaderx",
            on_exit=functools.partial(shutdown_workers, source) if owns_workers else None,
            stall_after=stall_warning,
            on_stall=functools.partial(stalled, weakref.ref(source), stack_dir) if stall_warning else None,
            context=context,
        )

    def __iter__(self) -> PrefetchIterator:
        return self

    def __next__(self) -> Any:
        asked = time.perf_counter()
        if self._moved_on is not None:
            moved_on, self._moved_on = self._moved_on, None
            replacement = moved_on(self)
            if replacement is not None:
                self._take_over(replacement)
        progress = self._progress
        while True:
            try:
                item, delivery = self._take()
            except StopIteration:
                if progress is not None:
                    progress.done = True
                # The producer has handed over its last word; it stops the workers on its own, which
                # may take torch 5 s for a stuck worker: the training loop does not wait for that.
                self._background.close(timeout=_QUICK_JOIN_S)
                raise
            except Exception:
                # An error from a worker / collate / the copy: as with torch's iterator, the next next()
                # continues the epoch (with the next batch: this one counts as received). A traceback kept
                # by the caller must not keep this epoch (its thread and workers) alive: dropping the
                # iterator stops them.
                if progress is not None:
                    if progress.ledger is not None:
                        progress.ledger.failed()
                    progress.failed()
                del self, progress
                raise
            if progress is not None:
                if progress.ledger is not None and (delivery is None or not delivery.end):
                    # ledger=: the training loop receives this batch (where the resume cursor counts it received)
                    progress.ledger.delivered(delivery)
                progress.record(delivery)  # here, in the consumer: the producer thread runs ahead
            if delivery is None or not delivery.end:
                break  # (a worker's end of data comes as a batch-less delivery: its state only)
        if self._copier is not None:
            item = self._copier.receive(item)
        self._delivered(item, asked)
        self._length.check(progress.batches if progress is not None else 0)
        return item

    def _take(self) -> tuple[Any, Delivery | None]:
        """The producer's next word: the one ``at_end`` took ahead, else the next from its queue."""
        ahead: Any = self._ahead
        self._ahead = None
        if isinstance(ahead, BaseException):
            raise ahead
        if ahead is not None:
            return ahead  # type: ignore[no-any-return,unused-ignore]
        with labelled("wait"):
            return next(self._background)

    def at_end(self) -> bool:
        """Whether the epoch has no batch left: waits for the next one (or the end) without handing it out,
        so that it is not received yet (the resume cursor and the ledger count it at the ``next()`` that
        returns it). For a loader that must know at a batch whether it is the last (accelerate's
        ``end_of_dataloader``): a state taken at the last batch then names the next epoch."""
        progress = self._progress
        while self._ahead is None:
            try:
                item, delivery = self._take()
            except StopIteration as stop:
                self._ahead = stop
                if progress is not None:
                    progress.done = True
            except Exception as error:  # noqa: BLE001 - handed to the next next(), as torch's iterator raises it
                self._ahead = error
            else:
                if delivery is not None and delivery.end and progress is not None:
                    progress.record(delivery)  # a worker's end of data: its state only, never a batch
                else:
                    self._ahead = (item, delivery)
        return isinstance(self._ahead, StopIteration)

    def _take_over(self, replacement: PrefetchIterator) -> None:
        """Deliver ``replacement``'s epoch from here on (the training loop holds this iterator); this one's
        producer has stopped. ``replacement`` is left an empty shell: closing it finds nothing to close."""
        state = replacement.__dict__.copy()
        replacement.__dict__.clear()
        self.__dict__.update(state)

    def _delivered(self, item: Any, asked: float) -> None:
        now = time.perf_counter()
        step = asked - self._delivered_at if self._delivered_at is not None else None
        self._delivered_at = now
        stats = self._stats
        ready = self._background.ready()
        stats.add_delivery(now - asked, step, batch_size(item), ready, batches_in_workers(self._source))
        every = self._report_every
        if self._report is not None and every and stats.delivered % every == 0:
            self._report()

    def __len__(self) -> int:
        return len(self._source)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # Anything else is torch's iterator's: code written against torch reads its state (``_workers``,
        # ``_num_yielded``, ``_shutdown``...) from the object iter() returned.
        source = self.__dict__.get("_source")
        if source is None:
            raise AttributeError(name)
        return getattr(source, name)

    def close(self) -> None:
        """Stop prefetching now; the producer stops the workers too unless they are persistent."""
        background = self.__dict__.get("_background")
        if background is not None:  # None: an iterator another one took over (_take_over)
            background.close()

    def __del__(self) -> None:
        # An early ``break`` drops the iterator: stop the thread and the workers now, not whenever
        # the producer happens to notice.
        try:
            self._background.close(timeout=_QUICK_JOIN_S)
        except Exception:  # noqa: BLE001 - never raise from __del__ (interpreter may be shutting down)
            pass


def _arrive(item: Any, copier: CudaCopier | None, consumer: Any, stats: StageStats) -> tuple[Any, Delivery | None]:
    """Producer thread, per batch: unwrap the timed batch, queue its copy to the GPU, record its times;
    the batch goes on with its worker's state (None when it has none)."""
    timing = delivery = None
    if isinstance(item, TimedBatch):
        item, timing, delivery = item.batch, item.timing, item.state
        if delivery is not None and delivery.end:
            return None, delivery
        if timing is not None:
            timing.images = batch_size(item)  # counted as the training loop counts them
    if copier is not None:
        start = time.perf_counter()
        with labelled("h2d"):
            item = copier.send(item, consumer=consumer, flips=delivery.flips if delivery is not None else None)
        if timing is not None:
            timing.h2d = time.perf_counter() - start
    if timing is not None:
        stats.add_batch(timing)
    return item, delivery


def batch_size(batch: Any) -> int:
    """Images in a delivered batch, for the stage clock: the leading size of its first tensor, the length
    of a list without one, else 1. Never raises: timing must not fail a batch it cannot count (a nested
    tensor has no sizes; a sparse or custom tensor may refuse what a strided one answers)."""
    for tensor in iter_tensors(batch):
        try:
            return int(tensor.size(0)) if tensor.dim() > 0 else 1
        except (RuntimeError, TypeError, ValueError, NotImplementedError):
            return 1
    return len(batch) if isinstance(batch, list) else 1
