"""Pack throughput: images/s of ``fastloader pack`` into an LMDB, as is and re-encoded smaller.

The data is the built-in ImageNet-like sample (``fastloader.sample.make_sample_folder``: real
photographs cut to ImageNet's sizes, about 420x370 px and 70 KB, JPEG quality 75-95, a few
grayscale / CMYK / PNG oddities). Each variant packs the whole folder into a fresh LMDB with the
same ``--workers``; variants alternate A B A B and medians are reported. For each output the
single-core PIL decode time per image is measured too: what re-encoding smaller buys at training
time (decode cost falls with pixel count). The folder is in the page cache (it was just read),
so this measures CPU cost, not the disk.

    python benchmarks/bench_pack.py --images 1000 --workers 2   # JSON in benchmarks/results/pack.json

``--engine ray``: the overhead of the Ray engine. The same folder packed into tar shards by the local
engine (``--workers`` reader processes) and by ``--engine ray`` on a local Ray of ``--workers`` CPUs
(started once, warmed up by one pack), A B A B, as is and re-encoded: the wall rate, and the CPU time
of every process involved per image (the driver, the readers, Ray's raylet, GCS and workers), which a
loaded machine does not skew as it does the wall rate; plus the fixed cost of a Ray pack (the wall time
of packing one shard of 8 images). JSON in benchmarks/results/pack_ray.json.

    python benchmarks/bench_pack.py --engine ray --images 4000 --workers 2 --shard-size 500
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


def cpu_seconds() -> float:
    """CPU time of this process and all its children: reaped (the local engine's readers, once their pool
    closed) and alive (the local Ray's raylet, GCS and workers, started by ray.init in this process)."""
    import psutil

    times = os.times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in psutil.Process().children(recursive=True):
        try:
            cpu = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += cpu.user + cpu.system
    return total


def pack_tar(folder: str, dst: str, options: dict[str, Any], engine: str, args: argparse.Namespace) -> dict[str, float]:
    """Pack ``folder`` into fresh tar shards at ``dst`` with ``engine``: wall and CPU seconds, start-up included."""
    shutil.rmtree(dst, ignore_errors=True)
    workers = args.workers if engine == "local" else None
    cpu, start = cpu_seconds(), time.perf_counter()
    options = {"format": "tar", "shard_size": args.shard_size, "progress": False, **options}
    pack(folder, dst, engine=engine, workers=workers, **options)
    return {"wall_s": time.perf_counter() - start, "cpu_s": cpu_seconds() - cpu}


def engines(folder: str, args: argparse.Namespace) -> dict[str, Any]:
    """The local engine against the Ray engine on a local Ray of ``--workers`` CPUs (see the module docstring)."""
    import ray

    # A local Ray for this run only (its files under out_dir, no token file left in ~/.ray).
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    runs: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-pack-ray-", dir="/tmp") as out_dir:
        ray.init(
            num_cpus=args.workers, include_dashboard=False, log_to_driver=False, _temp_dir=f"{out_dir}/ray",
            _node_ip_address="127.0.0.1",
        )  # fmt: skip
        first = pack_tar(folder, os.path.join(out_dir, "warm-up"), {}, "ray", args)  # Ray's workers start
        tiny = make_sample_folder(os.path.join(out_dir, "tiny"), 8, num_classes=1)
        fixed = [pack_tar(str(tiny), os.path.join(out_dir, "tiny.tar"), {}, "ray", args)["wall_s"] for _ in range(3)]
        for _ in range(args.repeats):
            for name, options in VARIANTS.items():
                for engine in ("local", "ray"):
                    run = pack_tar(folder, os.path.join(out_dir, f"{engine}.tar"), options, engine, args)
                    runs.setdefault(f"{engine}: {name}", []).append(run)
                    print(f"{engine}: {name}: {args.images / run['wall_s']:.0f} images/s")
        ray.shutdown()
    results: dict[str, Any] = {"ray_first_pack_wall_s": first["wall_s"], "ray_job_fixed_s": statistics.median(fixed)}
    for name in VARIANTS:
        local, on_ray = (
            {key: statistics.median(run[key] for run in runs[f"{engine}: {name}"]) for key in ("wall_s", "cpu_s")}
            for engine in ("local", "ray")
        )
        results[name] = {
            "local_images_per_s": args.images / local["wall_s"],
            "ray_images_per_s": args.images / on_ray["wall_s"],
            "ray_over_local_images_per_s": local["wall_s"] / on_ray["wall_s"],
            "local_cpu_ms_per_image": 1000 * local["cpu_s"] / args.images,
            "ray_cpu_ms_per_image": 1000 * on_ray["cpu_s"] / args.images,
            "ray_over_local_cpu_per_image": on_ray["cpu_s"] / local["cpu_s"],
            "ray_images_per_s_per_busy_core": args.images / on_ray["cpu_s"],
            "runs": {engine: runs[f"{engine}: {name}"] for engine in ("local", "ray")},
        }
    return results


def main_engines(args: argparse.Namespace, folder: str) -> None:
    result = {
        "benchmark": "pack --engine ray against the local engine",
        "machine": {"cpus": len(os.sched_getaffinity(0)), "processor": platform.processor() or platform.machine()},
        "setup": {
            "images": args.images,
            "data": "fastloader.sample.make_sample_folder: ImageNet-like JPEGs from real photographs",
            "workers": args.workers,
            "shard_size": args.shard_size,
            "repeats": args.repeats,
            "note": "tar output; the same folder in the page cache; a local Ray of --workers CPUs started once and "
            "warmed up (one job: its workers stay); wall and CPU (every process: driver, readers, raylet, GCS, "
            "workers) per pack, start-up included; medians of A B rounds",
        },
        "variants": engines(folder, args),
    }
    out = args.out or os.path.join(RESULTS, "pack_ray.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as file:
        json.dump(result, file, indent=2)
    print(json.dumps(result, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="A B rounds; medians are reported")
    parser.add_argument("--decode-sample", type=int, default=300, help="packed images decoded per variant")
    parser.add_argument("--engine", choices=("local", "ray"), default="local", help="ray: the Ray engine's overhead")
    parser.add_argument("--shard-size", type=int, default=500, help="images per tar shard (--engine ray)")
    parser.add_argument("--out", help="the JSON result (default: benchmarks/results/pack.json or pack_ray.json)")
    args = parser.parse_args()

    folder = str(cache_dir() / f"bench-sample-{args.images}")
    make_sample_folder(folder, args.images, workers=args.workers)
    FolderSource(folder)  # build the folder index once, outside the timings
    if args.engine == "ray":
        main_engines(args, folder)
        return
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
    out = args.out or os.path.join(RESULTS, "pack.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as file:
        json.dump(result, file, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
