"""The training loop left alone? The loop's own step time with a loader feeding it, against the step alone.

Two CPU steps, each on one torch thread: ``launch`` (300 tiny in-place torch ops on a 64-element
tensor, about 1 ms: a proxy for a loop whose time goes into launching GPU kernels) and ``model`` (a
small ResNet, two residual blocks of widths 8 / 16 with BatchNorm, forward + backward + SGD on a
32 x 3 x 16 x 16 batch, a few ms). Conditions, each in a process of its own (a *trial*):

- ``alone``: the step, back to back;
- ``torch``: torch's DataLoader (torchvision ImageFolder + transforms, uint8) feeds the loop;
- ``dataloaderx``: DataLoaderX (fastloader ImageFolder over the same files, the same pipeline) feeds it;
- ``torch separate`` / ``dataloaderx separate``: the same loader in another process beside the loop
  (it takes its batches there; the loop only steps): what the machine costs, not the training process.

Both loaders read the same folder with the train pipeline (RandomResizedCrop(224) + flip, uint8 batches
of ``--batch-size``), ``--workers`` workers, persistent. **The images/s are held equal**: batch i is
taken at ``t0 + i * batch / rate`` (``--rate``), between two steps, whatever the step costs, so both
loaders deliver the same images per second; ``achieved_images_per_s`` says whether each kept up.
Each trial, in one process: the step alone for ``--seconds`` (recorded), then the loader is built,
its first batch taken, ``--settle`` s of the loop unrecorded, and ``--seconds`` s of the loop fed
(recorded). The step time is the mean over the recorded steps (the clock around the step only; the
time in ``next()`` is reported apart as ``fetch_ms`` per batch, and in ``loop_ms``); each trial's
ratio is its fed step time over its own alone step time (the shared machine drifts between trials,
far less within one); reported: the median ratio over ``--repeats`` (A B A B: every repeat runs every
condition). The ``alone`` condition (the step alone in both windows) shows the noise floor.

    python benchmarks/bench_step_interference.py [--rate 128] [--workers 1] [--seconds 20] [--repeats 3]
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from procmem import Others  # a sibling module: benchmarks/ is on sys.path when run
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CONDITIONS = ["alone", "torch", "dataloaderx", "torch separate", "dataloaderx separate"]
STEPS = ["launch", "model"]


def launch_step() -> Callable[[], None]:
    x = torch.zeros(64)

    def step() -> None:
        for _ in range(100):
            x.mul_(0.999)
            x.add_(0.001)
            x.sub_(0.0005)

    return step


class Residual(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(width, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


def model_step() -> Callable[[], None]:
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        Residual(8),
        nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        Residual(16),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    images, labels = torch.randn(32, 3, 16, 16), torch.randint(0, 10, (32,))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(images), labels).backward()
        optimizer.step()

    return step


def make_loader(kind: str, args: argparse.Namespace) -> Iterator[Any]:
    """An endless iterator of train batches from ``kind``'s loader (epochs chained, workers persistent)."""
    kwargs: dict[str, Any] = {"batch_size": args.batch_size, "shuffle": True, "num_workers": args.workers}
    kwargs["persistent_workers"] = args.workers > 0
    if kind == "torch":
        import torchvision
        from torch.utils.data import DataLoader
        from torchvision import transforms as tv

        stock = tv.Compose([tv.RandomResizedCrop(224), tv.RandomHorizontalFlip(), tv.PILToTensor()])
        loader: Any = DataLoader(torchvision.datasets.ImageFolder(args.folder, transform=stock), **kwargs)
    else:
        from fastloader import DataLoaderX
        from fastloader import transforms as T
        from fastloader.datasets import ImageFolder

        ours = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])
        loader = DataLoaderX(ImageFolder(args.folder, transform=ours), **kwargs)

    def endless() -> Iterator[Any]:
        while True:
            yield from loader

    return endless()


class Schedule:
    """Takes batch i from ``batches`` at ``start + i * period`` (when due, between two steps)."""

    def __init__(self, batches: Iterator[Any] | None, period: float) -> None:
        self.batches, self.period = batches, period
        self.due = time.perf_counter()
        self.taken, self.images, self.fetch_s = 0, 0, 0.0
        self.held: Any = None  # the current batch, held as a loop holds the batch it trains on

    def poll(self) -> None:
        if self.batches is None or time.perf_counter() < self.due:
            return
        asked = time.perf_counter()
        self.held = next(self.batches)
        self.fetch_s += time.perf_counter() - asked
        self.due += self.period
        self.taken += 1
        self.images += int(self.held[0].shape[0])

    def reset(self) -> None:
        self.taken, self.images, self.fetch_s = 0, 0, 0.0


def loop(step: Callable[[], None], schedule: Schedule, seconds: float, record: bool) -> list[float]:
    """Steps back to back for ``seconds``, taking batches as they fall due; the steps' durations."""
    durations: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        schedule.poll()
        began = time.perf_counter()
        step()
        if record:
            durations.append(time.perf_counter() - began)
    return durations


def start_feeder(condition: str, args: argparse.Namespace) -> subprocess.Popen[str]:
    """The loader in a process of its own, taking batches on the same schedule; returns once it has its first."""
    command = [sys.executable, __file__, "feed", "--loader", condition.split()[0], "--folder", args.folder]
    command += ["--rate", str(args.rate), "--batch-size", str(args.batch_size), "--workers", str(args.workers)]
    command += ["--seconds", str(args.settle + args.seconds + 1)]
    feeder = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    if feeder.stdout is None or feeder.stdout.readline().strip() != "ready":
        feeder.kill()
        raise RuntimeError(f"the feeder ({' '.join(command)}) did not start")
    return feeder


def timing(durations: list[float], elapsed: float) -> dict[str, float]:
    return {
        "steps": len(durations),
        "step_ms": 1e3 * statistics.fmean(durations),
        "step_p50_ms": 1e3 * statistics.median(durations),
        "step_p90_ms": 1e3 * statistics.quantiles(durations, n=10)[-1],
        "loop_ms": 1e3 * elapsed / len(durations),
    }


def window(step: Callable[[], None], schedule: Schedule, seconds: float) -> dict[str, float]:
    """The loop for ``seconds``: its step times, and the CPU its process spent on threads other than
    the loop's own (the loader's threads in the training process: torch's has none without pinning)."""
    with Others() as machine:
        started, process, thread = time.perf_counter(), time.process_time(), time.thread_time()
        durations = loop(step, schedule, seconds, record=True)
        others = (time.process_time() - process) - (time.thread_time() - thread)
        elapsed = time.perf_counter() - started
    return {**timing(durations, elapsed), "other_threads_cpu_s": others, "others_cores": machine.cores}


def trial(args: argparse.Namespace) -> dict[str, Any]:
    """The step alone for ``--seconds``, then (in the same process, at once) the step under ``--condition``."""
    torch.set_num_threads(1)  # the loop's torch work on one core; the loader's workers have the rest
    step = launch_step() if args.step == "launch" else model_step()
    period = args.batch_size / args.rate
    loop(step, Schedule(None, period), 1.0, record=False)  # warm: allocator, caches
    alone = window(step, Schedule(None, period), args.seconds)
    feeder = start_feeder(args.condition, args) if args.condition.endswith("separate") else None
    batches = None if args.condition == "alone" or feeder else make_loader(args.condition, args)
    first = time.perf_counter()
    if batches is not None:
        next(batches)  # worker start-up is not what is measured
    first = time.perf_counter() - first
    schedule = Schedule(batches, period)
    loop(step, schedule, args.settle, record=False)
    schedule.reset()
    started = time.perf_counter()
    fed = window(step, schedule, args.seconds)
    elapsed = time.perf_counter() - started
    result: dict[str, Any] = {
        "step": args.step,
        "condition": args.condition,
        **fed,
        "alone": alone,
        "x_alone": fed["step_ms"] / alone["step_ms"],
        "loop_x_alone": fed["loop_ms"] / alone["loop_ms"],
        "batches": schedule.taken,
        "achieved_images_per_s": schedule.images / elapsed,
        "fetch_ms": 1e3 * schedule.fetch_s / schedule.taken if schedule.taken else 0.0,
        "other_threads_cpu_ms_per_s": 1e3 * fed["other_threads_cpu_s"] / elapsed,
        "first_batch_s": first,
        "loadavg": list(os.getloadavg()),
    }
    if feeder is not None:
        out, _ = feeder.communicate(timeout=60)
        result["feeder"] = json.loads(out.strip().splitlines()[-1])
        result["achieved_images_per_s"] = result["feeder"]["achieved_images_per_s"]
    return result


def feed(args: argparse.Namespace) -> dict[str, Any]:
    """The separate process: the loader alone, its batches taken on the schedule (sleeping between)."""
    torch.set_num_threads(1)
    batches = make_loader(args.loader, args)
    next(batches)
    print("ready", flush=True)
    schedule = Schedule(batches, args.batch_size / args.rate)
    started = time.perf_counter()
    end = started + args.seconds
    while time.perf_counter() < end:
        schedule.poll()
        time.sleep(max(0.0, min(schedule.due, end) - time.perf_counter()))
    return {"achieved_images_per_s": schedule.images / (time.perf_counter() - started), "batches": schedule.taken}


def run_trial(args: argparse.Namespace, step: str, condition: str) -> dict[str, Any]:
    command = [sys.executable, __file__, "trial", "--step", step, "--condition", condition, "--folder", args.folder]
    for option in ("rate", "batch_size", "workers", "seconds", "settle"):
        command += [f"--{option.replace('_', '-')}", str(getattr(args, option))]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.seconds + args.settle + 300, cwd=ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return dict(json.loads(lines[-1]))


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians over the repeats of each trial's figures, and of its step (and loop) time against the step
    alone measured just before in the same process (the machine drifts between trials, less within one)."""
    keys = ("step_ms", "step_p50_ms", "step_p90_ms", "loop_ms", "achieved_images_per_s", "fetch_ms", "batches")
    keys += ("other_threads_cpu_ms_per_s", "others_cores")
    table: dict[str, Any] = {}
    for name, results in runs.items():
        row = {key: statistics.median(r[key] for r in results) for key in keys}
        row["alone_step_ms"] = statistics.median(r["alone"]["step_ms"] for r in results)
        row["alone_others_cores"] = statistics.median(r["alone"]["others_cores"] for r in results)
        for key in ("x_alone", "loop_x_alone"):
            row[key] = statistics.median(r[key] for r in results)
            row[f"{key}_spread"] = [min(r[key] for r in results), max(r[key] for r in results)]
        table[name] = row
    return table


def measure(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {step: {c: [] for c in args.conditions} for step in args.steps}
    for repeat in range(args.repeats):
        for step in args.steps:
            for condition in args.conditions:  # A B A B
                result = run_trial(args, step, condition)
                runs[step][condition].append(result)
                print(
                    f"repeat {repeat + 1} {step:6s} {condition:22s} step {result['step_ms']:.3f} ms "
                    f"x{result['x_alone']:.3f}  "
                    f"{result['achieved_images_per_s']:.0f} images/s  others' cores "
                    f"{result['alone']['others_cores']:.2f} / {result['others_cores']:.2f}",
                    flush=True,
                )
    return runs


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", choices=["run", "trial", "feed"], default="run")
    parser.add_argument("--folder", default=None, help="an image folder (default: the sample in data/)")
    parser.add_argument("--images", type=int, default=5000, help="the sample's size when --folder is not given")
    parser.add_argument("--rate", type=float, default=128.0, help="images/s both loaders are held at")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=20.0, help="recorded seconds per trial")
    parser.add_argument("--settle", type=float, default=3.0, help="unrecorded seconds after the first batch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", nargs="+", choices=STEPS, default=STEPS)
    parser.add_argument("--conditions", nargs="+", choices=CONDITIONS, default=CONDITIONS)
    parser.add_argument("--step", choices=STEPS, help="(trial) the step")
    parser.add_argument("--condition", choices=CONDITIONS, help="(trial) the condition")
    parser.add_argument("--loader", choices=["torch", "dataloaderx"], help="(feed) the loader")
    parser.add_argument("--out", default=str(RESULTS / "step_interference.json"))
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.command != "run":
        print(json.dumps(trial(args) if args.command == "trial" else feed(args)), flush=True)
        return
    if args.folder is None:
        from fastloader.sample import make_sample_folder

        args.folder = str(make_sample_folder(ROOT / "data" / f"bench-{args.images}", args.images))
    started, load_before = time.time(), list(os.getloadavg())
    runs = measure(args)
    result = {
        "benchmark": "step_interference",
        "machine": {"cpus": len(os.sched_getaffinity(0)), "processor": platform.processor()},
        "torch": torch.__version__,
        "loadavg": {"before": load_before, "after": list(os.getloadavg())},
        "wall_s": time.time() - started,
        "data": {"folder": args.folder, "pipeline": "RandomResizedCrop(224) + RandomHorizontalFlip, uint8"},
        "setup": {key: getattr(args, key) for key in ("rate", "batch_size", "workers", "seconds", "settle", "repeats")},
        "results": {step: summarize(runs[step]) for step in args.steps},
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for step in args.steps:
        print(
            f"\n{step}: step ms (mean; alone before) | x alone [spread] | loop x alone | images/s | "
            "fetch ms/batch | other threads' CPU ms/s"
        )
        for name, row in result["results"][step].items():
            low, high = row["x_alone_spread"]
            print(
                f"  {name:22s} {row['step_ms']:7.3f} ({row['alone_step_ms']:.3f})  x{row['x_alone']:.3f} "
                f"[{low:.3f}-{high:.3f}]  x{row['loop_x_alone']:.3f}  {row['achieved_images_per_s']:6.0f}  "
                f"{row['fetch_ms']:6.2f}  {row['other_threads_cpu_ms_per_s']:6.1f}"
            )
    print(f"\nload average {load_before} -> {result['loadavg']['after']}; wrote {args.out}")


if __name__ == "__main__":
    main()
