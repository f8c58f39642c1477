"""The decoded cache against no cache, in one run: images/s and CPU µs per image of the epoch that fills it
and of the epochs that read it.

Each repeat makes two loaders over the same LMDB and eval transform (``Resize(256)`` + ``CenterCrop(224)``),
``DataLoaderX`` with batch ``--batch-size``, ``--workers`` persistent workers: one without a cache, one with
a fresh cache file (``ImageDataset.set_cache``), and runs each for 1 + ``--epochs`` epochs. The first epoch
of each includes starting its workers; the cached loader's first epoch also decodes and stores every image.
CPU counts every process of the tree (``procmem``: /proc/<pid>/stat, the workers alive throughout).

    python benchmarks/bench_decoded_cache.py --lmdb data/bench-5000-256.lmdb [--epochs 3] [--repeats 2]
    PYTHONPATH=/path/to/older/checkout python benchmarks/bench_decoded_cache.py ...   # another version
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from procmem import cpu_used, tree_cpu_seconds  # a sibling script

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import LMDBDataset

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def epochs(lmdb: str, cache: Path | None, args: argparse.Namespace) -> list[dict[str, float]]:
    """Images/s and CPU µs per image of each epoch of one loader (the first one starts its workers)."""
    dataset = LMDBDataset(lmdb, transform=T.Compose([T.Resize(256), T.CenterCrop(224)]))
    if cache is not None:
        dataset.set_cache(cache)
    loader = DataLoaderX(dataset, batch_size=args.batch_size, num_workers=args.workers, persistent_workers=True)
    measured = []
    for _ in range(1 + args.epochs):
        start, cpu, seen = time.perf_counter(), tree_cpu_seconds(), 0
        for _images, labels in loader:
            seen += len(labels)
        if seen != len(dataset):
            raise RuntimeError(f"an epoch gave {seen} images of {len(dataset)}")
        elapsed, used = time.perf_counter() - start, cpu_used(cpu)
        measured.append({"images_per_s": seen / elapsed, "us_per_image": used / seen * 1e6})
    return measured


def summary(runs: list[list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Medians over the repeats: the first epoch, and the epochs after it."""
    first = [run[0] for run in runs]
    later = [epoch for run in runs for epoch in run[1:]]
    return {
        name: {key: statistics.median(epoch[key] for epoch in group) for key in ("images_per_s", "us_per_image")}
        for name, group in (("first epoch", first), ("later epochs", later))
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lmdb", default=str(ROOT / "data" / "bench-5000-256.lmdb"))
    parser.add_argument("--epochs", type=int, default=3, help="epochs after the first")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--out", default=str(RESULTS / "decoded_cache.json"))
    args = parser.parse_args()
    runs: dict[str, list[list[dict[str, float]]]] = {"no cache": [], "cache": []}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            runs["no cache"].append(epochs(args.lmdb, None, args))
            runs["cache"].append(epochs(args.lmdb, Path(scratch) / f"eval-{repeat}.cache", args))
    result: dict[str, Any] = {
        "benchmark": "decoded_cache",
        "lmdb": args.lmdb,
        "setup": {key: getattr(args, key) for key in ("epochs", "repeats", "workers", "batch_size")},
        "summary": {name: summary(group) for name, group in runs.items()},
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for name, parts in result["summary"].items():
        for part, figures in parts.items():
            rate, cost = figures["images_per_s"], figures["us_per_image"]
            print(f"{name:9s} {part:13s} {rate:8.0f} images/s {cost:6.0f} µs/image")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
