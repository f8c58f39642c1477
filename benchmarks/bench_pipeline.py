"""The image pipeline end to end: torchvision's loader against fastloader, train and eval, side by side.

Data: ImageNet-like JPEGs cut from real photographs (``fastloader.sample``), as an image folder,
a fastloader LMDB and an LMDB re-encoded with ``--resize-max-side 256``. Pipelines (DESIGN.md §5):
train = RandomResizedCrop(224) + RandomHorizontalFlip, eval = Resize(256) + CenterCrop(224);
batch 256; the same ``num_workers`` for every loader; no training step (the loader's own rate).

Loaders, measured A B A B in one run, medians reported:
- torchvision ImageFolder + transforms + torch DataLoader, with ToTensor + Normalize (float, as users
  have it) and with PILToTensor (uint8: no gain may come only from moving normalization);
- fastloader ImageFolder / LMDBDataset + ``fastloader.transforms`` + DataLoaderX (uint8 batches; the
  normalization happens on the GPU after the copy, so it is not on the CPU here);
- the ceiling: the single-thread rate of fastloader's decode + crop + resize on the same images,
  times the cores used.

    python benchmarks/bench_pipeline.py [--images 5000] [--workers 2] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision
from procmem import children  # a sibling module: benchmarks/ is on sys.path when run
from torch.utils.data import DataLoader
from torchvision import transforms as tv

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import ImageFolder, LMDBDataset
from fastloader.pack import pack
from fastloader.sample import make_sample_folder

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class PeakRSS:
    """Samples the resident memory of this process plus its children (the workers)."""

    def __init__(self) -> None:
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, rss_mb(me) + sum(rss_mb(child) for child in children(me)))

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_epoch(make_loader: Callable[[], Iterable[Any]]) -> dict[str, float]:
    loader = make_loader()
    with PeakRSS() as memory:
        start = time.perf_counter()
        seen, first = 0, 0.0
        for images, _ in loader:
            if not first:
                first = time.perf_counter() - start
            seen += images.shape[0]
        elapsed = time.perf_counter() - start
    return {"images_per_s": seen / elapsed, "first_batch_s": first, "peak_rss_mb": memory.peak, "images": seen}


def loaders(args: argparse.Namespace, folder: str, lmdb: str, small: str, train: bool) -> dict[str, Callable[[], Any]]:
    if train:
        geometry = [tv.RandomResizedCrop(224), tv.RandomHorizontalFlip()]
        ours = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])
    else:
        geometry = [tv.Resize(256), tv.CenterCrop(224)]
        ours = T.Compose([T.Resize(256), T.CenterCrop(224)])
    as_float = tv.Compose([*geometry, tv.ToTensor(), tv.Normalize(MEAN, STD)])
    as_uint8 = tv.Compose([*geometry, tv.PILToTensor()])
    kwargs = {"batch_size": args.batch_size, "shuffle": train, "num_workers": args.workers, "drop_last": False}

    def stock(transform: Any) -> Callable[[], Any]:
        return lambda: DataLoader(torchvision.datasets.ImageFolder(folder, transform=transform), **kwargs)

    def fast(dataset: Callable[[], Any]) -> Callable[[], Any]:
        return lambda: DataLoaderX(dataset(), **kwargs)

    return {
        "torchvision float (ToTensor+Normalize)": stock(as_float),
        "torchvision uint8 (PILToTensor)": stock(as_uint8),
        "fastloader ImageFolder": fast(lambda: ImageFolder(folder, transform=ours)),
        "fastloader LMDB": fast(lambda: LMDBDataset(lmdb, transform=ours)),
        "fastloader LMDB re-encoded 256": fast(lambda: LMDBDataset(small, transform=ours)),
    }


def ceiling(lmdb: str, train: bool, workers: int) -> dict[str, float]:
    """Single-thread rate of our decode + crop + resize on the same bytes, times the cores used.

    Measured two ways, the faster one being the ceiling: image by image through the transform (the
    bytes of one image to its tensor), and a batch of 256 at a time through ``decode_batch`` into a reused
    buffer (what a worker's ``__getitems__`` does, on one thread), which pays no Python between images."""
    ours = (
        T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])
        if train
        else T.Compose([T.Resize(256), T.CenterCrop(224)])
    )
    dataset = LMDBDataset(lmdb)
    blobs = [dataset.source.read(i) for i in range(len(dataset))]
    out = np.empty((256, 224, 224, 3), np.uint8)

    def image_by_image() -> None:
        for blob in blobs:
            ours(blob)

    def by_batch() -> None:
        for start in range(0, len(blobs), 256):
            part = blobs[start : start + 256]
            ours.decode_batch(part, out[: len(part)], str, threads=1)

    rates: dict[str, float] = {}
    for name, run in (("per_image", image_by_image), ("batch", by_batch)):
        start, cpu = time.perf_counter(), time.thread_time()
        run()
        rates[f"{name}_images_per_s"] = len(blobs) / (time.perf_counter() - start)
        # the same in CPU time: what a busy machine moves less
        rates[f"{name}_images_per_cpu_s"] = len(blobs) / (time.thread_time() - cpu)
    single = max(rates["per_image_images_per_s"], rates["batch_images_per_s"])
    return {
        "single_thread_images_per_s": single,
        "single_thread_images_per_cpu_s": max(rates["per_image_images_per_cpu_s"], rates["batch_images_per_cpu_s"]),
        **rates,
        "cores": workers,
        "images_per_s": single * workers,
    }


def measure(args: argparse.Namespace, folder: str, lmdb: str, small: str, train: bool) -> dict[str, Any]:
    makers = loaders(args, folder, lmdb, small, train)
    for make in makers.values():
        run_epoch(make)  # warm-up: page cache, index files, lazily built state
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in makers}
    for _ in range(args.repeats):  # A B A B
        for name, make in makers.items():
            runs[name].append(run_epoch(make))
    rows = {name: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for name, rs in runs.items()}
    top = ceiling(lmdb, train, args.workers)
    top_small = ceiling(small, train, args.workers)  # the re-encoded images decode faster: their own ceiling
    base = rows["torchvision uint8 (PILToTensor)"]["images_per_s"]
    for name, row in rows.items():
        row["images_per_s_per_core"] = row["images_per_s"] / args.workers
        row["x_uint8_baseline"] = row["images_per_s"] / base
        limit = top_small if "re-encoded" in name else top
        row["fraction_of_ceiling"] = row["images_per_s"] / limit["images_per_s"]
    return {"loaders": rows, "ceiling": top, "ceiling_reencoded": top_small}


def prepare_data(args: argparse.Namespace) -> tuple[str, str, str]:
    data = Path(args.data)
    folder = str(make_sample_folder(data / f"bench-{args.images}", args.images))
    lmdb, small = str(data / f"bench-{args.images}.lmdb"), str(data / f"bench-{args.images}-256.lmdb")
    pack(folder, lmdb, progress=False)
    pack(folder, small, resize_max_side=256, progress=False)
    return folder, lmdb, small


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--data", default=str(ROOT / "data"))
    parser.add_argument("--out", default=str(RESULTS / "pipeline.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)

    folder, lmdb, small = prepare_data(args)
    result: dict[str, Any] = {
        "benchmark": "pipeline",
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "processor": platform.processor(),
            "torch": torch.__version__,
        },
        "data": f"{args.images} ImageNet-like JPEGs from real photographs (fastloader.sample)",
        "setup": {"batch_size": args.batch_size, "num_workers": args.workers, "repeats": args.repeats},
        "train": measure(args, folder, lmdb, small, train=True),
        "eval": measure(args, folder, lmdb, small, train=False),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    for pipeline in ("train", "eval"):
        top = result[pipeline]["ceiling"]["images_per_s"]
        print(f"{pipeline}: ceiling {top:.0f} images/s")
        for name, row in result[pipeline]["loaders"].items():
            print(
                f"  {name:<40} {row['images_per_s']:7.0f} images/s  x{row['x_uint8_baseline']:.2f}  "
                f"{row['fraction_of_ceiling']:.0%} of ceiling  first batch {row['first_batch_s']:.2f}s  "
                f"peak RSS {row['peak_rss_mb']:.0f} MB"
            )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
