"""Where a worker's time goes per image, in one process: read, header, plan, decode, batch buffer, batch.

Each part runs alone over every image of an LMDB (best of ``--repeats`` passes, CPU µs per image):

- ``read``: ``LMDBSource.read`` (one LMDB get, the record header, the bytes copied out);
- ``header``: ``read_header`` (the JPEG header, the pixel limit);
- ``plan``: the transform's crop plan from the header (for the train pipeline: the random draws);
- ``decode reused buffer``: ``decode_plan`` into the slots of one buffer written again and again
  (the decode, the resize and the copy into the slot, memory already mapped);
- ``decode fresh buffer``: the same into a new ``allocate_batch`` buffer every 256 images, as
  ``__getitems__`` does (the difference is the cost of new memory: page faults, freeing);
- ``batch``: ``__getitems__`` + ``collate`` of batches of 256: the whole per-batch work of a worker,
  without the hand-off to the main process (``--error-policy``: under that policy, no sample bad).

Once for the LMDB, the decoder alone (libjpeg-turbo through ``jpeg_ext``, the fast IDCT): the whole
image at full scale, and the whole image at 1/8 scale, which still Huffman-decodes every coefficient but
does 1/64 of the IDCT, upsampling and colour conversion: the entropy-decoding floor that no decoder built
on libjpeg-turbo (FFCV's included) goes below, and which grows with the bytes per image.

Pipelines: ``train`` (RandomResizedCrop(224) + flip), ``eval`` (Resize(256) + CenterCrop(224)) and
``eval-ffcv`` (FFCV's eval recipe: a centre square of 224/256 of the shorter side, resized to 224).

    python benchmarks/bench_image_cost.py --lmdb data/bench-5000-256.lmdb [--error-policy skip]
    PYTHONPATH=/path/to/older/checkout python benchmarks/bench_image_cost.py ...   # the same for another version
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastloader import transforms as T
from fastloader.datasets import LMDBDataset
from fastloader.image import decode as D
from fastloader.image import jpeg_ext
from fastloader.image.batching import allocate_batch, collate
from fastloader.image.geometry import Frame
from fastloader.transforms.fused import FusedTransform

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
BATCH = 256


class CenterSquare(FusedTransform):
    """FFCV's ``CenterCropRGBImageDecoder(size, ratio)``: a centre square of ``ratio`` x the shorter side."""

    def __init__(self, size: int, ratio: float) -> None:
        self.size, self.ratio = size, ratio

    def _fold(self, frame: Frame, generator: torch.Generator | None) -> Frame:
        side = int(self.ratio * min(frame.width, frame.height))
        left, top = (frame.width - side) // 2, (frame.height - side) // 2
        square = frame.cropped((left, top, left + side, top + side))
        return square.resized(self.size, self.size, "bilinear")

    def _size_after(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        return self.size, self.size


PIPELINES: dict[str, Callable[[], FusedTransform]] = {
    "train": lambda: T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()]),
    "eval": lambda: T.Compose([T.Resize(256), T.CenterCrop(224)]),
    "eval-ffcv": lambda: T.Compose([CenterSquare(224, 224 / 256)]),
}


def per_image(function: Callable[[], Any], count: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()  # CPU time: other work on a shared machine disturbs it little
        function()
        best = min(best, time.process_time() - start)
    return best / count * 1e6


def measure(lmdb: str, name: str, repeats: int, error_policy: str | None = None) -> dict[str, float]:
    transform = PIPELINES[name]()
    dataset = LMDBDataset(lmdb, transform=transform)
    if error_policy is not None:
        dataset.set_error_policy(error_policy)  # its quarantine: a temporary file of its own
    source, count = dataset.source, len(dataset)
    blobs = [source.read(i) for i in range(count)]
    headers = [D.read_header(blob) for blob in blobs]
    plans = [transform.plan(header.width, header.height) for header in headers]
    fast = not transform.exact_decode
    reused = np.zeros((BATCH, 224, 224, 3), np.uint8)

    def decode(fresh: bool) -> None:
        pixels = reused
        for i, (blob, plan, header) in enumerate(zip(blobs, plans, headers)):
            if fresh and i % BATCH == 0:
                pixels = allocate_batch(BATCH, 224, 224).numpy()
            D.decode_plan(blob, plan, "bench", pixels[i % BATCH], fast=fast, header=header)

    batches = [list(range(start, min(start + BATCH, count))) for start in range(0, count, BATCH)]
    parts = {
        "read": lambda: [source.read(i) for i in range(count)],
        "header": lambda: [D.read_header(blob) for blob in blobs],
        "plan": lambda: [transform.plan(header.width, header.height) for header in headers],
        "decode reused buffer": lambda: decode(fresh=False),
        "decode fresh buffer": lambda: decode(fresh=True),
        "batch": lambda: [collate(dataset.__getitems__(indices)) for indices in batches],
    }
    return {part: per_image(function, count, repeats) for part, function in parts.items()}


def measure_decoder(lmdb: str, repeats: int) -> dict[str, float]:
    """The whole-image decode at full and at 1/8 scale (the entropy-decoding floor), µs per image."""
    source = LMDBDataset(lmdb).source
    blobs = [source.read(i) for i in range(len(source))]
    result = {"bytes per image": sum(map(len, blobs)) / len(blobs)}
    if jpeg_ext.AVAILABLE:

        def decode_all(scale: int) -> None:
            for blob in blobs:
                jpeg_ext.decode(blob, scale, fast=True)

        result["whole image"] = per_image(lambda: decode_all(1), len(blobs), repeats)
        result["whole image at 1/8 (entropy floor)"] = per_image(lambda: decode_all(8), len(blobs), repeats)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lmdb", default=str(ROOT / "data" / "bench-5000-256.lmdb"))
    parser.add_argument("--pipelines", nargs="+", choices=sorted(PIPELINES), default=["eval", "eval-ffcv", "train"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--error-policy", choices=["raise", "skip", "replace"], help="the batch row under this policy")
    parser.add_argument("--out", default=str(RESULTS / "image_cost.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    result: dict[str, Any] = {"benchmark": "image_cost", "lmdb": args.lmdb, "unit": "us per image"}
    result["error_policy"] = args.error_policy
    result["decoder"] = measure_decoder(args.lmdb, args.repeats)
    print("decoder", "  ".join(f"{part} {value:.1f}" for part, value in result["decoder"].items()))
    for name in args.pipelines:
        result[name] = measure(args.lmdb, name, args.repeats, args.error_policy)
        print(name, "  ".join(f"{part} {value:.1f}" for part, value in result[name].items()))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
