"""What the stage clock costs: the same pipeline with the loader's clock on and off, and its parts timed alone.

The clock is always on (``loader.stats()`` needs nothing switched on), so its cost must stay under 1%.
Two measurements, in one run:

* end to end: DataLoaderX over fastloader's LMDB + train transforms, clock on / off (the loader's
  wrappers: timed collate, stamped indices, the hand-off stamp, the records), A B A B, medians. On a
  shared 2-core machine the run-to-run noise is larger than the clock, so
* the parts alone: the dataset's three timed blocks per image and the loader's work per batch, timed in a
  loop, as a share of the pipeline's measured time per image (single-threaded decode + crop + resize).

    python benchmarks/bench_stage_clock.py [--images 2000] [--workers 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import default_collate

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import LMDBDataset
from fastloader.loader.stage_clock import StampedIndices, TimedCollate
from fastloader.loader.stage_stats import StageStats
from fastloader.pack import pack
from fastloader.sample import make_sample_folder
from fastloader.timing import timed

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def epoch_rate(dataset: Any, workers: int, batch_size: int, clock: bool) -> float:
    loader = DataLoaderX(dataset, batch_size=batch_size, shuffle=True, num_workers=workers)
    loader._plan = dataclasses.replace(loader._plan, stage_clock=clock)  # the loader's side of the clock
    start, seen = time.perf_counter(), 0
    for images, _ in loader:
        seen += images.shape[0]
    return seen / (time.perf_counter() - start)


def per_call_us(function: Any, count: int = 20000) -> float:
    start = time.perf_counter()
    for _ in range(count):
        function()
    return (time.perf_counter() - start) / count * 1e6


def parts(dataset: Any, batch_size: int) -> dict[str, float]:
    """The clock's own work, timed alone, against the pipeline's cost per image."""

    def three_blocks() -> None:
        with timed("read"):
            pass
        with timed("decode"):
            pass
        with timed("transform"):
            pass

    batch = [(torch.zeros(3, 8, 8, dtype=torch.uint8), 0)] * batch_size
    collate = TimedCollate(default_collate)
    stats = StageStats()

    def per_batch() -> None:
        pickle.loads(pickle.dumps(StampedIndices(list(range(batch_size)))))
        timed_batch = collate(batch)
        stats.add_batch(timed_batch.timing)
        stats.add_delivery(0.001, 0.001, batch_size, 1, 1)

    def per_batch_plain() -> None:
        pickle.loads(pickle.dumps(list(range(batch_size))))
        default_collate(batch)

    blobs = [dataset.source.read(i) for i in range(200)]
    start = time.perf_counter()
    for blob in blobs:
        dataset.transform(blob)
    image_us = (time.perf_counter() - start) / len(blobs) * 1e6
    dataset_us = per_call_us(three_blocks)
    batch_us = max(0.0, per_call_us(per_batch, 2000) - per_call_us(per_batch_plain, 2000))
    clock_us = dataset_us + batch_us / batch_size
    return {
        "pipeline_us_per_image": image_us,
        "dataset_blocks_us_per_image": dataset_us,
        "loader_us_per_batch": batch_us,
        "clock_us_per_image": clock_us,
        "overhead_percent": 100 * clock_us / image_us,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data", default=str(ROOT / "data"))
    parser.add_argument("--out", default=str(RESULTS / "stage_clock.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = make_sample_folder(Path(args.data) / f"sample-{args.images}", args.images)
    packed = f"{folder}.lmdb"
    pack(str(folder), packed, progress=False)
    dataset = LMDBDataset(packed, transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()]))
    epoch_rate(dataset, args.workers, args.batch_size, True)  # warm-up: page cache, workers' imports
    rates: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(args.repeats):  # A B A B
        rates["on"].append(epoch_rate(dataset, args.workers, args.batch_size, True))
        rates["off"].append(epoch_rate(dataset, args.workers, args.batch_size, False))
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    result = {
        "benchmark": "stage_clock",
        "setup": {
            "images": args.images,
            "workers": args.workers,
            "batch_size": args.batch_size,
            "repeats": args.repeats,
        },
        "end_to_end": {
            "images_per_s_clock_on": on,
            "images_per_s_clock_off": off,
            "ratio_on_over_off": on / off,
            "runs": rates,
            "spread_percent": 100 * (max(rates["off"]) - min(rates["off"])) / off,
        },
        "parts": parts(dataset, args.batch_size),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
