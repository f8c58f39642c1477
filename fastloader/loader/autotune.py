"""``num_workers="auto"`` and ``prefetch_factor="auto"``: measured on the user's pipeline, at the first ``iter()``.

Trials run torch's own DataLoader over the same dataset, collate_fn and worker_init_fn with 1, 2, 4, ...
workers, up to the cores this rank may use (``fastloader.world.cores_per_rank``: the affinity mask,
the cgroup quota and the ranks sharing the machine). Each trial reads its own random batches (so no
trial is served from the page cache the previous one warmed), leaves out the batches that pay for the
workers' start-up, and times the next ones. Workers keep rising while each step gains at least 10% in
images/s; the knee is kept. ``prefetch_factor="auto"`` covers the jitter of the chosen trial (the p90
of the time between batches over its median, plus one), within a quarter of the free ``/dev/shm``.

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

log = logging.getLogger("fastloader")
GAIN = 1.10  # a step up in workers must give 10% more images/s to be kept
TRIAL_MIN_S, TRIAL_MAX_S = 0.5, 5.0  # a trial times at least this long (and enough batches), at most that
MAX_PREFETCH_FACTOR = 8


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


def candidates(cores: int) -> list[int]:
    """1, 2, 4, ... and ``cores`` itself."""
    counts, n = [], 1
    while n < cores:
        counts.append(n)
        n *= 2
    return [*counts, max(1, cores)]


def choose(loader: DataLoader[Any], counts: Sequence[int], prefetch_auto: bool) -> Choice:
    """Measure ``loader``'s pipeline with ``counts`` workers in turn, up to the knee (module docstring);
    the loader itself is not touched."""
    start = time.perf_counter()
    dataset = loader.dataset
    fixed_prefetch = None if prefetch_auto else loader.prefetch_factor
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__") or len(dataset) == 0:
        return Choice(counts[-1], 2 if prefetch_auto else fixed_prefetch, reason="not measured: no random access")
    batch_size = loader.batch_size or 1
    order = np.random.default_rng(len(dataset)).permutation(len(dataset))
    trials: list[dict[str, float]] = []
    gaps_of: dict[int, list[float]] = {}
    nbytes = 0
    offset, best = 0, 0
    with _rng_untouched():
        for workers in counts:
            need = (workers + max(3 * workers, 4) + 8) * batch_size  # start-up + timed batches, and spare
            indices = np.take(order, np.arange(offset, offset + need), mode="wrap")
            offset += need
            rate, gaps, batch_bytes = _trial(loader, workers, indices, fixed_prefetch or 2)
            nbytes = max(nbytes, batch_bytes)
            trials.append({"num_workers": workers, "images_per_s": rate, "batches": len(gaps)})
            gaps_of[workers] = gaps
            if best and rate < GAIN * trials[-2]["images_per_s"]:
                break  # the knee: this step did not pay
            best = workers
    prefetch = fixed_prefetch
    if prefetch_auto:
        prefetch = _prefetch_for(gaps_of.get(best, []), best, nbytes)
    choice = Choice(best, prefetch, trials, time.perf_counter() - start, "measured")
    log.info(
        "fastloader 'auto': %d workers (prefetch_factor %s) after %s in %.1f s",
        best,
        prefetch,
        ", ".join(f"{t['num_workers']}: {t['images_per_s']:.0f} images/s" for t in trials),
        choice.seconds,
    )
    return choice


def _trial(loader: DataLoader[Any], workers: int, indices: np.ndarray, prefetch: int) -> tuple[float, list[float], int]:
    """images/s of ``workers`` workers over ``indices``, the gaps between timed batches, and a batch's bytes."""
    batch_size = loader.batch_size or 1
    batches = [indices[i : i + batch_size].tolist() for i in range(0, len(indices) - batch_size + 1, batch_size)]
    trial = DataLoader(
        loader.dataset,
        batch_sampler=batches,
        num_workers=workers,
        collate_fn=loader.collate_fn,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=torch.Generator().manual_seed(0),  # the workers' seeds: never from the global generator
        prefetch_factor=prefetch,
        timeout=loader.timeout,
    )
    iterator: Iterator[Any] = iter(trial)
    try:
        for _ in range(workers):  # each worker's first batch pays for its start-up
            next(iterator)
        begun = last = time.perf_counter()
        gaps: list[float] = []
        images, nbytes = 0, 0
        for batch in iterator:
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
            images += _images(batch)
            nbytes = nbytes or sum(t.nbytes for t in iter_tensors(batch))
            elapsed = now - begun
            if elapsed >= TRIAL_MAX_S or (elapsed >= TRIAL_MIN_S and len(gaps) >= max(3 * workers, 4)):
                break
    finally:
        del iterator  # stops the trial's workers
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
