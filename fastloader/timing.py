"""The worker half of the stage clock: where a dataset's time goes, added up in the thread that spends it.

A dataset (``fastloader.datasets``, the image path) wraps each stage of an item in ``with timed("read"):``,
``timed("decode")`` or ``timed("transform")``; the seconds go to this thread's :func:`tally`, which the
loader's collate wrapper reads and resets once per batch (``fastloader.loader.stage_clock``, the main
process's half: it ships each batch's timing to the loader and accounts for the hand-off, pin and copy).

This module is low in the package on purpose: the workers' code records its stages here without
importing the loader, which runs in another process. Every stage also carries a
``torch.profiler.record_function`` label (``fastloader.read``, ...) while a profiler is recording in
that process; the check costs nanoseconds, the label itself microseconds.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from time import perf_counter

from torch.autograd.profiler import record_function

from fastloader.torch_internals import profiler_enabled

WORKER_STAGES = ("read", "decode", "transform", "dataset", "collate")
MAIN_STAGES = ("handoff", "pin", "h2d")
LOOP_STAGES = ("wait", "step")
STAGES = WORKER_STAGES + MAIN_STAGES + LOOP_STAGES


class Tally(threading.local):
    """Seconds the dataset spent in each stage since the last batch was collated, in this thread."""

    def __init__(self) -> None:
        self.fetch_start: float | None = None
        self.task: int | None = None  # the place of the batch being fetched in its iteration's order (resume)
        self.read = 0.0
        self.decode = 0.0
        self.transform = 0.0


_TALLY = Tally()


def tally() -> Tally:
    """This thread's running tally (datasets add to ``read``, ``decode`` and ``transform``)."""
    return _TALLY


@contextlib.contextmanager
def labelled(stage: str) -> Iterator[None]:
    """``record_function("fastloader.<stage>")`` while a profiler records; nothing otherwise."""
    if not profiler_enabled():
        yield
        return
    with record_function(f"fastloader.{stage}"):
        yield


class timed:
    """``with timed("read"): ...`` adds the block's seconds to this thread's tally (a dataset stage)
    and labels it for a recording profiler."""

    __slots__ = ("stage", "start", "label")

    def __init__(self, stage: str) -> None:
        self.stage = stage

    def __enter__(self) -> None:
        self.label = record_function(f"fastloader.{self.stage}") if profiler_enabled() else None
        if self.label is not None:
            self.label.__enter__()
        self.start = perf_counter()

    def __exit__(self, *exc_info: object) -> None:
        elapsed = perf_counter() - self.start
        setattr(_TALLY, self.stage, getattr(_TALLY, self.stage) + elapsed)
        if self.label is not None:
            self.label.__exit__(*exc_info)
