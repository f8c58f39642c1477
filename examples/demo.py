"""The main job on the built-in sample: make it, pack it, load it with the stock loader and with fastloader.

    make demo            # or: python examples/demo.py [--images 2000] [--workers 2]

1. makes the sample: ImageNet-like JPEGs cut from real photographs (``fastloader.sample``);
2. packs it into an LMDB (``fastloader pack``; resumable, skips bad files);
3. trains with a simulated step on batches from torchvision's ImageFolder + transforms + torch's
   DataLoader, and from fastloader's LMDBDataset + ``fastloader.transforms`` + DataLoaderX (the same
   RandomResizedCrop + flip, uint8 batches, normalized after the copy: on the GPU when there is one),
   with the same workers;
4. prints images/s for each, and the speed-up;
5. runs ``fastloader doctor`` on the packed sample: where the time goes, the verdict, and what to do,
   with the HTML report written beside the data (``--report``).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torchvision
from torch.utils.data import DataLoader
from torchvision import transforms

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import LMDBDataset
from fastloader.doctor.checkup import checkup, format_text
from fastloader.doctor.report_html import write_report
from fastloader.pack import pack
from fastloader.sample import make_sample_folder

ROOT = Path(__file__).resolve().parents[1]
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def images_per_second(loader: DataLoader, step_s: float, epochs: int = 2) -> float:  # type: ignore[type-arg]
    """Best epoch of ``epochs`` (the first one also pays worker start-up)."""
    best = 0.0
    for _ in range(epochs):
        start, seen = time.perf_counter(), 0
        for images, _ in loader:
            if step_s:
                time.sleep(step_s)  # the GPU step: the CPU waits
            seen += images.shape[0]
        best = max(best, seen / (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None, help="sample folder (default: data/sample-<images>)")
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--step-ms", type=float, default=0.0, help="simulated training step per batch")
    parser.add_argument("--report", default=None, help="the doctor's HTML report (default: data/doctor-report.html)")
    args = parser.parse_args()

    args.data = args.data or str(ROOT / "data" / f"sample-{args.images}")
    start = time.perf_counter()
    make_sample_folder(args.data, args.images)
    print(f"sample: {args.images} ImageNet-like JPEGs in {args.data} ({time.perf_counter() - start:.1f}s)")

    train_tf = transforms.Compose(
        [
            transforms.RandomResizedCrop(224),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(mean=MEAN, std=STD),
        ]
    )
    packed = f"{args.data}.lmdb"
    start = time.perf_counter()
    summary = pack(args.data, packed, progress=False)
    print(f"pack: {summary.packed} images into {packed} ({time.perf_counter() - start:.1f}s)")

    # Pinned memory makes the copy to the GPU asynchronous; without a GPU there is nothing to pin for.
    pin = torch.cuda.is_available()
    kwargs = {"batch_size": args.batch_size, "shuffle": True, "num_workers": args.workers, "pin_memory": pin}
    step_s = args.step_ms / 1000
    loaders = {
        "torchvision ImageFolder + torch DataLoader": DataLoader(
            torchvision.datasets.ImageFolder(args.data, transform=train_tf), **kwargs
        ),
        "fastloader LMDBDataset + DataLoaderX": DataLoaderX(
            LMDBDataset(packed, transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])),
            normalize=(MEAN, STD),
            **kwargs,
        ),
    }
    where = "the GPU" if pin else "the CPU (no CUDA GPU here: nothing to pin, fastloader normalizes in its workers)"
    print(f"\nload: RandomResizedCrop(224) + flip, batch {args.batch_size}, {args.workers} workers, to {where}")
    results = {}
    for name, loader in loaders.items():
        results[name] = images_per_second(loader, step_s)
        print(f"{name:<44} {results[name]:8.1f} images/s")
    stock, ours = results.values()
    speedup = ours / stock
    print(f"speed-up: x{speedup:.2f} (num_workers={args.workers}, {torch.get_num_threads()} torch threads)")

    print("\n$ fastloader doctor " + packed + " --workers auto")
    result = checkup(packed, batch_size=args.batch_size, num_workers="auto", step_ms=args.step_ms, batches=40)
    print(format_text(result))
    report = args.report or str(ROOT / "data" / "doctor-report.html")
    write_report(result, report)
    print(f"report: {report} (open it in a browser)")


if __name__ == "__main__":
    main()
