"""Pack throughput: images/s of ``fastloader pack`` into an LMDB, as is and re-encoded smaller.

The data is the built-in ImageNet-like sample (``fastloader.sample.make_sample_folder``: real
photographs cut to ImageNet's sizes, about 420x370 px and 70 KB, JPEG quality 75-95, a few
grayscale / CMYK / PNG oddities). Each variant packs the whole folder into a fresh LMDB with the
same ``--workers``; variants alternate A B A B and medians are reported. For each output the
single-core PIL decode time per image is measured too: what re-encoding smaller buys at training
time (decode cost falls with pixel count). The folder is in the page cache (it was just read),
so this measures CPU cost, not the disk.

    python benchmarks/bench_pack.py --images 1000 --workers 2   # JSON in benchmarks/results/pack.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from typing import Any

from PIL import Image

from fastloader.datasets.folder import FolderSource
from fastloader.datasets.lmdb import LMDBSource
from fastloader.pack import pack
from fastloader.sample import make_sample_folder
from fastloader.storage import cache_dir

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
VARIANTS: dict[str, dict[str, Any]] = {
    "as is (decode check only)": {},
    "--resize-max-side 256 --quality 90": {"resize_max_side": 256, "quality": 90},
}


def decode_ms(path: str, count: int) -> float:
    """Mean ms to decode one packed image to RGB on one core, over the first ``count`` records."""
    source = LMDBSource(path)
    blobs = [source.read(i) for i in range(min(count, len(source)))]
    start = time.perf_counter()
    for blob in blobs:
        Image.open(io.BytesIO(blob)).convert("RGB")
    return (time.perf_counter() - start) * 1000 / len(blobs)


def output_path(out_dir: str, name: str) -> str:
    return os.path.join(out_dir, name.split()[0].strip("-") + ".lmdb")


def pack_once(folder: str, out_dir: str, name: str, options: dict[str, Any], workers: int) -> dict[str, float]:
    """Pack ``folder`` into ``out_dir/<variant>.lmdb`` (fresh) and time it, start-up included."""
    dst = output_path(out_dir, name)
    shutil.rmtree(dst, ignore_errors=True)
    start = time.perf_counter()
    summary = pack(folder, dst, workers=workers, progress=False, **options)
    wall = time.perf_counter() - start
    return {
        "images_per_s": summary.total / wall,
        "wall_s": wall,
        "bytes_in": summary.bytes_in,
        "bytes_out": summary.bytes_out,
        "lmdb_file_bytes": os.path.getsize(os.path.join(dst, "data.mdb")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="A B rounds; medians are reported")
    parser.add_argument("--decode-sample", type=int, default=300, help="packed images decoded per variant")
    parser.add_argument("--out", default=os.path.join(RESULTS, "pack.json"))
    args = parser.parse_args()

    folder = str(cache_dir() / f"bench-sample-{args.images}")
    make_sample_folder(folder, args.images, workers=args.workers)
    FolderSource(folder)  # build the folder index once, outside the timings
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-pack-") as out_dir:
        for _ in range(args.repeats):
            for name, options in VARIANTS.items():
                runs[name].append(pack_once(folder, out_dir, name, options, args.workers))
                print(f"{name}: {runs[name][-1]['images_per_s']:.0f} images/s")
        variants = {}
        for name, results in runs.items():
            median = {key: statistics.median(r[key] for r in results) for key in results[0]}
            median["decode_ms_per_image_1_core"] = decode_ms(output_path(out_dir, name), args.decode_sample)
            variants[name] = median
    plain, smaller = (variants[name] for name in VARIANTS)
    result = {
        "benchmark": "pack",
        "machine": {"cpus": len(os.sched_getaffinity(0)), "processor": platform.processor() or platform.machine()},
        "setup": {
            "images": args.images,
            "data": "fastloader.sample.make_sample_folder: ImageNet-like JPEGs from real photographs",
            "source_mb": plain["bytes_in"] / 1e6,
            "workers": args.workers,
            "repeats": args.repeats,
            "note": "source folder in the page cache; output LMDB on the same disk; medians of A B rounds",
        },
        "variants": variants,
        "throughput_ratio_reencode_over_plain": smaller["images_per_s"] / plain["images_per_s"],
        "output_size_ratio_reencode_over_plain": smaller["bytes_out"] / plain["bytes_out"],
        "decode_speedup_at_training_time": plain["decode_ms_per_image_1_core"] / smaller["decode_ms_per_image_1_core"],
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as file:
        json.dump(result, file, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
