"""Where the workers run (``worker_method``): what each mode costs and what it spares the training process.

Data: ``--images`` ImageNet-like photos (``fastloader.sample``), read as fastloader's ImageFolder and as an LMDB
pack of the same folder (``fastloader.pack``), with the train pipeline (RandomResizedCrop(224) + flip, uint8
batches of ``--batch-size``), ``--workers`` workers, persistent. Every trial is a process of its own.

* **feed** (per data and mode: process under fork, process under forkserver, thread, subprocess; ``--repeats``
  times, A B A B, medians): the loader is made and run for ``--epochs`` epochs as fast as the loop takes batches
  (no step). Memory: the PSS of the whole
  process tree (this process and every descendant: the fork server and the pipeline's child too), its peak while
  the loader runs, minus the PSS before the loader was made (``added_pss_mb``). Speed: images/s after the first
  batch. The training process's CPU: its own CPU seconds (every thread of it, none of its children) per 1,000
  delivered images.
* **launch** (per data and loader: torch's DataLoader over torchvision's ImageFolder, DataLoaderX in each mode):
  a launch-bound step (300 tiny in-place torch ops on one thread, ``bench_step_interference.launch_step``) back to
  back, in windows of ``--window`` seconds: alone, with the loader, alone, with the loader, ... alone (``--rounds``
  loader windows). With the loader, a batch is taken whenever one falls due at ``--rate`` images/s (between two
  steps; the time in ``next()`` is not the step's). A loader window's ratio is its mean step time over the mean of
  its two neighbouring alone windows (this machine's speed drifts: neighbours drift least); reported: the median
  ratio. After each loader window, ``--settle`` seconds for the loader to refill its queues and idle: the alone
  windows run beside an idle loader.

Ratios are within one run; the JSON (``benchmarks/results/worker_modes.json``) says the machine and its load.

    python benchmarks/bench_worker_modes.py [--images 512] [--workers 4] [--batch-size 64] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench_step_interference import Schedule, launch_step  # sibling modules: benchmarks/ is on sys.path when run
from procmem import Others, cpu_seconds, descendants, memory_kb

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MODES = ["process", "process forkserver", "thread", "subprocess"]
LAUNCH = ["torch", "process", "thread", "subprocess"]
DATA = ["folder", "lmdb"]


def make_data(images: int) -> dict[str, str]:
    """The sample photos as a folder and as an LMDB pack (made once, kept in ``data/``)."""
    from fastloader.pack import pack
    from fastloader.sample import make_sample_folder

    folder = make_sample_folder(ROOT / "data" / f"bench-{images}", images)
    lmdb = ROOT / "data" / f"bench-{images}.lmdb"
    if not lmdb.exists():
        pack(str(folder), str(lmdb), progress=False)
    return {"folder": str(folder), "lmdb": str(lmdb)}


def make_loader(kind: str, data: str, path: str, args: argparse.Namespace) -> Iterator[Any]:
    """An endless iterator of train batches from ``kind``'s loader (epochs chained, workers persistent)."""
    kwargs: dict[str, Any] = {"batch_size": args.batch_size, "shuffle": True, "num_workers": args.workers}
    kwargs["persistent_workers"] = True
    if kind == "torch":
        import torchvision
        from torch.utils.data import DataLoader
        from torchvision import transforms as tv

        if data != "folder":
            raise ValueError("torch's loader reads the folder (torchvision has no LMDB dataset)")
        stock = tv.Compose([tv.RandomResizedCrop(224), tv.RandomHorizontalFlip(), tv.PILToTensor()])
        loader: Any = DataLoader(torchvision.datasets.ImageFolder(path, transform=stock), **kwargs)
    else:
        from fastloader import DataLoaderX
        from fastloader import transforms as T
        from fastloader.datasets import ImageFolder, LMDBDataset

        ours = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])
        dataset = ImageFolder(path, transform=ours) if data == "folder" else LMDBDataset(path, transform=ours)
        method, _, start = kind.partition(" ")
        if start:
            kwargs["multiprocessing_context"] = start
        loader = DataLoaderX(dataset, worker_method=method, stall_warning=None, **kwargs)

    def endless() -> Iterator[Any]:
        while True:
            yield from loader

    return endless()


def tree_pss_kb() -> int:
    """The PSS of this process and every descendant, in KiB, now."""
    me = os.getpid()
    return sum(memory_kb(pid).get("pss", 0) for pid in [me, *descendants(me)])


class TreePeak:
    """The highest :func:`tree_pss_kb` seen, sampled every ``every`` s in a thread."""

    def __init__(self, every: float = 0.2) -> None:
        self.every, self.peak = every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, tree_pss_kb())

    def __enter__(self) -> TreePeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def feed_trial(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    before = tree_pss_kb()
    batches = make_loader(args.mode, args.data, args.path, args)
    with TreePeak() as peak:
        next(batches)  # the workers started and delivered once: their start is not the rate's
        cpu0, started, images = cpu_seconds(os.getpid()), time.perf_counter(), 0
        total = args.epochs * args.images // args.batch_size
        for _ in range(total):
            images += int(next(batches)[0].shape[0])
        elapsed, cpu = time.perf_counter() - started, cpu_seconds(os.getpid()) - cpu0
        peak.peak = max(peak.peak, tree_pss_kb())
    return {
        "images_per_s": images / elapsed,
        "main_cpu_s_per_1000_images": 1000 * cpu / images,
        "added_pss_mb": (peak.peak - before) / 1024,
        "pss_before_mb": before / 1024,
    }


def window(step: Callable[[], None], schedule: Schedule, seconds: float) -> float:
    """The step back to back for ``seconds`` (batches taken as they fall due): its mean time, ms."""
    durations: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        schedule.poll()
        began = time.perf_counter()
        step()
        durations.append(time.perf_counter() - began)
    return 1e3 * statistics.fmean(durations)


def launch_trial(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    step = launch_step()
    batches = make_loader(args.mode, args.data, args.path, args)
    next(batches)
    idle = Schedule(None, 0.0)
    fed = Schedule(batches, args.batch_size / args.rate)
    window(step, idle, 1.0)  # warm
    alone = [window(step, idle, args.window)]
    loaded, taken = [], 0
    with Others() as machine:
        for _ in range(args.rounds):
            fed.due, fed.taken = time.perf_counter(), 0
            loaded.append(window(step, fed, args.window))
            taken += fed.taken
            time.sleep(args.settle)  # the loader refills its queues, then idles
            alone.append(window(step, idle, args.window))
    ratios = [load / statistics.fmean(alone[i : i + 2]) for i, load in enumerate(loaded)]
    return {
        "ratio_median": statistics.median(ratios),
        "ratios": ratios,
        "alone_ms": alone,
        "loaded_ms": loaded,
        "batches_taken": taken,
        "others_cores": machine.cores,
    }


def run_trial(kind: str, mode: str, data: str, path: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--trial", kind, "--mode", mode, "--data", data, "--path", path]
    for name in ("images", "workers", "batch_size", "epochs", "rounds", "window", "rate", "settle"):
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1200)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} trial {mode} {data} failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{kind:6} {data:6} {mode:20} {json.dumps(result)[:160]}", file=sys.stderr, flush=True)
    return result


def _medians(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the repeats, and every repeat's figures."""
    return {**{key: statistics.median(t[key] for t in trials) for key in trials[0]}, "repeats": trials}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    paths = make_data(args.images)
    results: dict[str, Any] = {"figures": {data: {} for data in DATA}}
    if "feed" in args.parts:
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {data: {mode: [] for mode in MODES} for data in DATA}
        for _ in range(args.repeats):  # A B A B: every repeat runs every mode
            for data in DATA:
                for mode in MODES:
                    runs[data][mode].append(run_trial("feed", mode, data, paths[data], args))
        results["feed"] = {
            data: {mode: _medians(trials) for mode, trials in modes.items()} for data, modes in runs.items()
        }
        for data, f in results["feed"].items():
            results["figures"][data].update(
                thread_memory_vs_process_fork=f["thread"]["added_pss_mb"] / f["process"]["added_pss_mb"],
                forkserver_memory_vs_fork=f["process forkserver"]["added_pss_mb"] / f["process"]["added_pss_mb"],
                subprocess_memory_vs_process_fork=f["subprocess"]["added_pss_mb"] / f["process"]["added_pss_mb"],
                thread_throughput_vs_process=f["thread"]["images_per_s"] / f["process"]["images_per_s"],
                subprocess_throughput_vs_process=f["subprocess"]["images_per_s"] / f["process"]["images_per_s"],
                subprocess_main_cpu_vs_process=f["subprocess"]["main_cpu_s_per_1000_images"]
                / f["process"]["main_cpu_s_per_1000_images"],
                subprocess_main_cpu_vs_thread=f["subprocess"]["main_cpu_s_per_1000_images"]
                / f["thread"]["main_cpu_s_per_1000_images"],
            )
    if "launch" in args.parts:
        results["launch"] = {
            data: {
                mode: run_trial("launch", mode, data, paths[data], args)
                for mode in LAUNCH
                if data == "folder" or mode != "torch"
            }
            for data in DATA
        }
        for data, lt in results["launch"].items():
            results["figures"][data]["launch_step_ratio"] = {mode: r["ratio_median"] for mode, r in lt.items()}
    return results


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2, help="feed trials: epochs measured")
    parser.add_argument("--repeats", type=int, default=3, help="feed trials: runs of every mode (medians)")
    parser.add_argument("--rounds", type=int, default=5, help="launch trials: loader windows")
    parser.add_argument("--window", type=float, default=3.0, help="launch trials: seconds per window")
    parser.add_argument("--rate", type=float, default=48.0, help="launch trials: images/s taken from the loader")
    parser.add_argument("--settle", type=float, default=3.0, help="launch trials: s for the loader to idle again")
    parser.add_argument("--parts", nargs="+", choices=["feed", "launch"], default=["feed", "launch"])
    parser.add_argument("--trial", choices=["feed", "launch"], help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(RESULTS / "worker_modes.json"))
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.trial is not None:
        trial = feed_trial if args.trial == "feed" else launch_trial
        print(json.dumps(trial(args)))
        return
    started = time.perf_counter()
    with Others() as machine:
        results = measure(args)
    out = {
        "benchmark": "worker_modes",
        "command": "python benchmarks/bench_worker_modes.py " + " ".join(sys.argv[1:]),
        "machine": {"cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "others_cores_mean": machine.cores,  # how many cores the rest of the machine kept busy meanwhile
        "seconds": time.perf_counter() - started,
        "settings": {
            k: getattr(args, k) for k in ("images", "workers", "batch_size", "epochs", "rounds", "window", "rate")
        },
        **results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out["figures"], indent=2))


if __name__ == "__main__":
    main()
