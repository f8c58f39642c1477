"""The loader's running account of where time goes: totals since it was made, and a window of recent batches.

Two threads write here, each its own records: DataLoaderX's producer thread adds each batch's
:class:`~fastloader.loader.stage_clock.BatchTiming` (the worker stages, hand-off, pin, copy), the
training loop adds its ``wait`` for each batch and its ``step`` between batches. Time outside an
epoch (validation, checkpoints) is no one's: a ``step`` is only counted between two batches of the
same epoch.

    wait_fraction = total wait / (total wait + total step)

is the share of the training loop's time spent waiting for data: the figure TensorFlow's input
pipeline analyser grades (under 5%: not input-bound; 5-20%: moderately; 20% or more: highly).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastloader.loader.stage_clock import BatchTiming
from fastloader.timing import LOOP_STAGES, MAIN_STAGES, WORKER_STAGES

WINDOW = 1024  # recent batches kept for percentiles and the timeline
_WHERE = {**dict.fromkeys(WORKER_STAGES, "workers"), **dict.fromkeys(MAIN_STAGES, "main process")}
_WHERE.update(wait="training loop", step="training loop")


def percentiles(values: Sequence[float]) -> dict[str, float] | None:
    """p50 / p90 / p99 of ``values`` (nearest rank), None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    last = len(ordered) - 1
    return {f"p{p}": ordered[min(last, round(p / 100 * last))] for p in (50, 90, 99)}


@dataclass(frozen=True)
class Mark:
    """A copy of the counters of a :class:`StageStats` at one moment."""

    totals: dict[str, float]
    measured: dict[str, int]
    images: int
    batches: int
    produced: int


class StageStats:
    """Stage seconds of one loader (thread-safe); :meth:`summary` is what ``loader.stats()`` shows."""

    def __init__(self, window: int | None = WINDOW) -> None:
        self._lock = threading.Lock()
        self._totals = dict.fromkeys(WORKER_STAGES + MAIN_STAGES + LOOP_STAGES, 0.0)
        self._measured = dict.fromkeys(self._totals, 0)  # batches that measured each stage
        self._images = 0  # images in the batches the training loop received
        self._batches = 0
        self._produced_images = 0  # images in the batches the producer thread timed
        self._recent: deque[BatchTiming] = deque(maxlen=window)
        self._loop: deque[tuple[float, float, float, int, int, int]] = deque(maxlen=window)
        self.started = time.monotonic()

    def __reduce__(self) -> tuple[type[StageStats], tuple[int | None]]:
        return StageStats, (self._recent.maxlen,)  # a copy (of a loader) starts its own account

    def add_batch(self, timing: BatchTiming) -> None:
        """A batch the producer thread took from torch's iterator (worker, hand-off, pin and copy times)."""
        with self._lock:
            self._recent.append(timing)
            self._produced_images += timing.images
            for stage in WORKER_STAGES + MAIN_STAGES:
                value = getattr(timing, stage)
                if value is not None:
                    self._totals[stage] += value
                    self._measured[stage] += 1

    def add_delivery(self, wait: float, step: float | None, images: int, prefetched: int, in_workers: int) -> None:
        """A batch the training loop received after waiting ``wait`` s, ``step`` s after the previous one
        (None for an epoch's first); ``prefetched`` / ``in_workers``: batches ready in each queue then."""
        with self._lock:
            self._images += images
            self._batches += 1
            self._totals["wait"] += wait
            self._measured["wait"] += 1
            if step is not None:
                self._totals["step"] += step
                self._measured["step"] += 1
            self._loop.append((time.monotonic() - self.started, wait, step or 0.0, images, prefetched, in_workers))

    @property
    def delivered(self) -> int:
        """Batches the training loop received."""
        return self._batches

    def mark(self) -> Mark:
        """Where the account stands now: ``summary(since=mark)`` covers only what came after."""
        with self._lock:
            return Mark(dict(self._totals), dict(self._measured), self._images, self._batches, self._produced_images)

    def summary(self, since: Mark | None = None) -> dict[str, Any]:
        """Totals, per-image and per-batch figures of every stage, rates and the recent timeline; of
        everything, or of what came after ``since`` (a :meth:`mark`)."""
        with self._lock:
            totals, measured = dict(self._totals), dict(self._measured)
            recent, loop = list(self._recent), list(self._loop)
            images, batches, produced = self._images, self._batches, self._produced_images
        if since is not None:
            new_produced = measured["collate"] - since.measured["collate"]  # every produced batch has a collate
            recent = recent[len(recent) - min(len(recent), new_produced) :]
            loop = loop[len(loop) - min(len(loop), batches - since.batches) :]
            totals = {stage: total - since.totals[stage] for stage, total in totals.items()}
            measured = {stage: count - since.measured[stage] for stage, count in measured.items()}
            images, batches, produced = images - since.images, batches - since.batches, produced - since.produced
        loop_time = totals["wait"] + totals["step"]
        stages: dict[str, Any] = {}
        for stage, total in totals.items():
            if not measured[stage]:
                continue
            base = images if stage in LOOP_STAGES else produced
            if stage in LOOP_STAGES:
                per_batch = [row[1] if stage == "wait" else row[2] for row in loop]
            else:
                per_batch = [v for v in (getattr(t, stage) for t in recent) if v is not None]
            stages[stage] = {
                "total_s": total,
                "per_image_ms": 1000 * total / base if base else None,
                "per_batch_ms": _scaled(percentiles(per_batch), 1000),
                "where": _WHERE[stage],
            }
        return {
            "batches": batches,
            "images": images,
            "images_per_s": images / loop_time if loop_time > 0 else None,
            "wait_fraction": totals["wait"] / loop_time if loop_time > 0 else None,
            "stages": stages,
            "queues": _queues(loop),
            "timeline": timeline(loop),
        }


def _scaled(values: Mapping[str, float] | None, factor: float) -> dict[str, float] | None:
    return None if values is None else {key: value * factor for key, value in values.items()}


def _queues(loop: Sequence[tuple[float, float, float, int, int, int]]) -> dict[str, Any]:
    if not loop:
        return {"prefetch_mean": None, "workers_mean": None}
    return {
        "prefetch_mean": sum(row[4] for row in loop) / len(loop),
        "workers_mean": sum(row[5] for row in loop) / len(loop),
    }


def timeline(loop: Iterable[tuple[float, float, float, int, int, int]], points: int = 120) -> list[dict[str, float]]:
    """The recent deliveries as at most ``points`` points: time, images/s, and the queues' depth.

    Each point covers a run of consecutive deliveries (at least 4); its rate is their images over the
    time since the previous point's last delivery, so a batch that happened to be ready does not spike.
    """
    rows = list(loop)
    if len(rows) < 2:
        return []
    size = max(4, -(-len(rows) // points))
    result = []
    previous = rows[0][0]
    for start in range(1, len(rows), size):
        chunk = rows[start : start + size]
        elapsed = chunk[-1][0] - previous
        previous = chunk[-1][0]
        result.append(
            {
                "t": chunk[-1][0],
                "images_per_s": sum(row[3] for row in chunk) / elapsed if elapsed > 0 else 0.0,
                "prefetch_queue": sum(row[4] for row in chunk) / len(chunk),
                "worker_queue": sum(row[5] for row in chunk) / len(chunk),
            }
        )
    return result
