"""``num_workers="auto"`` and ``prefetch_factor="auto"``: measured on the user's pipeline, at the first ``iter()``.

Trials run torch's own DataLoader over the same dataset, collate_fn and worker_init_fn with 1, 2, 4, ...
workers, up to the cores this rank may use (``fastloader.world.cores_per_rank``: the affinity mask,
the cgroup quota and the ranks sharing the machine). Each trial reads its own random batches (so no
trial is served from the page cache the previous one warmed), leaves out the batches that pay for the
workers' start-up, and times the next ones. Workers keep rising while each step gains at least 10% in
images/s; the knee is kept. ``prefetch_factor="auto"`` covers the jitter of the chosen trial (the p90
of the time between batches over its median, plus one), within a quarter of the free ``/dev/shm``.

The trials ask for batches within ``TRIALS_BUDGET_S`` (5 s) in all, worker start-ups included: a
trial loader waits for a batch only while the budget lasts (its ``timeout``), and asks for none when
the last wait, repeated, would end after it (a worker busy with a batch then finishes it before it
stops). The best count the finished trials found is kept; a dataset too slow for one trial to finish
keeps the provisional number (the cores this rank may use: any number of workers gives a map-style
dataset's items once each), and a warning says so.

An IterableDataset cannot be measured this way (no indices to give the trials), and each worker
iterates its own copy of it: unless it splits its items between the workers itself, ``N`` workers
yield every item ``N`` times. Whether it does is not visible from outside (torch's convention is
``get_worker_info()`` inside ``__iter__``), so a dataset says it with a true ``shards_by_worker``
attribute and gets a worker per core; any other IterableDataset gets 0 workers, with a warning
saying why and how to opt in. A number of workers given by hand is never changed. Every choice is
logged on the ``fastloader`` logger with its reason and what was measured.

The trials touch no state of the user's: the global torch, numpy and ``random`` generators are saved
and restored around them, and the trial loaders draw their worker seeds from a private generator. So
the epochs that follow give the same batches, in the same order, as the chosen numbers given by hand.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from fastloader.loader.nested import iter_tensors
from fastloader.loader.workers.thread import iterate as thread_iterate

log = logging.getLogger("fastloader")
GAIN = 1.10  # a step up in workers must give 10% more images/s to be kept
TRIAL_MIN_S, TRIAL_MAX_S = 0.5, 5.0  # a trial times at least this long (and enough batches), at most that
TRIALS_BUDGET_S = 5.0  # all the trials together, start-ups included
MAX_PREFETCH_FACTOR = 8
_END = object()


class Auto(int):
    """``num_workers`` / ``prefetch_factor`` before the measurement: an int (torch and frameworks compare
    it) that remembers it stands for "auto", so a loader rebuilt from this one's attributes (Lightning
    does) measures too."""

    def __repr__(self) -> str:
        return f"'auto' (provisionally {int(self)})"


@dataclass
class Choice:
    """What the measurement chose, and what it saw (``loader.stats()["autotune"]``)."""

    num_workers: int
    prefetch_factor: int | None
    trials: list[dict[str, float]] = field(default_factory=list)  # num_workers, images_per_s, batches
    seconds: float = 0.0
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def provisional(num_workers: int | str, prefetch_factor: int | str | None) -> tuple[int, int | None]:
    """``"auto"`` stands in as :class:`Auto` ints until the first ``iter()`` measures: as many workers as
    this rank's cores, torch's default prefetch."""
    from fastloader import world

    if num_workers == "auto" or isinstance(num_workers, Auto):
        num_workers = Auto(world.cores_per_rank())
    elif isinstance(num_workers, str):
        raise ValueError(f"num_workers must be an int or 'auto', got {num_workers!r}")
    if prefetch_factor == "auto" or isinstance(prefetch_factor, Auto):
        if num_workers == 0:
            raise ValueError("prefetch_factor='auto' needs worker processes: num_workers > 0 or 'auto'")
        prefetch_factor = Auto(2)
    elif isinstance(prefetch_factor, str):
        raise ValueError(f"prefetch_factor must be an int, None or 'auto', got {prefetch_factor!r}")
    return num_workers, prefetch_factor


def tune(loader: DataLoader[Any]) -> Choice | None:
    """Measure what is still ``"auto"`` of ``loader``'s num_workers / prefetch_factor (None: nothing is)."""
    from fastloader import world

    workers_auto, prefetch_auto = isinstance(loader.num_workers, Auto), isinstance(loader.prefetch_factor, Auto)
    if not (workers_auto or prefetch_auto):
        return None
    counts = candidates(world.cores_per_rank()) if workers_auto else [loader.num_workers]
    return choose(loader, counts, prefetch_auto=prefetch_auto)


def candidates(cores: int) -> list[int]:
    """1, 2, 4, ... and ``cores`` itself."""
    counts, n = [], 1
    while n < cores:
        counts.append(n)
        n *= 2
    return [*counts, max(1, cores)]


def choose(loader: DataLoader[Any], counts: Sequence[int], prefetch_auto: bool) -> Choice:
    """Measure ``loader``'s pipeline with ``counts`` workers in turn, up to the knee and within the budget
    (module docstring); the loader itself is not touched, and what was chosen is logged."""
    start = time.monotonic()
    dataset = loader.dataset
    fixed_prefetch = None if prefetch_auto else loader.prefetch_factor
    default_prefetch = 2 if prefetch_auto else fixed_prefetch
    if isinstance(dataset, IterableDataset):
        if isinstance(loader.num_workers, Auto):
            choice = _iterable_choice(dataset, counts[-1], default_prefetch)
            return _logged(choice, logging.INFO if choice.num_workers else logging.WARNING)
        return _logged(Choice(counts[-1], default_prefetch, reason="not measured: an IterableDataset"))
    if not hasattr(dataset, "__len__") or len(dataset) == 0:
        return _logged(Choice(counts[-1], default_prefetch, reason="not measured: no length"))
    batch_size = loader.batch_size or 1
    order = np.random.default_rng(len(dataset)).permutation(len(dataset))
    deadline = start + TRIALS_BUDGET_S
    trials: list[dict[str, float]] = []
    gaps_of: dict[int, list[float]] = {}
    nbytes = 0
    offset, best, cut = 0, 0, False
    with _rng_untouched():
        for workers in counts:
            need = (workers + max(3 * workers, 4) + 8) * batch_size  # start-up + timed batches, and spare
            indices = np.take(order, np.arange(offset, offset + need), mode="wrap")
            offset += need
            measured = _trial(loader, workers, indices, fixed_prefetch or 2, deadline)
            if measured is None:
                cut = True  # the budget ran out before this trial could time its batches
                break
            rate, gaps, batch_bytes = measured
            nbytes = max(nbytes, batch_bytes)
            trials.append({"num_workers": workers, "images_per_s": rate, "batches": len(gaps)})
            gaps_of[workers] = gaps
            if best and rate < GAIN * trials[-2]["images_per_s"]:
                break  # the knee: this step did not pay
            best = workers
    seconds = time.monotonic() - start
    if not trials:  # too slow to measure: the provisional number stays (any number of workers is correct)
        reason = f"not measured: not one trial timed its batches within the {TRIALS_BUDGET_S:g} s budget"
        return _logged(Choice(counts[-1], default_prefetch, [], seconds, reason), logging.WARNING)
    prefetch = _prefetch_for(gaps_of.get(best, []), best, nbytes) if prefetch_auto else fixed_prefetch
    reason = f"measured, the {TRIALS_BUDGET_S:g} s budget ended the trials" if cut else "measured"
    return _logged(Choice(best, prefetch, trials, seconds, reason))


def _iterable_choice(dataset: Any, cores: int, prefetch: int | None) -> Choice:
    """``"auto"`` for an IterableDataset: each worker iterates its own copy of it, so workers pay only
    when the dataset splits itself between them, which it says with a true ``shards_by_worker``."""
    name = type(dataset).__name__
    if getattr(dataset, "shards_by_worker", False) is True:
        reason = f"not measured: {name} shards itself by worker (shards_by_worker=True), one worker per core"
        return Choice(cores, prefetch, reason=reason)
    reason = (
        f"not measured: {name} is an IterableDataset that does not say it shards itself by worker, and every"
        " worker would yield all its items; when its __iter__ splits them by"
        " torch.utils.data.get_worker_info(), set its shards_by_worker = True, or pass num_workers="
    )
    return Choice(0, None, reason=reason)


def _logged(choice: Choice, level: int = logging.INFO) -> Choice:
    """The choice, logged: what was measured and why this number (a warning where no trial decided it)."""
    measured = ", ".join(f"{t['num_workers']}: {t['images_per_s']:.0f} images/s" for t in choice.trials)
    log.log(
        level,
        "fastloader 'auto': %d worker%s (prefetch_factor %s), %s%s in %.1f s",
        choice.num_workers,
        "" if choice.num_workers == 1 else "s",
        choice.prefetch_factor,
        choice.reason,
        f" ({measured})" if measured else "",
        choice.seconds,
    )
    return choice


def _trial(
    loader: DataLoader[Any], workers: int, indices: np.ndarray, prefetch: int, deadline: float
) -> tuple[float, list[float], int] | None:
    """images/s of ``workers`` workers over ``indices``, the gaps between timed batches, and a batch's
    bytes; None when ``deadline`` comes first. A batch is awaited only while the budget lasts (the trial
    loader's ``timeout``) and only when the previous wait, repeated, would end before the deadline."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return None
    ours = not loader.timeout or remaining < loader.timeout  # whose timeout a "timed out" error is
    batch_size = loader.batch_size or 1
    batches = [indices[i : i + batch_size].tolist() for i in range(0, len(indices) - batch_size + 1, batch_size)]
    threads = getattr(loader, "worker_method", "process") == "thread"  # the trials' workers are the loader's kind
    trial = DataLoader(
        loader.dataset,
        batch_sampler=batches,
        num_workers=workers,
        collate_fn=loader.collate_fn,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=torch.Generator().manual_seed(0),  # the workers' seeds: never from the global generator
        prefetch_factor=prefetch,
        timeout=remaining if ours else loader.timeout,
    )
    iterator: Iterator[Any] = thread_iterate(trial) if threads else iter(trial)
    try:
        return _timed(iterator, workers, deadline)
    except RuntimeError as error:
        if ours and str(error).startswith("DataLoader timed out"):
            return None
        raise
    finally:
        del iterator  # stops the trial's workers


def _timed(iterator: Iterator[Any], workers: int, deadline: float) -> tuple[float, list[float], int] | None:
    """Time the batches of a trial's iterator after each worker's first (which pays for its start-up)."""
    last = time.monotonic()
    wait = 0.0
    for _ in range(workers):
        next(iterator)
        now = time.monotonic()
        wait, last = now - last, now
    begun = last
    gaps: list[float] = []
    images, nbytes = 0, 0
    while True:
        if last + wait > deadline:  # the next batch would come after the budget
            return None
        batch = next(iterator, _END)
        now = time.monotonic()
        if batch is _END:
            break
        wait, last = now - last, now
        gaps.append(wait)
        images += _images(batch)
        nbytes = nbytes or sum(t.nbytes for t in iter_tensors(batch))
        elapsed = now - begun
        if elapsed >= TRIAL_MAX_S or (elapsed >= TRIAL_MIN_S and len(gaps) >= max(3 * workers, 4)):
            break
    elapsed = last - begun
    return (images / elapsed if elapsed > 0 else 0.0), gaps, nbytes


def _images(batch: Any) -> int:
    for tensor in iter_tensors(batch):
        return int(tensor.shape[0]) if tensor.dim() else 1
    return len(batch) if isinstance(batch, Sequence) else 1


def _prefetch_for(gaps: list[float], workers: int, batch_bytes: int) -> int:
    """Batches each worker keeps ready: enough to ride out the trial's jitter, within the shared memory."""
    factor = 2
    if len(gaps) >= 3:
        ordered = sorted(gaps)
        median = ordered[len(ordered) // 2]
        p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
        if median > 0:
            factor = min(MAX_PREFETCH_FACTOR, max(2, math.ceil(p90 / median) + 1))
    free = _shm_free()
    if free is not None and batch_bytes > 0:
        factor = max(1, min(factor, int(free / 4 / (batch_bytes * max(1, workers)))))
    return factor


def _shm_free() -> int | None:
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


class _rng_untouched:
    """Save the global torch, numpy and random generators' states and put them back after the block."""

    def __enter__(self) -> None:
        self.states = (torch.get_rng_state(), np.random.get_state(), random.getstate())

    def __exit__(self, *exc_info: object) -> None:
        torch_state, numpy_state, python_state = self.states
        torch.set_rng_state(torch_state)
        np.random.set_state(numpy_state)
        random.setstate(python_state)
