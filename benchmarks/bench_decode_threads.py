"""Decode threads per worker, A B C A B C: images/s and CPU µs per image of one worker on one thread, one
worker on two, and two workers on one each.

Each measurement runs in a fresh interpreter: an LMDBDataset + the pipeline's transform with
``set_decode_threads(threads)``, DataLoaderX with batch ``--batch-size`` (256) and ``workers`` persistent
workers; ``--warmup`` epochs, then ``--epochs`` measured. ``us_per_image`` is the CPU of every process
involved (/proc/<pid>/stat of the loop's process and its workers). One worker on two threads against one on
one is what the threads give a loader with fewer workers than cores; two workers on one thread each is the
same cores used the usual way.

    python benchmarks/bench_decode_threads.py [--images 5000] [--repeats 3] [--packs 256 full]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench_batch_ring import make_data  # sibling scripts: the packs, the pipelines as code
from bench_revisions import PIPELINES

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SETUPS = {"1 worker, 1 thread": (1, 1), "1 worker, 2 threads": (1, 2), "2 workers, 1 thread": (2, 1)}

RUN = r"""
import json, os, sys, time, torch
torch.set_num_threads(1)
from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import LMDBDataset
lmdb, transform = sys.argv[1], eval(sys.argv[2])
workers, threads, warmup, epochs, batch_size = (int(value) for value in sys.argv[3:8])
dataset = LMDBDataset(lmdb, transform=transform)
dataset.set_decode_threads(threads)
loader = DataLoaderX(dataset, batch_size=batch_size, shuffle=True, num_workers=workers, persistent_workers=True)

def ticks():  # CPU ticks of this process and its children (the workers)
    pids = [os.getpid()]
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as file:
            pids += [int(pid) for pid in file.read().split()]
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total

for _ in range(warmup):
    for images, _ in loader:
        pass
before, start, seen = ticks(), time.perf_counter(), 0
for _ in range(epochs):
    for images, labels in loader:
        seen += len(images)
wall, used = time.perf_counter() - start, (ticks() - before) / os.sysconf("SC_CLK_TCK")
print(json.dumps({"images_per_s": seen / wall, "us_per_image": used / seen * 1e6, "cores_busy": used / wall}))
"""


def run(lmdb: str, pipeline: str, workers: int, threads: int, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", RUN, lmdb, PIPELINES[pipeline], str(workers), str(threads)]
    command += [str(args.warmup), str(args.epochs), str(args.batch_size)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def compare(lmdb: str, pipeline: str, args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SETUPS}
    for _ in range(args.repeats):  # A B C A B C
        for name, (workers, threads) in SETUPS.items():
            runs[name].append(run(lmdb, pipeline, workers, threads, args))
    medians = {name: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for name, rs in runs.items()}
    one, two = runs["1 worker, 1 thread"], runs["1 worker, 2 threads"]
    paired = [b["images_per_s"] / a["images_per_s"] for a, b in zip(one, two)]
    return {"median": medians, "two_threads_vs_one": statistics.median(paired), "pairs": paired, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--data", default=str(ROOT / "data"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=1, help="epochs before the measured ones")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--packs", nargs="+", choices=["full", "256"], default=["256"])
    parser.add_argument("--pipelines", nargs="+", choices=sorted(PIPELINES), default=["eval", "train"])
    parser.add_argument("--out", default=str(RESULTS / "decode_threads.json"))
    args = parser.parse_args()
    packs = make_data(Path(args.data), args.images)
    result: dict[str, Any] = {"benchmark": "decode_threads", "images": args.images, "cores": os.cpu_count()}
    result |= {"batch_size": args.batch_size, "epochs_warmup": args.warmup, "epochs_measured": args.epochs}
    for pack_name in args.packs:
        for pipeline in args.pipelines:
            figures = compare(packs[pack_name], pipeline, args)
            result[f"{pack_name}/{pipeline}"] = figures
            cells = "  ".join(
                f"{name}: {row['images_per_s']:5.0f}/s {row['us_per_image']:4.0f} µs"
                for name, row in figures["median"].items()
            )
            print(f"{pack_name:4s} {pipeline:5s} {cells}  (2 threads x{figures['two_threads_vs_one']:.2f})", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
