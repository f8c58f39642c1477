"""An image-text pipeline (CLIP-style) from WebDataset tar shards: the webdataset library against fastloader.

Data: image-text shards as LAION / CC12M publish them (``KEY.jpg`` + ``KEY.txt`` + ``KEY.json``),
with images cut from real photographs (``fastloader.sample_shards.make_caption_shards``). Pipeline:
RandomResizedCrop(224) + RandomHorizontalFlip on the image, the caption as a string; batch 256; the
same ``num_workers`` for every loader; no training step (the loader's own rate).

Loaders, measured A B A B in one run, medians reported:
- webdataset + torch DataLoader, as its README trains CLIP: ``WebDataset(shards, shardshuffle=100)
  .shuffle(1000).decode("pil").to_tuple("jpg", "txt").map_tuple(transform, identity)``, with
  ToTensor + Normalize (float, as open_clip does) and with PILToTensor (uint8);
- fastloader: ``TarShardDataset(shards, fields=("jpg", "txt"))`` + ``ShardWindowSampler`` +
  DataLoaderX (uint8 batches, normalized on the GPU after the copy, so not on the CPU here);
- fastloader on the same shards without the caption (``(image, label)``): what reading the text costs.

    python benchmarks/bench_image_text.py [--images 5000] [--workers 2] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader
from torchvision import transforms as tv

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import TarShardDataset
from fastloader.sample_shards import make_caption_shards
from fastloader.samplers import ShardWindowSampler

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MEAN, STD = [0.481, 0.458, 0.408], [0.269, 0.261, 0.276]


def run_epoch(make_loader: Callable[[], Iterable[Any]]) -> dict[str, float]:
    loader = make_loader()
    start = time.perf_counter()
    seen, first, captions = 0, 0.0, 0
    for images, texts in loader:
        if not first:
            first = time.perf_counter() - start
        seen += images.shape[0]
        captions += len(texts) if isinstance(texts, (list, tuple)) else 0
    elapsed = time.perf_counter() - start
    return {"images_per_s": seen / elapsed, "first_batch_s": first, "images": seen, "captions": captions}


def loaders(args: argparse.Namespace, shards: list[str]) -> dict[str, Callable[[], Any]]:
    import webdataset as wds

    geometry = [tv.RandomResizedCrop(224), tv.RandomHorizontalFlip()]
    as_float = tv.Compose([*geometry, tv.ToTensor(), tv.Normalize(MEAN, STD)])
    as_uint8 = tv.Compose([*geometry, tv.PILToTensor()])
    ours = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])

    def webdataset(transform: Any) -> Callable[[], Any]:
        def make() -> Any:
            pipeline = (
                wds.WebDataset(shards, shardshuffle=100, empty_check=False)
                .shuffle(1000)
                .decode("pil")
                .to_tuple("jpg", "txt")
                .map_tuple(transform, lambda text: text)
            )
            return DataLoader(pipeline, batch_size=args.batch_size, num_workers=args.workers)

        return make

    def fast(fields: tuple[str, ...] | None) -> Callable[[], Any]:
        def make() -> Any:
            dataset = TarShardDataset(shards, transform=ours, fields=fields)
            sampler = ShardWindowSampler(dataset, window=2)
            return DataLoaderX(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers)

        return make

    return {
        "webdataset float (ToTensor+Normalize)": webdataset(as_float),
        "webdataset uint8 (PILToTensor)": webdataset(as_uint8),
        "fastloader image+text": fast(("jpg", "txt")),
        "fastloader image+label (no text)": fast(None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--shard-size", type=int, default=625)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--data", default=str(ROOT / "data"))
    parser.add_argument("--out", default=str(RESULTS / "image_text.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)

    folder = Path(args.data) / f"captions-{args.images}"
    shards = [str(path) for path in make_caption_shards(folder, args.images, args.shard_size)]
    makers = loaders(args, shards)
    for make in makers.values():
        run_epoch(make)  # warm-up: page cache, shard indexes
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in makers}
    for _ in range(args.repeats):  # A B A B
        for name, make in makers.items():
            runs[name].append(run_epoch(make))
    rows = {name: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for name, rs in runs.items()}
    base = rows["webdataset uint8 (PILToTensor)"]["images_per_s"]
    for row in rows.values():
        row["x_webdataset_uint8"] = row["images_per_s"] / base
    machine = {"cpus": len(os.sched_getaffinity(0)), "processor": platform.processor(), "torch": torch.__version__}
    result = {
        "benchmark": "image_text",
        "machine": machine,
        "data": f"{args.images} image-text pairs in {len(shards)} tar shards (fastloader.sample_shards)",
        "setup": {"batch_size": args.batch_size, "num_workers": args.workers, "repeats": args.repeats},
        "loaders": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for name, row in rows.items():
        print(f"{name:40s} {row['images_per_s']:8.0f} images/s  x{row['x_webdataset_uint8']:.2f}")


if __name__ == "__main__":
    main()
