"""Samplers at 10M and 100M samples: ours (numpy orders) against torch's (Python lists), time and memory.

Each measurement runs in a fresh subprocess, so that its peak memory is its own: the figure is the
peak RSS (``ru_maxrss``) minus the RSS just before the measured code, after imports. Cases:

* ``build``: ours only, ``sampler.epoch_indices(epoch)`` (the whole order as a numpy array).
* ``first_1m``: ``it = iter(sampler)`` and the first 1M ``next(it)``: what a DataLoader does at the
  start of an epoch. Torch's RandomSampler builds ``torch.randperm(n).tolist()`` on the first next,
  its DistributedSampler builds the list (plus padding) and slices it, its WeightedRandomSampler
  ``torch.multinomial(...).tolist()``: all a Python list of n ints.

Samplers: random (no replacement), distributed (8 replicas, rank 0, shuffle), weighted
(class-balanced weights over 1000 classes, with replacement, n draws; 10M only). Median of
``--repeats`` runs at 10M, A B A B; 100M runs once. Torch at 100M is skipped when its estimated
peak (n * 44 bytes: the int64 tensor plus a list of n pointers to 28-byte ints) exceeds ``--torch-limit-gb``.

    python benchmarks/bench_samplers.py                 # writes benchmarks/results/samplers.json
    python benchmarks/bench_samplers.py --sizes 10000000 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
MB = 1 << 20
FIRST = 1_000_000
REPLICAS = 8
TORCH_BYTES_PER_SAMPLE = 44


def _rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _make(impl: str, kind: str, n: int) -> Any:
    import numpy as np

    if impl == "ours":
        from fastloader import samplers as ours

        if kind == "random":
            return ours.RandomSampler(n, seed=0)
        if kind == "distributed":
            return ours.DistributedSampler(n, num_replicas=REPLICAS, rank=0, seed=0)
        labels = np.arange(n, dtype=np.int32) % 1000
        return ours.WeightedRandomSampler(ours.class_balanced_weights(labels), n, seed=0)
    import torch
    import torch.utils.data as tud

    if kind == "random":
        return tud.RandomSampler(range(n), generator=torch.Generator().manual_seed(0))
    if kind == "distributed":
        return tud.DistributedSampler(range(n), num_replicas=REPLICAS, rank=0, seed=0)
    weights = torch.from_numpy(1.0 / np.full(n, n // 1000, dtype=np.float64))
    return tud.WeightedRandomSampler(weights, n, generator=torch.Generator().manual_seed(0))


def measure_one(impl: str, kind: str, case: str, n: int) -> dict[str, float]:
    """Run one measurement in this process; returns seconds and peak memory growth."""
    sampler = _make(impl, kind, n)
    before = _rss_bytes()
    start = time.perf_counter()
    if case == "build":
        order = sampler.epoch_indices(0)
        elapsed = time.perf_counter() - start
        extra = {"order_dtype": str(order.dtype), "order_mb": round(order.nbytes / MB, 1)}
    else:
        iterator = iter(sampler)
        for _ in range(min(FIRST, len(sampler))):
            next(iterator)
        elapsed = time.perf_counter() - start
        extra = {}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"seconds": round(elapsed, 3), "peak_mb": round(max(0, peak - before) / MB, 1), **extra}


def run_child(impl: str, kind: str, case: str, n: int) -> dict[str, Any]:
    command = [sys.executable, os.path.abspath(__file__), "--child", impl, kind, case, str(n)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"rc {done.returncode}"}
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    good = [run for run in runs if "error" not in run]
    if not good:
        return runs[0]
    summary: dict[str, Any] = {
        "seconds_median": round(statistics.median(run["seconds"] for run in good), 3),
        "peak_mb_median": round(statistics.median(run["peak_mb"] for run in good), 1),
        "runs": len(good),
    }
    for key in ("order_dtype", "order_mb"):
        if key in good[0]:
            summary[key] = good[0][key]
    return summary


def bench_size(n: int, repeats: int, torch_limit_gb: float) -> dict[str, Any]:
    torch_fits = n * TORCH_BYTES_PER_SAMPLE <= torch_limit_gb * (1 << 30)
    kinds = ["random", "distributed"] + (["weighted"] if n <= 10_000_000 else [])
    results: dict[str, Any] = {}
    for kind in kinds:
        runs: dict[str, list[dict[str, Any]]] = {"ours_build": [], "ours_first_1m": [], "torch_first_1m": []}
        for _ in range(repeats):  # A B A B: ours and torch interleaved, so drift hits both
            runs["ours_build"].append(run_child("ours", kind, "build", n))
            runs["ours_first_1m"].append(run_child("ours", kind, "first_1m", n))
            if torch_fits:
                runs["torch_first_1m"].append(run_child("torch", kind, "first_1m", n))
        entry = {name: summarize(found) for name, found in runs.items() if found}
        if not torch_fits:
            entry["torch_first_1m"] = {"skipped": f"estimated peak {n * TORCH_BYTES_PER_SAMPLE / (1 << 30):.1f} GB"}
        else:
            ours, theirs = entry["ours_first_1m"], entry["torch_first_1m"]
            if "seconds_median" in ours and "seconds_median" in theirs:
                entry["torch_over_ours_seconds"] = round(theirs["seconds_median"] / ours["seconds_median"], 2)
                entry["torch_over_ours_peak_mb"] = round(theirs["peak_mb_median"] / max(ours["peak_mb_median"], 0.1), 2)
        results[kind] = entry
        print(f"n={n:,} {kind}: {json.dumps(entry)}", flush=True)
    return results


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        impl, kind, case, n = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
        print(json.dumps(measure_one(impl, kind, case, n)))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000_000, 100_000_000])
    parser.add_argument("--repeats", type=int, default=3, help="runs per case at <= 10M (larger sizes: 1)")
    parser.add_argument("--torch-limit-gb", type=float, default=8.0)
    parser.add_argument("--out", default=os.path.join(RESULTS, "samplers.json"))
    args = parser.parse_args()
    total_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    report: dict[str, Any] = {
        "benchmark": "samplers",
        "machine": {"cpus": os.cpu_count(), "memory_gb": round(total_gb, 1)},
        "first_indices": FIRST,
        "distributed_replicas": REPLICAS,
        "memory": "peak RSS growth of a fresh process over the measured code (MB)",
        "sizes": {},
    }
    for n in args.sizes:
        repeats = args.repeats if n <= 10_000_000 else 1
        report["sizes"][str(n)] = bench_size(n, repeats, args.torch_limit_gb)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump(report, out, indent=2)
        out.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
