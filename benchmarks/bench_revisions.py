"""Plain classification at two git revisions, A B A B: did a change slow the image path down?

Each figure is given twice: images per CPU-second (of every process involved: the cost, which other
work on a shared machine disturbs little) and images per second of wall-clock time (the rate).
Each measurement runs in a fresh interpreter importing fastloader from one tree: the current checkout
("after") and a worktree of ``--before`` (built from git, with this checkout's compiled JPEG
extension). Three figures, medians over ``--repeats`` pairs, for ``--pipeline train``
(RandomResizedCrop(224) + flip, the default) or ``eval`` (Resize(256) + CenterCrop(224)):

- ``loader``: LMDBDataset + the transform + DataLoaderX, batch 256, 2 persistent workers, images/s
  over two epochs after a warm-up epoch;
- ``batches``: the same dataset's ``__getitems__`` + collate in this one process, batch 256 (what a
  worker does per batch, without the hand-off), images/s over one pass after a warm-up pass;
- ``single_thread``: the fused decode + crop + resize of 2,000 images in one thread, images/s.

    python benchmarks/bench_revisions.py --before 7aec7b3 --lmdb data/bench-5000-256.lmdb [--pipeline eval]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

PIPELINES = {
    "train": "T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])",
    "eval": "T.Compose([T.Resize(256), T.CenterCrop(224)])",
}

LOADER = r"""
import os, sys, time, torch
torch.set_num_threads(1)
from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import LMDBDataset
dataset = LMDBDataset(sys.argv[1], transform=eval(sys.argv[2]))
loader = DataLoaderX(dataset, batch_size=256, shuffle=True, num_workers=2, persistent_workers=True)
for _ in loader:
    pass

def cpu_seconds():  # this process and its workers (persistent: alive from warm-up to the end)
    pids, ticks = [os.getpid()], 0
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as file:
            pids += [int(pid) for pid in file.read().split()]
    for pid in pids:
        with open(f"/proc/{pid}/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")

start, cpu, seen = time.perf_counter(), cpu_seconds(), 0
for _ in range(2):
    for images, labels in loader:
        seen += len(images)
print(seen / (cpu_seconds() - cpu), seen / (time.perf_counter() - start))
"""

BATCHES = r"""
import sys, time, torch
torch.set_num_threads(1)
from fastloader import transforms as T
from fastloader.datasets import LMDBDataset
from fastloader.image.batching import collate
dataset = LMDBDataset(sys.argv[1], transform=eval(sys.argv[2]))
batches = [list(range(start, min(start + 256, len(dataset)))) for start in range(0, len(dataset), 256)]
for indices in batches[:4]:
    collate(dataset.__getitems__(indices))
start, cpu = time.perf_counter(), time.process_time()
for indices in batches:
    collate(dataset.__getitems__(indices))
print(len(dataset) / (time.process_time() - cpu), len(dataset) / (time.perf_counter() - start))
"""

SINGLE_THREAD = r"""
import sys, time
from fastloader import transforms as T
from fastloader.datasets import LMDBDataset
source = LMDBDataset(sys.argv[1]).source
blobs = [source.read(i) for i in range(min(2000, len(source)))]
transform = eval(sys.argv[2])
start, cpu = time.perf_counter(), time.process_time()
for blob in blobs:
    transform(blob)
print(len(blobs) / (time.process_time() - cpu), len(blobs) / (time.perf_counter() - start))
"""


def worktree(revision: str) -> Path:
    """A checkout of ``revision`` beside the repository, with this checkout's compiled extension."""
    path = ROOT.parent / f"fastloader-bench-{revision}"
    if not path.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), revision], check=True)
    for extension in (ROOT / "fastloader" / "image").glob("_jpeg*.so"):
        shutil.copy(extension, path / "fastloader" / "image")
    return path


def rate(code: str, tree: Path, lmdb: str, pipeline: str) -> tuple[float, float]:
    """(images per CPU-second of every process involved, images per second of wall-clock time)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-c", code, lmdb, PIPELINES[pipeline]]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    per_cpu_second, per_second = done.stdout.split()[-2:]
    return float(per_cpu_second), float(per_second)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the git revision to compare with")
    parser.add_argument("--lmdb", required=True, help="a fastloader LMDB (benchmarks/bench_pipeline.py makes some)")
    parser.add_argument("--pipeline", choices=sorted(PIPELINES), default="train")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--out", help="default: benchmarks/results/revisions.json (train), revisions-eval.json")
    args = parser.parse_args()
    args.out = args.out or str(RESULTS / ("revisions.json" if args.pipeline == "train" else "revisions-eval.json"))
    trees = {"before": worktree(args.before), "after": ROOT}
    result: dict[str, object] = {
        "benchmark": "revisions",
        "before": args.before,
        "lmdb": args.lmdb,
        "pipeline": args.pipeline,
        "transform": PIPELINES[args.pipeline],
    }
    for name, code in (("loader", LOADER), ("batches", BATCHES), ("single_thread", SINGLE_THREAD)):
        runs: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
        for _ in range(args.repeats):  # A B A B
            for side, tree in trees.items():
                runs[side].append(rate(code, tree, args.lmdb, args.pipeline))
        figures: dict[str, object] = {}
        for position, unit in enumerate(("images_per_cpu_s", "images_per_s")):
            values = {side: [run[position] for run in side_runs] for side, side_runs in runs.items()}
            medians = {side: statistics.median(v) for side, v in values.items()}
            spread = {side: (min(v), max(v)) for side, v in values.items()}
            ratio = medians["after"] / medians["before"]
            figures[unit] = {"median": medians, "runs": values, "spread": spread, "x_before": ratio}
            print(f"{name:14s} {unit:17s} before {medians['before']:7.0f}  after {medians['after']:7.0f}  x{ratio:.3f}")
        result[name] = figures
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
