"""Scaling with workers: images/s and memory per process for 1, 2, 4, 8 (16) workers, against torch's loader.

Train pipeline (DESIGN.md §5: RandomResizedCrop(224) + RandomHorizontalFlip, batch 256, uint8 batches):

- ``torch``: torchvision ``ImageFolder`` + transforms v2 (the crop on the PIL image, then
  ``PILToTensor``: uint8) + torch ``DataLoader``;
- ``fastloader``: ``LMDBDataset`` (the same images, packed) + ``fastloader.transforms`` + DataLoaderX.

Both with ``persistent_workers``: one warm-up epoch, then the timed epochs (worker start-up is not in
the rate). Memory: USS (private pages) and PSS (private pages + a share of shared ones) of the main
process and of each worker, from ``/proc/PID/smaps_rollup``, the highest seen while the epoch ran.
Loaders alternate A B A B for each worker count; medians over ``--repeats``.

The ceiling (bench_pipeline's definition): the single-thread rate of fastloader's decode + crop +
resize of the same bytes, times the cores used (``min(workers, cpus)``); each loader's images/s is
reported as a fraction of it.

``--threads`` also measures two prototypes (not library code) that use threads where the work
releases the GIL (the JPEG extension and PIL's resize do):

- ``threads in workers``: each worker's ``__getitems__`` decodes its batch's slots with T threads;
- ``threads, no workers``: batches made in the main process by a pool of T threads (each thread
  builds whole batches with ``__getitems__``), handed over in order.

    python benchmarks/bench_scaling.py [--workers 1 2 4 8] [--lmdb data/bench-5000.lmdb --folder data/bench-5000]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torchvision
from procmem import PeakMemory  # a sibling module: benchmarks/ is on sys.path when run
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import LMDBDataset
from fastloader.image.batching import PrecollatedBatch, allocate_batch, collate

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
BATCH = 256


def train_transform() -> T.Compose:
    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])


def timed_epochs(loader: Iterable[Any], epochs: int) -> dict[str, float]:
    for _ in loader:  # warm-up: workers started, page cache, lazily opened files
        pass
    with PeakMemory() as memory:
        start, seen = time.perf_counter(), 0
        for _ in range(epochs):
            for images, _labels in loader:
                seen += images.shape[0]
        elapsed = time.perf_counter() - start
    return {"images_per_s": seen / elapsed, **memory.summary()}


# -- the prototypes ---------------------------------------------------------------------------------


class ThreadedBatches(LMDBDataset):
    """``__getitems__`` decoding a batch's slots with ``threads`` threads (prototype: no error policy,
    no cache, fused fixed-size transforms only)."""

    def __init__(self, path: str, transform: Any, threads: int) -> None:
        super().__init__(path, transform=transform)
        self.threads = threads
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pid = 0

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pool": None, "_pid": 0}

    def __getitems__(self, indices: Sequence[int]) -> Any:
        pipeline = self._pipeline()
        size = pipeline.buffer_size
        assert size is not None
        if self._pool is None or self._pid != os.getpid():
            self._pool, self._pid = concurrent.futures.ThreadPoolExecutor(self.threads), os.getpid()
        buffer = allocate_batch(len(indices), *size)
        pixels = buffer.numpy()

        def run(slots: range) -> None:
            for slot in slots:
                target = pixels[slot]
                image, _ = pipeline.decoded(int(indices[slot]), target)
                if image is not target:  # decoded elsewhere (PIL): copied into its slot
                    target[...] = image

        step = -(-len(indices) // self.threads)
        chunks = [range(first, min(first + step, len(indices))) for first in range(0, len(indices), step)]
        for future in [self._pool.submit(run, chunk) for chunk in chunks]:
            future.result()
        return PrecollatedBatch(buffer, [pipeline.label(int(i)) for i in indices])


def thread_loader(dataset: LMDBDataset, threads: int, ahead: int) -> Callable[[], Iterator[Any]]:
    """Shuffled batches of ``dataset`` made by a pool of ``threads`` threads in this process, in order."""

    pool = concurrent.futures.ThreadPoolExecutor(threads)

    def epoch() -> Iterator[Any]:
        order = torch.randperm(len(dataset)).tolist()
        batches = [order[start : start + BATCH] for start in range(0, len(order), BATCH)]
        pending: list[concurrent.futures.Future[Any]] = []
        for indices in batches:
            pending.append(pool.submit(lambda chosen=indices: collate(dataset.__getitems__(chosen))))
            if len(pending) > ahead:
                yield pending.pop(0).result()
        for future in pending:
            yield future.result()

    return epoch


class Epochs:
    """Makes ``epoch()`` iterable again and again, like a persistent loader."""

    def __init__(self, epoch: Callable[[], Iterator[Any]]) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        return self.epoch()


# -- the measurements -------------------------------------------------------------------------------


def ceiling_rate(lmdb: str, images: int) -> float:
    """Single-thread images/s of fastloader's decode + crop + resize of the same bytes."""
    source = LMDBDataset(lmdb).source
    blobs = [source.read(i) for i in range(min(images, len(source)))]
    transform = train_transform()
    for blob in blobs[:50]:
        transform(blob)
    start = time.perf_counter()
    for blob in blobs:
        transform(blob)
    return len(blobs) / (time.perf_counter() - start)


def loaders(args: argparse.Namespace, workers: int) -> dict[str, Callable[[], Iterable[Any]]]:
    kwargs: dict[str, Any] = {"batch_size": BATCH, "shuffle": True, "num_workers": workers, "persistent_workers": True}
    # Geometry on the PIL image, then uint8: as torchvision's reference recipe (and bench_pipeline) does.
    stock = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(), v2.PILToTensor()])
    return {
        "torch": lambda: DataLoader(torchvision.datasets.ImageFolder(args.folder, transform=stock), **kwargs),
        "fastloader": lambda: DataLoaderX(LMDBDataset(args.lmdb, transform=train_transform()), **kwargs),
    }


def thread_makers(lmdb: str, threads: int, cpus: int) -> dict[str, Callable[[], Iterable[Any]]]:
    """The plain loader with one worker per core, and the two thread prototypes."""
    transform = train_transform()
    kwargs: dict[str, Any] = {"batch_size": BATCH, "shuffle": True, "num_workers": cpus, "persistent_workers": True}
    return {
        f"{cpus} workers": lambda: DataLoaderX(LMDBDataset(lmdb, transform=transform), **kwargs),
        f"{cpus} workers x {threads} threads": lambda: DataLoaderX(ThreadedBatches(lmdb, transform, threads), **kwargs),
        f"{threads} threads, no workers": lambda: Epochs(
            thread_loader(LMDBDataset(lmdb, transform=transform), threads, ahead=threads + 1)
        ),
    }


def measure_rows(makers: dict[str, Callable[[], Iterable[Any]]], repeats: int, epochs: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in makers}
    for _ in range(repeats):  # A B A B
        for name, make in makers.items():
            loader = make()
            runs[name].append(timed_epochs(loader, epochs))
            del loader
    rows: dict[str, Any] = {}
    for name, results in runs.items():
        rows[name] = {key: statistics.median(r[key] for r in results) for key in results[0]}
        rates = [r["images_per_s"] for r in results]
        rows[name]["spread"] = [min(rates), max(rates)]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--lmdb", default=str(ROOT / "data" / "bench-5000.lmdb"))
    parser.add_argument("--folder", default=str(ROOT / "data" / "bench-5000"), help="the same images as a folder")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1, help="timed epochs per measurement")
    parser.add_argument("--threads", type=int, nargs="*", default=[], help="threads per worker / in the pool")
    parser.add_argument("--skip-scaling", action="store_true", help="only the ceiling and the thread prototypes")
    parser.add_argument("--out", default=str(RESULTS / "scaling.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    cpus = len(os.sched_getaffinity(0))

    single = ceiling_rate(args.lmdb, 2000)
    result: dict[str, Any] = {
        "benchmark": "scaling",
        "machine": {"cpus": cpus, "processor": platform.processor(), "torch": torch.__version__},
        "data": {"lmdb": args.lmdb, "folder": args.folder, "images": len(LMDBDataset(args.lmdb))},
        "setup": {"batch_size": BATCH, "pipeline": "RandomResizedCrop(224) + RandomHorizontalFlip, uint8"},
        "single_thread_images_per_s": single,
        "workers": {},
        "threads": {},
    }

    def fraction(rate: float, cores: int) -> float:
        return rate / (single * min(cores, cpus))

    print(f"ceiling: {single:.0f} images/s per core, {cpus} cpus")
    for workers in [] if args.skip_scaling else args.workers:
        rows = measure_rows(loaders(args, workers), args.repeats, args.epochs)
        for row in rows.values():
            row["fraction_of_ceiling"] = fraction(row["images_per_s"], workers)
        rows["x_torch"] = rows["fastloader"]["images_per_s"] / rows["torch"]["images_per_s"]
        result["workers"][str(workers)] = rows
        for name in ("torch", "fastloader"):
            row = rows[name]
            print(
                f"{workers:2d} workers {name:10s} {row['images_per_s']:6.0f} images/s "
                f"({row['fraction_of_ceiling']:.0%} of ceiling)  main USS {row['main_uss_mb']:.0f} MB"
                f"  per worker USS {row['worker_uss_mb']:.0f} MB PSS {row['worker_pss_mb']:.0f} MB"
                f"  total PSS {row['total_pss_mb']:.0f} MB"
            )
    for threads in args.threads:
        makers = thread_makers(args.lmdb, threads, cpus)
        rows = measure_rows(makers, args.repeats, args.epochs)
        for row in rows.values():
            row["fraction_of_ceiling"] = fraction(row["images_per_s"], cpus)
        result["threads"][str(threads)] = rows
        for name, row in rows.items():
            print(f"{name:28s} {row['images_per_s']:6.0f} images/s ({row['fraction_of_ceiling']:.0%} of ceiling)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
