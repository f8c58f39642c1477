"""What ``seed=``'s per-sample draws cost: the train pipeline with and without ``seed=``.

With ``seed=`` each sample's random draws are a function of (seed, epoch, sample index)
(``fastloader.sample_seeds``): per sample, fastloader's transforms reseed a generator of the worker's thread,
and a transform of the user's finds the three global generators (torch, numpy, ``random``) seeded for it; per
batch, ``random_flip`` draws one number per sample from the samples' keys. Two measurements, in one run:

* end to end: DataLoaderX over ``fastloader.datasets.ImageFolder`` of ImageNet-like JPEGs (``fastloader.sample``),
  shuffled, without and with ``seed=``, A B A B, medians and their ratio, for two pipelines: fastloader's fused
  RandomResizedCrop(224) + RandomHorizontalFlip, and torchvision's (a user's transform on PIL images, which
  draws from the global generators);
* the parts alone, timed in a loop: ``seed_sample`` (the global generators), ``generator`` (fastloader's
  transforms) per sample, ``flip_draws`` per batch, as a share of the fused pipeline's single-threaded time per
  image (read + decode + crop + resize).

    python benchmarks/bench_sample_seeds.py [--images 1000] [--workers N] [--batch-size 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torchvision.transforms as tv

from fastloader import DataLoaderX, sample_seeds
from fastloader import transforms as T
from fastloader.datasets import ImageFolder
from fastloader.sample import make_sample_folder

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def epoch_rate(dataset: Any, workers: int, batch_size: int, seed: int | None) -> float:
    loader = DataLoaderX(dataset, batch_size=batch_size, shuffle=True, num_workers=workers, seed=seed)
    start, seen = time.perf_counter(), 0
    for images, _ in loader:
        seen += images.shape[0]
    return seen / (time.perf_counter() - start)


def per_call_us(function: Any, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        function()
    return (time.perf_counter() - start) / count * 1e6


def parts(dataset: Any, batch_size: int) -> dict[str, float]:
    """The per-sample draws' own work, timed alone, against the fused pipeline's cost per image."""
    count = min(len(dataset), 200)
    start = time.perf_counter()
    for index in range(count):
        dataset[index]
    image_us = (time.perf_counter() - start) / count * 1e6
    indices = list(range(batch_size))
    counter = iter(range(10**9))
    sample_seeds.begin(7, 1, indices)
    try:
        globals_us = per_call_us(lambda: sample_seeds.seed_sample(7, 1, next(counter)), 20000)
        generator_us = per_call_us(lambda: sample_seeds.generator(next(counter)), 20000)
        flips_us = per_call_us(sample_seeds.flip_draws, 2000)
    finally:
        sample_seeds.end()
    return {
        "pipeline_us_per_image": image_us,
        "seed_sample_us": globals_us,
        "generator_us": generator_us,
        "flip_draws_us_per_batch": flips_us,
        "fused_overhead_percent": 100 * (generator_us + flips_us / batch_size) / image_us,
        "user_transform_overhead_percent": 100 * (globals_us + flips_us / batch_size) / image_us,
    }


def compare(dataset: Any, workers: int, batch_size: int, repeats: int) -> dict[str, Any]:
    epoch_rate(dataset, workers, batch_size, None)  # warm-up: page cache, workers' imports
    rates: dict[str, list[float]] = {"without_seed": [], "with_seed": []}
    for _ in range(repeats):  # A B A B
        rates["without_seed"].append(epoch_rate(dataset, workers, batch_size, None))
        rates["with_seed"].append(epoch_rate(dataset, workers, batch_size, 7))
    off, on = statistics.median(rates["without_seed"]), statistics.median(rates["with_seed"])
    return {
        "images_per_s_without_seed": off,
        "images_per_s_with_seed": on,
        "ratio_with_over_without": on / off,
        "runs": rates,
        "spread_percent": 100 * (max(rates["without_seed"]) - min(rates["without_seed"])) / off,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", default=str(ROOT / "data"))
    parser.add_argument("--out", default=str(RESULTS / "sample_seeds.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = make_sample_folder(Path(args.data) / f"sample-{args.images}", args.images)
    fused = ImageFolder(folder, transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()]))
    user = ImageFolder(
        folder, transform=tv.Compose([tv.RandomResizedCrop(224), tv.RandomHorizontalFlip(), tv.PILToTensor()])
    )
    result = {
        "benchmark": "sample_seeds",
        "setup": {
            "dataset": "fastloader.datasets.ImageFolder, fastloader.sample JPEGs",
            "pipelines": {
                "fused": "fastloader RandomResizedCrop(224) + RandomHorizontalFlip",
                "user": "torchvision RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor",
            },
            "images": args.images,
            "workers": args.workers,
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "cores": len(os.sched_getaffinity(0)),
        },
        "end_to_end": {
            "fused": compare(fused, args.workers, args.batch_size, args.repeats),
            "user": compare(user, args.workers, args.batch_size, args.repeats),
        },
        "parts": parts(fused, args.batch_size),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
