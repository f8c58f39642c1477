"""One loader's measurement for ``bench_peers.py``, in a process of its own.

Runs under the project's Python (fastloader, torchvision) or under another virtual environment's
(FFCV's, which also has torchvision with stock Pillow): it imports only torch and the standard
library at the top, and each loader's library where that loader is built. Prints one JSON line.

    python benchmarks/peers_runner.py measure --loader ffcv --source X.beton --pipeline train --images 5000
    python benchmarks/peers_runner.py write-beton --folder data/bench-5000 --out X.beton [--max-resolution 256]

A measurement: the loader is built (the clock starts here), its first epoch is the warm-up (worker
start, FFCV's JIT compilation, lazily opened files; its time to the first batch and its rate are
reported) and one more epoch, both with the memory sampled (peak USS / PSS); then ``--epochs`` timed
epochs on the same loader (persistent workers for torch's loader and DataLoaderX; FFCV's threads live as
long as its loader), with no sampler running, give the steady-state rate and CPU. Every batch is checked:
uint8, ``N x 3 x 224 x 224``, and every epoch delivers ``--images`` images.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterable
from typing import Any

import torch
from procmem import Others, PeakMemory, cpu_used, tree_cpu_seconds  # a sibling module (benchmarks/)

SIZE = 224


def torchvision_loader(args: argparse.Namespace, train: bool) -> Iterable[Any]:
    import torchvision
    from torch.utils.data import DataLoader
    from torchvision import transforms as tv

    geometry = (
        [tv.RandomResizedCrop(SIZE), tv.RandomHorizontalFlip()] if train else [tv.Resize(256), tv.CenterCrop(SIZE)]
    )
    dataset = torchvision.datasets.ImageFolder(args.source, transform=tv.Compose([*geometry, tv.PILToTensor()]))
    return DataLoader(dataset, **torch_kwargs(args, train))


def fastloader_loader(args: argparse.Namespace, train: bool) -> Iterable[Any]:
    from fastloader import DataLoaderX
    from fastloader import transforms as T
    from fastloader.datasets import ImageFolder, LMDBDataset

    geometry = [T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip()] if train else [T.Resize(256), T.CenterCrop(SIZE)]
    kind = LMDBDataset if args.loader == "fastloader-lmdb" else ImageFolder
    return DataLoaderX(kind(args.source, transform=T.Compose(geometry)), **torch_kwargs(args, train))


def torch_kwargs(args: argparse.Namespace, train: bool) -> dict[str, Any]:
    workers = args.workers
    return {"batch_size": args.batch_size, "shuffle": train, "num_workers": workers, "persistent_workers": workers > 0}


def ffcv_loader(args: argparse.Namespace, train: bool) -> Iterable[Any]:
    """FFCV's ImageNet pipelines: its decoders crop and resize in compiled code on ``num_workers`` threads."""
    from ffcv.fields.decoders import CenterCropRGBImageDecoder, IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    if train:
        image = [RandomResizedCropRGBImageDecoder((SIZE, SIZE)), RandomHorizontalFlip(), ToTensor(), ToTorchImage()]
    else:
        image = [CenterCropRGBImageDecoder((SIZE, SIZE), ratio=224 / 256), ToTensor(), ToTorchImage()]
    return Loader(
        args.source,
        batch_size=args.batch_size,
        num_workers=args.workers,
        order=OrderOption.RANDOM if train else OrderOption.SEQUENTIAL,
        os_cache=True,  # the page cache is warm, as for the other loaders
        drop_last=False,  # FFCV drops the last partial batch by default; torch's loaders do not
        pipelines={"image": image, "label": [IntDecoder(), ToTensor(), Squeeze()]},
    )


LOADERS = {
    "torchvision": torchvision_loader,
    "ffcv": ffcv_loader,
    "fastloader-folder": fastloader_loader,
    "fastloader-lmdb": fastloader_loader,
}


def check(images: Any, batch_size: int) -> None:
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8:
        raise RuntimeError(
            f"expected a uint8 tensor of images, got {type(images).__name__} {getattr(images, 'dtype', '')}"
        )
    if images.ndim != 4 or tuple(images.shape[1:]) != (3, SIZE, SIZE) or not 0 < images.shape[0] <= batch_size:
        raise RuntimeError(
            f"expected batches of N x 3 x {SIZE} x {SIZE} (N <= {batch_size}), got {tuple(images.shape)}"
        )


def run_epoch(loader: Iterable[Any], args: argparse.Namespace, start: float, facts: dict[str, Any]) -> dict[str, float]:
    """One epoch from ``start``: its images, seconds and the time to its first batch; checks every batch,
    and describes the first one in ``facts`` if it is empty."""
    seen, first = 0, 0.0
    for images, labels in loader:
        if not seen:
            first = time.perf_counter() - start
        check(images, args.batch_size)
        if not facts:
            facts.update(describe(images, labels))
        seen += images.shape[0]
    if seen != args.images:
        raise RuntimeError(f"{args.loader} on {args.source}: an epoch gave {seen} images, expected {args.images}")
    return {"images": seen, "s": time.perf_counter() - start, "first_batch_s": first}


def describe(images: torch.Tensor, labels: Any) -> dict[str, Any]:
    return {
        "shape": list(images.shape),
        "dtype": str(images.dtype),
        "contiguous": images.is_contiguous(),  # FFCV's ToTorchImage gives a channels-last view by default
        "mean_pixel": float(images[:16].float().mean()),
        "labels": [int(label) for label in labels[:8]],
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    train = args.pipeline == "train"
    # Memory is sampled over the warm-up epoch and one steady epoch after it, never while the rate is timed:
    # reading smaps_rollup walks every mapping of every process of the tree five times a second, a cost that
    # grows with the loader's mappings (measured: 8-9% of fastloader's rate with its batch ring mapped).
    with PeakMemory() as memory:
        start = time.perf_counter()
        loader = LOADERS[args.loader](args, train)
        facts: dict[str, Any] = {}
        warm = run_epoch(loader, args, start, facts)
        run_epoch(loader, args, time.perf_counter(), facts)
    with Others() as others:
        start, cpu = time.perf_counter(), tree_cpu_seconds()
        timed = [run_epoch(loader, args, time.perf_counter(), facts) for _ in range(args.epochs)]
        elapsed, cpu_s = time.perf_counter() - start, cpu_used(cpu)
    if cpu_s <= 0:  # /proc counts CPU in clock ticks (10 ms): a run that short has no CPU figure
        raise SystemExit(f"the timed epochs used {cpu_s:.3f} CPU seconds (under one clock tick): use more --images")
    return {
        "loader": args.loader,
        "pipeline": args.pipeline,
        "images_per_s": sum(epoch["images"] for epoch in timed) / elapsed,
        # CPU seconds of the process and its workers: the cost, which the shared machine's load moves far
        # less than the rate (the memory sampler's own reads are in it, alike for every loader)
        "cpu_s": cpu_s,
        "images_per_cpu_s": sum(epoch["images"] for epoch in timed) / cpu_s,
        "epoch_images_per_s": [epoch["images"] / epoch["s"] for epoch in timed],
        "first_batch_s": warm["first_batch_s"],
        "first_epoch_images_per_s": warm["images"] / warm["s"],
        "batch": facts,
        "memory": memory.summary(),
        "loadavg": list(os.getloadavg()),
        "others_cores": others.cores,  # what the rest of the shared machine used meanwhile
        "versions": {"torch": torch.__version__, **versions(args.loader)},
    }


def versions(loader: str) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("torchvision", "pillow", "pillow-simd", "ffcv", "numba", "opencv-python"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            continue
    return found


def write_beton(args: argparse.Namespace) -> dict[str, Any]:
    """The images of ``--folder`` as FFCV's DatasetWriter writes them: (PIL image, label) from torchvision's
    ImageFolder, every image re-encoded as a JPEG of ``--quality`` with its longer side at most
    ``--max-resolution`` (FFCV's ImageNet recipe: 256, 90), written to a temporary name, then renamed."""
    import torchvision
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    dataset = torchvision.datasets.ImageFolder(args.folder)
    field = RGBImageField(write_mode="jpg", max_resolution=args.max_resolution, jpeg_quality=args.quality)
    partial = f"{args.out}.partial"
    start = time.perf_counter()
    DatasetWriter(partial, {"image": field, "label": IntField()}, num_workers=args.workers).from_indexed_dataset(
        dataset
    )
    os.replace(partial, args.out)
    return {
        "out": args.out,
        "images": len(dataset),
        "s": time.perf_counter() - start,
        "bytes": os.path.getsize(args.out),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("measure")
    run.add_argument("--loader", choices=sorted(LOADERS), required=True)
    run.add_argument("--source", required=True, help="an image folder, a fastloader LMDB or an FFCV .beton")
    run.add_argument("--pipeline", choices=["train", "eval"], required=True)
    run.add_argument("--images", type=int, required=True, help="the images an epoch must deliver")
    run.add_argument("--batch-size", type=int, default=256)
    run.add_argument("--workers", type=int, default=2)
    run.add_argument("--epochs", type=int, default=2, help="timed epochs after the warm-up epoch")
    beton = commands.add_parser("write-beton")
    beton.add_argument("--folder", required=True)
    beton.add_argument("--out", required=True)
    beton.add_argument("--max-resolution", type=int, default=None)
    beton.add_argument("--quality", type=int, default=90)
    beton.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    torch.set_num_threads(1)  # as bench_pipeline: the main process's own torch work on one thread
    result = measure(args) if args.command == "measure" else write_beton(args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
