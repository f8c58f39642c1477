"""Single-thread JPEG decode cost: PIL, simplejpeg and fastloader's partial decoder (fastloader.image.jpeg_ext).

Two questions, on ImageNet-like photos (fastloader.sample), bytes in memory, one thread:

1. Whole-image decode, ms/image: PIL, simplejpeg, ``jpeg_ext.decode``.
2. The train pipeline's first step, RandomResizedCrop(224) (torchvision's ``get_params`` boxes, scale
   (0.08, 1), ratio (3/4, 4/3)) to a 224x224 bilinear resize (Pillow-SIMD ``resize(box=)``):
   - PIL full decode, then resize of the box;
   - ``decode_region`` of the box padded by the filter's support, then the same resize of the mapped box
     (the padding makes the output equal to the baseline's: every pixel the filter reads is exact);
   - the same with ``fast=True`` (ifast IDCT, plain chroma upsampling);
   - the same with DCT scaling where the crop is at least 2x the output (``scale_denom`` 2/4/8).

Each round times every method over all images, in alternating order (A B C, C B A, ...); the figure is
the median round. Output differences against the baseline are reported alongside.

    python benchmarks/bench_jpeg.py [--images 600] [--repeats 5]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import simplejpeg
import torch
from PIL import Image
from torchvision.transforms import RandomResizedCrop

from fastloader.image import jpeg_ext
from fastloader.sample import make_sample_folder

RESULTS = Path(__file__).resolve().parent / "results"
OUT = 224
Box = tuple[int, int, int, int]


def load_jpegs(root: Path, count: int) -> list[bytes]:
    """The sample's JPEGs that every method decodes (RGB or grayscale; not CMYK, not PNG named .jpg)."""
    keep = []
    for path in sorted(root.rglob("*.jpg"))[:count]:
        data = path.read_bytes()
        try:
            if jpeg_ext.jpeg_info(data)[2] in (1, 3):
                keep.append(data)
        except ValueError:
            pass
    return keep


def rrc_boxes(images: list[bytes], seed: int) -> list[Box]:
    torch.manual_seed(seed)
    boxes = []
    for data in images:
        width, height, _ = jpeg_ext.jpeg_info(data)
        top, left, h, w = RandomResizedCrop.get_params(Image.new("L", (width, height)), (0.08, 1.0), (3 / 4, 4 / 3))
        boxes.append((left, top, left + w, top + h))
    return boxes


def padded(box: Box, width: int, height: int) -> Box:
    """The box grown by the bilinear filter's support (1 px per unit of downscale) and 1 px of rounding."""
    x0, y0, x1, y1 = box
    px, py = math.ceil(max((x1 - x0) / OUT, 1.0)) + 1, math.ceil(max((y1 - y0) / OUT, 1.0)) + 1
    return max(0, x0 - px), max(0, y0 - py), min(width, x1 + px), min(height, y1 + py)


def pil_full(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    if image.mode != "RGB":
        return image.convert("RGB")
    image.load()
    return image


def pil_crop(data: bytes, box: Box) -> np.ndarray:
    return np.asarray(pil_full(data).resize((OUT, OUT), Image.Resampling.BILINEAR, box=box))


def region_crop(data: bytes, box: Box, fast: bool = False, auto_scale: bool = False) -> np.ndarray:
    width, height, _ = jpeg_ext.jpeg_info(data)
    scale = 1
    if auto_scale:  # the largest DCT scale that still leaves at least OUT pixels each way
        scale = next((s for s in (8, 4, 2) if min(box[2] - box[0], box[3] - box[1]) >= s * OUT), 1)
    array, (ox, oy) = jpeg_ext.decode_region(data, padded(box, width, height), scale_denom=scale, fast=fast)
    mapped = (box[0] / scale - ox, box[1] / scale - oy, box[2] / scale - ox, box[3] / scale - oy)
    return np.asarray(Image.fromarray(array).resize((OUT, OUT), Image.Resampling.BILINEAR, box=mapped))


def time_rounds(methods: dict[str, Callable[[int], Any]], count: int, repeats: int) -> dict[str, float]:
    """Median over rounds of ms/image; rounds alternate the order of the methods."""
    names = list(methods)
    times: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            method = methods[name]
            start = time.perf_counter()
            for i in range(count):
                method(i)
            times[name].append((time.perf_counter() - start) / count * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


def differences(images: list[bytes], boxes: list[Box]) -> dict[str, dict[str, float]]:
    """Output of each crop pipeline against the baseline: identical images, max and mean abs difference."""
    out: dict[str, dict[str, float]] = {}
    variants = {"exact": {}, "fast": {"fast": True}, "exact_dct_scaled": {"auto_scale": True}}
    for name, options in variants.items():
        identical, worst, means = 0, 0, []
        for data, box in zip(images, boxes):
            diff = np.abs(region_crop(data, box, **options).astype(np.int16) - pil_crop(data, box))
            identical += int(diff.max() == 0)
            worst = max(worst, int(diff.max()))
            means.append(float(diff.mean()))
        out[name] = {
            "identical_fraction": identical / len(images),
            "max_abs": worst,
            "mean_abs": statistics.mean(means),
        }
    whole = [np.abs(jpeg_ext.decode(d, fast=True).astype(np.int16) - jpeg_ext.decode(d)) for d in images]
    out["whole_decode_fast_vs_exact"] = {
        "max_abs": int(max(d.max() for d in whole)),
        "mean_abs": statistics.mean(float(d.mean()) for d in whole),
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--folder", default="/tmp/sample")
    parser.add_argument("--out", default=str(RESULTS / "jpeg.json"))
    args = parser.parse_args()
    if not jpeg_ext.AVAILABLE:
        raise SystemExit("fastloader.image._jpeg is not built: reinstall with libjpeg-turbo headers present")
    torch.set_num_threads(1)

    images = load_jpegs(make_sample_folder(args.folder, args.images), args.images)
    boxes = rrc_boxes(images, seed=0)
    n = len(images)
    area = statistics.mean(
        (b[2] - b[0]) * (b[3] - b[1]) / math.prod(jpeg_ext.jpeg_info(d)[:2]) for d, b in zip(images, boxes)
    )
    scaled = sum(min(b[2] - b[0], b[3] - b[1]) >= 2 * OUT for b in boxes) / n

    decode = time_rounds(
        {
            "pil": lambda i: pil_full(images[i]),
            "simplejpeg": lambda i: simplejpeg.decode_jpeg(images[i], colorspace="RGB"),
            "jpeg_ext.decode": lambda i: jpeg_ext.decode(images[i]),
            "jpeg_ext.decode_fast": lambda i: jpeg_ext.decode(images[i], fast=True),
        },
        n,
        args.repeats,
    )
    crop = time_rounds(
        {
            "pil_full_decode+resize": lambda i: pil_crop(images[i], boxes[i]),
            "decode_region+resize": lambda i: region_crop(images[i], boxes[i]),
            "decode_region_fast+resize": lambda i: region_crop(images[i], boxes[i], fast=True),
            "decode_region_dct_scaled+resize": lambda i: region_crop(images[i], boxes[i], auto_scale=True),
            "decode_region_only": lambda i: jpeg_ext.decode_region(images[i], boxes[i]),
        },
        n,
        args.repeats,
    )
    result = {
        "benchmark": "single-thread JPEG decode and RandomResizedCrop(224) decode+crop+resize",
        "machine": {"cpus": len(os.sched_getaffinity(0)), "processor": platform.processor()},
        "libraries": {
            "libjpeg_turbo": jpeg_ext.LIBJPEG_TURBO_VERSION,
            "pillow": Image.__version__,
            "simplejpeg": simplejpeg.__version__,
        },
        "command": "python benchmarks/bench_jpeg.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items()),
        "data": f"{n} ImageNet-like JPEGs (fastloader.sample, RGB/grayscale), bytes in memory, one thread",
        "mean_image_px": statistics.mean(math.prod(jpeg_ext.jpeg_info(d)[:2]) for d in images),
        "mean_bytes": statistics.mean(len(d) for d in images),
        "rrc_mean_area_fraction": area,
        "rrc_fraction_dct_scalable": scaled,
        "repeats": args.repeats,
        "ms_per_image": {"decode": decode, "crop_224": crop},
        "speedup": {
            "decode_vs_pil": {k: decode["pil"] / v for k, v in decode.items()},
            "crop_vs_pil": {k: crop["pil_full_decode+resize"] / v for k, v in crop.items()},
        },
        "output_vs_pil_crop": differences(images, boxes),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
