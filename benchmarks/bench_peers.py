"""Peers side by side in one run: torchvision, FFCV and fastloader, train and eval, full-size and 256-px images.

Data: ImageNet-like JPEGs cut from real photographs (``fastloader.sample``) as an image folder, the
same images packed by fastloader into an LMDB (bytes as they are) and into an LMDB re-encoded with
``--resize-max-side 256 --quality 90``, and written by FFCV's ``DatasetWriter`` (its own re-encode:
every image a JPEG of quality 90, full size; and FFCV's ImageNet recipe, ``max_resolution=256``).
Pipelines (DESIGN.md §5): train = RandomResizedCrop(224) + RandomHorizontalFlip, eval = Resize(256) +
CenterCrop(224) (FFCV: ``CenterCropRGBImageDecoder(ratio=224/256)``, the same centre square); uint8
``N x 3 x 224 x 224`` batches of ``--batch-size``; ``--workers`` for every loader (FFCV's ``num_workers``
are its decoding threads); random order for train, sequential for eval; the page cache warm.

Loaders (``ROWS``), each measured in a process of its own (``peers_runner.py``), A B A B, medians of
``--repeats``: torchvision ImageFolder + transforms + torch DataLoader with stock Pillow (in the peer
environment, as users have it) and with the project's Pillow (pillow-simd where ``make setup`` put
it); FFCV (in ``--peer-python``'s environment: FFCV is never a project dependency); fastloader
ImageFolder / LMDB + DataLoaderX. The rate is the steady state (epochs after the first); the first
epoch (worker start, FFCV's JIT compilation) is reported apart, with the time to the first batch and
the process tree's peak PSS. The ceiling: the single-thread rate of fastloader's decode + crop +
resize of the same bytes (``bench_pipeline.ceiling``: the faster of image by image and a batch per call),
times the cores used. Each loader's cost is
also given in images per CPU-second of its process tree (its workers and threads; against the
ceiling's images per CPU-second of one thread): on a shared machine whose load moves every rate,
the CPU a loader spends per image moves far less.

    python benchmarks/bench_peers.py --peer-python /path/to/ffcv-venv/bin/python [--images 5000]
        [--workers 2] [--repeats 3] [--epochs 2] [--rows NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch
from bench_pipeline import ceiling  # a sibling script: benchmarks/ is on sys.path when run

from fastloader.pack import pack
from fastloader.sample import make_sample_folder

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RUNNER = Path(__file__).resolve().parent / "peers_runner.py"


class Row(NamedTuple):
    name: str
    group: str  # "full" (the images as they are) or "256" (longer side <= 256 px, quality 90)
    python: str  # "peer" (--peer-python's environment) or "project" (this one)
    loader: str  # a peers_runner.LOADERS name
    source: str  # a key of prepare()'s sources
    ours: bool


ROWS = [
    Row("torchvision (stock Pillow)", "full", "peer", "torchvision", "folder", False),
    Row("torchvision (project's Pillow)", "full", "project", "torchvision", "folder", False),
    Row("FFCV", "full", "peer", "ffcv", "beton", False),
    Row("fastloader folder", "full", "project", "fastloader-folder", "folder", True),
    Row("fastloader LMDB", "full", "project", "fastloader-lmdb", "lmdb", True),
    Row("FFCV-256", "256", "peer", "ffcv", "beton-256", False),
    Row("fastloader LMDB-256", "256", "project", "fastloader-lmdb", "lmdb-256", True),
]


def call(python: str, arguments: list[str], timeout: float) -> dict[str, Any]:
    """Run the runner under ``python``; its last stdout line is a JSON object."""
    env = dict(os.environ)
    if python != sys.executable:
        env.pop("PYTHONPATH", None)  # another environment: nothing of this one on its path
    done = subprocess.run(
        [python, str(RUNNER), *arguments], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(
            f"{python} {RUNNER.name} {' '.join(arguments)} failed ({done.returncode}): {done.stderr[-2000:]}"
        )
    return dict(json.loads(lines[-1]))


def prepare(args: argparse.Namespace, rows: list[Row]) -> dict[str, str]:
    """The folder, the LMDBs and the .beton files the rows read (each made once, kept in ``--data``)."""
    data = Path(args.data)
    stem = f"bench-{args.images}"
    folder = str(make_sample_folder(data / stem, args.images))
    sources = {"folder": folder, "lmdb": str(data / f"{stem}.lmdb"), "lmdb-256": str(data / f"{stem}-256q90.lmdb")}
    sources |= {"beton": str(data / f"{stem}-q90.beton"), "beton-256": str(data / f"{stem}-256q90.beton")}
    needed = {row.source for row in rows} | {"lmdb" if row.group == "full" else "lmdb-256" for row in rows}  # ceilings
    if "lmdb" in needed:
        pack(folder, sources["lmdb"], progress=False)
    if "lmdb-256" in needed:
        pack(folder, sources["lmdb-256"], resize_max_side=256, quality=90, progress=False)
    for key, resolution in (("beton", None), ("beton-256", 256)):
        if key in needed and not Path(sources[key]).exists():
            options = ["--max-resolution", str(resolution)] if resolution else []
            written = call(args.peer_python, ["write-beton", "--folder", folder, "--out", sources[key], *options], 3600)
            print(f"wrote {written['out']}: {written['images']} images in {written['s']:.0f} s", flush=True)
    return sources


def sizes(sources: dict[str, str], images: int) -> dict[str, float]:
    """Mean bytes per image of each source."""

    def total(path: Path) -> int:
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size

    return {key: total(Path(path)) / images for key, path in sources.items() if Path(path).exists()}


def measure_row(args: argparse.Namespace, row: Row, source: str, pipeline: str) -> dict[str, Any]:
    python = args.peer_python if row.python == "peer" else sys.executable
    arguments = ["measure", "--loader", row.loader, "--source", source, "--pipeline", pipeline]
    arguments += ["--images", str(args.images), "--batch-size", str(args.batch_size)]
    arguments += ["--workers", str(args.workers), "--epochs", str(args.epochs)]
    try:
        return call(python, arguments, args.timeout)
    except (RuntimeError, subprocess.TimeoutExpired) as error:  # one failed run must not lose the others
        print(f"  {row.name} {pipeline}: {error}", flush=True)
        return {"error": str(error)[-2000:]}


def measure_ceiling(sources: dict[str, str], group: str, pipeline: str, cores: int) -> dict[str, Any]:
    top = ceiling(sources["lmdb" if group == "full" else "lmdb-256"], pipeline == "train", cores)
    return {"images_per_s": top["single_thread_images_per_s"] * cores, **top, "cores": cores}


def run_all(args: argparse.Namespace, rows: list[Row], sources: dict[str, str]) -> dict[str, Any]:
    """Every row and the ceilings, A B A B: each repeat runs them all, train then eval."""
    cores = min(args.workers, len(os.sched_getaffinity(0)))
    groups = sorted({row.group for row in rows})
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        pipeline: {name: [] for name in [row.name for row in rows] + [f"ceiling {g}" for g in groups]}
        for pipeline in args.pipelines
    }
    for repeat in range(args.repeats):
        for pipeline in args.pipelines:
            for row in rows:
                result = measure_row(args, row, sources[row.source], pipeline)
                runs[pipeline][row.name].append(result)
                rate, others = result.get("images_per_s", 0), result.get("others_cores", 0)
                line = f"repeat {repeat + 1} {pipeline} {row.name}: {rate:.0f} images/s, others {others:.2f} cores"
                print(line, flush=True)
            for group in groups:
                runs[pipeline][f"ceiling {group}"].append(measure_ceiling(sources, group, pipeline, cores))
    return runs


def median_of(results: list[dict[str, Any]], key: str) -> float | None:
    values = [result[key] for result in results if key in result]
    return statistics.median(values) if values else None


def table_of_ceiling(results: list[dict[str, Any]]) -> dict[str, float | None]:
    keys = ("images_per_s", "single_thread_images_per_s", "single_thread_images_per_cpu_s")
    keys += ("per_image_images_per_s", "batch_images_per_s")
    return {key: median_of(results, key) for key in keys}


def paired_ratio(ours: list[dict[str, Any]], peer: list[dict[str, Any]], key: str) -> float | None:
    """The median over repeats of ours / peer within each repeat (minutes apart, where the machine's load
    drifts less than across the whole run)."""
    ratios = [a[key] / b[key] for a, b in zip(ours, peer) if key in a and key in b]
    return statistics.median(ratios) if ratios else None


def summarize(rows: list[Row], runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians per row, and each row against the best peer of its group and against the ceiling."""
    table: dict[str, Any] = {}
    for row in rows:
        done = [result for result in runs[row.name] if "error" not in result]
        memory = [result["memory"] for result in done]
        table[row.name] = {
            "group": row.group,
            "ours": row.ours,
            "runs": len(done),
            "failed": len(runs[row.name]) - len(done),
            "errors": [result["error"] for result in runs[row.name] if "error" in result],  # why each failed
            "images_per_s": median_of(done, "images_per_s"),
            "images_per_cpu_s": median_of(done, "images_per_cpu_s"),
            "spread": [min(r["images_per_s"] for r in done), max(r["images_per_s"] for r in done)] if done else None,
            "first_batch_s": median_of(done, "first_batch_s"),
            "others_cores": median_of(done, "others_cores"),
            "first_epoch_images_per_s": median_of(done, "first_epoch_images_per_s"),
            "memory_mb": {key: median_of(memory, key) for key in memory[0]} if memory else None,
            "batch": done[0]["batch"] if done else None,
            "versions": done[0]["versions"] if done else None,
        }
    ceilings = {group: table_of_ceiling(runs[f"ceiling {group}"]) for group in {row.group for row in rows}}
    for row in rows:
        entry, top = table[row.name], ceilings[row.group]
        for key, of_top in (("images_per_s", "images_per_s"), ("images_per_cpu_s", "single_thread_images_per_cpu_s")):
            value, limit = entry[key], top[of_top]
            entry[f"{key}_of_ceiling"] = value / limit if value and limit else None
            peers = {r.name: table[r.name][key] for r in rows if r.group == row.group and not r.ours}
            peers = {name: rate for name, rate in peers.items() if rate}
            if row.ours and peers and value:
                best = max(peers, key=lambda name: peers[name])
                entry[f"{key}_best_peer"], entry[f"{key}_x_best_peer"] = best, value / peers[best]
                entry[f"{key}_x_best_peer_paired"] = paired_ratio(runs[row.name], runs[best], key)
    for group, top in ceilings.items():
        table[f"ceiling {group}"] = top
    return table


def ratio(entry: dict[str, Any], key: str) -> str:
    best = entry.get(f"{key}_best_peer")
    return f"x{entry[f'{key}_x_best_peer']:.2f} {best}" if best else ""


def print_table(pipeline: str, table: dict[str, Any]) -> None:
    print(
        f"\n{pipeline}: images/s, x best peer, of ceiling | images per CPU-s, x best peer, of ceiling | "
        "first batch | first epoch | peak PSS"
    )
    for name, entry in table.items():
        if name.startswith("ceiling"):
            single, cpu = entry["single_thread_images_per_s"], entry["single_thread_images_per_cpu_s"]
            print(f"  {name:<30} {entry['images_per_s']:6.0f} ({single:.0f} x cores) | one thread: {cpu:.0f} per CPU-s")
            continue
        if not entry["images_per_s"]:
            print(f"  {name:<30} failed")
            continue
        memory = entry["memory_mb"]
        heap = memory["tree_pss_anon_mb"] + memory["tree_pss_shmem_mb"]
        print(
            f"  {name:<30} {entry['images_per_s']:6.0f} {ratio(entry, 'images_per_s'):<38} "
            f"{entry['images_per_s_of_ceiling'] or 0:4.0%} | {entry['images_per_cpu_s']:6.0f} "
            f"{ratio(entry, 'images_per_cpu_s'):<38} {entry['images_per_cpu_s_of_ceiling'] or 0:4.0%} | "
            f"{entry['first_batch_s']:5.2f} s | {entry['first_epoch_images_per_s']:5.0f}/s | "
            f"{memory['tree_pss_mb']:5.0f} MB (anon+shmem {heap:.0f}, file {memory['tree_pss_file_mb']:.0f})"
        )


def resummarize(path: str) -> None:
    """The tables of a finished run again, from its runs (after a change to the summary)."""
    result = json.loads(Path(path).read_text())
    for pipeline, runs in result["runs"].items():
        rows = [row for row in ROWS if row.name in runs]
        result["results"][pipeline] = summarize(rows, runs)
        print_table(pipeline, result["results"][pipeline])
    Path(path).write_text(json.dumps(result, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer-python", default=os.environ.get("FFCV_PYTHON"), help="a Python with ffcv installed")
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs after each loader's warm-up epoch")
    parser.add_argument("--pipelines", nargs="+", choices=["train", "eval"], default=["train", "eval"])
    parser.add_argument("--rows", nargs="+", choices=[row.name for row in ROWS], default=[row.name for row in ROWS])
    parser.add_argument("--timeout", type=float, default=900, help="seconds one loader's run may take")
    parser.add_argument("--data", default=str(ROOT / "data"))
    parser.add_argument("--out", default=str(RESULTS / "peers.json"))
    parser.add_argument("--summarize-only", action="store_true", help="recompute --out's tables from its runs")
    args = parser.parse_args()
    if args.summarize_only:
        resummarize(args.out)
        return
    torch.set_num_threads(1)  # the ceiling: one thread
    rows = [row for row in ROWS if row.name in args.rows and (args.peer_python or row.python == "project")]
    skipped = sorted(set(args.rows) - {row.name for row in rows})
    if skipped:
        print(f"no --peer-python (or FFCV_PYTHON): skipping {', '.join(skipped)}")
    started, load_before = time.time(), list(os.getloadavg())
    sources = prepare(args, rows)
    runs = run_all(args, rows, sources)
    result: dict[str, Any] = {
        "benchmark": "peers",
        "machine": {"cpus": len(os.sched_getaffinity(0)), "processor": platform.processor()},
        "loadavg": {"before": load_before, "after": list(os.getloadavg())},
        "wall_s": time.time() - started,
        "data": f"{args.images} ImageNet-like JPEGs from real photographs (fastloader.sample)",
        "bytes_per_image": sizes(sources, args.images),
        "setup": {key: getattr(args, key) for key in ("batch_size", "workers", "repeats", "epochs")},
        "skipped": skipped,
        "results": {pipeline: summarize(rows, runs[pipeline]) for pipeline in args.pipelines},
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for pipeline in args.pipelines:
        print_table(pipeline, result["results"][pipeline])
    print(f"\nload average {load_before} -> {result['loadavg']['after']}; wrote {args.out}")


if __name__ == "__main__":
    main()
