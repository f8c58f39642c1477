"""The batch ring, on and off, A B A B: images/s, page faults per batch and CPU µs per image.

Each measurement runs in a fresh interpreter: an LMDBDataset + the pipeline's transform, DataLoaderX with
batch ``--batch-size`` (256), 2 persistent workers, shuffled; ``--warmup`` epochs (the workers start, each
worker writes each slot it uses a first time: the page faults a ring pays once), then ``--epochs`` epochs
measured. Figures per run:

- ``images_per_s``: images the loop received / wall-clock seconds (the loop reads one byte of every page of
  each batch, as the copy to the GPU or the model would read them all);
- ``us_per_image``: CPU µs per image of every process involved (the main process and its workers, from
  /proc/<pid>/stat: the workers are alive throughout, which getrusage(RUSAGE_CHILDREN) does not count);
- ``faults_per_batch``: minor page faults per batch in the main process and in the workers, apart;
- ``handoff_ms``: the stage clock's median hand-off per batch in the main process (unpickling the batch).

The ring is switched by the loader's private plan field (``batch_ring``), as ``bench_stage_clock.py`` switches
the clock. Data: ``fastloader.sample.make_sample_folder`` photos packed twice, as they are ("full") and with
``resize_max_side=256, quality=90`` ("256", FFCV's recipe), in ``--data``.

    python benchmarks/bench_batch_ring.py [--images 2560] [--batch-size 256] [--repeats 3] [--warmup 2] [--epochs 3]
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

from bench_revisions import PIPELINES  # a sibling script (the pipelines as code for a fresh interpreter)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


RUN = r"""
import dataclasses, json, os, sys, time, torch
torch.set_num_threads(1)
from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import LMDBDataset
lmdb, transform, ring = sys.argv[1], eval(sys.argv[2]), sys.argv[3] == "on"
warmup, epochs, batch_size = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
loader = DataLoaderX(LMDBDataset(lmdb, transform=transform), batch_size=batch_size, shuffle=True, num_workers=2,
                     persistent_workers=True)
loader._plan = dataclasses.replace(loader._plan, batch_ring=ring)

def counters():  # {pid: (minor faults, CPU ticks)} of this process and its children (the workers)
    pids = [os.getpid()]
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as file:
            pids += [int(pid) for pid in file.read().split()]
    out = {}
    for pid in pids:
        with open(f"/proc/{pid}/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()
        out[pid] = (int(fields[7]), int(fields[11]) + int(fields[12]))
    return out

def touch(images):  # one byte of every page, as the copy to the GPU or the model would read them all
    return int(images.permute(0, 2, 3, 1).reshape(-1)[::4096].sum())

for _ in range(warmup):  # workers started; each worker has written each slot it uses once
    for images, _ in loader:
        touch(images)
del images
before, start, seen, batches = counters(), time.perf_counter(), 0, 0
for _ in range(epochs):
    for images, labels in loader:
        touch(images)
        seen += len(images)
        batches += 1
wall, after = time.perf_counter() - start, counters()
main = os.getpid()
def delta(which, index):
    return sum(after[pid][index] - before[pid][index] for pid in before if pid in after and which(pid))
ticks = os.sysconf("SC_CLK_TCK")
stats = loader.stats()
print(json.dumps({
    "images_per_s": seen / wall,
    "us_per_image": (delta(lambda pid: True, 1) / ticks) / seen * 1e6,
    "main_faults_per_batch": delta(lambda pid: pid == main, 0) / batches,
    "worker_faults_per_batch": delta(lambda pid: pid != main, 0) / batches,
    "handoff_ms": stats["stages"]["handoff"]["per_batch_ms"]["p50"],
    "batch_ring": stats["batch_ring"],
}))
"""


def make_data(data: Path, images: int) -> dict[str, str]:
    """The sample photos packed as they are and at 256 px (made once, kept in ``data``)."""
    from fastloader.pack import pack
    from fastloader.sample import make_sample_folder

    folder = str(make_sample_folder(data / f"bench-{images}", images))
    packs = {"full": data / f"bench-{images}.lmdb", "256": data / f"bench-{images}-256q90.lmdb"}
    if not packs["full"].exists():
        pack(folder, str(packs["full"]), progress=False)
    if not packs["256"].exists():
        pack(folder, str(packs["256"]), resize_max_side=256, quality=90, progress=False)
    return {name: str(path) for name, path in packs.items()}


def run(lmdb: str, pipeline: str, ring: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", RUN, lmdb, PIPELINES[pipeline], ring]
    command += [str(args.warmup), str(args.epochs), str(args.batch_size)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


FIGURES = ("images_per_s", "us_per_image", "main_faults_per_batch", "worker_faults_per_batch", "handoff_ms")


def compare(lmdb: str, pipeline: str, args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for _ in range(args.repeats):  # A B A B
        for side in ("off", "on"):
            runs[side].append(run(lmdb, pipeline, side, args))
    medians = {side: {key: statistics.median(r[key] for r in rs) for key in FIGURES} for side, rs in runs.items()}
    paired = [on["images_per_s"] / off["images_per_s"] for off, on in zip(runs["off"], runs["on"])]
    return {
        "median": medians,
        "on_vs_off": statistics.median(paired),  # within each A B pair: the machine drifts less than across the run
        "on_vs_off_pairs": paired,
        "us_per_image_saved": medians["off"]["us_per_image"] - medians["on"]["us_per_image"],
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2560)
    parser.add_argument("--data", default=str(ROOT / "data"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=2, help="epochs before the measured ones")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--packs", nargs="+", choices=["full", "256"], default=["256", "full"])
    parser.add_argument("--pipelines", nargs="+", choices=sorted(PIPELINES), default=["eval", "train"])
    parser.add_argument("--out", default=str(RESULTS / "batch_ring.json"))
    args = parser.parse_args()
    packs = make_data(Path(args.data), args.images)
    result: dict[str, Any] = {
        "benchmark": "batch_ring",
        "images": args.images,
        "cores": os.cpu_count(),
        "batch_size": args.batch_size,
        "num_workers": 2,
        "epochs_warmup": args.warmup,
        "epochs_measured": args.epochs,
        "repeats": args.repeats,
    }
    for pack_name in args.packs:
        for pipeline in args.pipelines:
            figures = compare(packs[pack_name], pipeline, args)
            result[f"{pack_name}/{pipeline}"] = figures
            off, on = figures["median"]["off"], figures["median"]["on"]
            print(
                f"{pack_name:4s} {pipeline:5s} images/s off {off['images_per_s']:6.0f} on {on['images_per_s']:6.0f}"
                f" (x{figures['on_vs_off']:.3f})  us/image off {off['us_per_image']:5.0f} on {on['us_per_image']:5.0f}"
                f"  faults/batch main {off['main_faults_per_batch']:6.0f} -> {on['main_faults_per_batch']:5.0f}"
                f"  workers {off['worker_faults_per_batch']:6.0f} -> {on['worker_faults_per_batch']:5.0f}"
                f"  handoff ms {off['handoff_ms']:.2f} -> {on['handoff_ms']:.2f}",
                flush=True,
            )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
