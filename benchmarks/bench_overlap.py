"""How much of a training step waits for data: torch's DataLoader against DataLoaderX.

A training loop with a simulated step of fixed duration is fed by the stock DataLoader and by
DataLoaderX over the same dataset with the same num_workers. Each item costs real CPU work
(decoding an in-memory JPEG with PIL). Loaders run A B A B in one process and the medians are
reported, with the fraction of the epoch spent waiting for data and the epoch-time ratio.

With CUDA (``--cuda``), a second part measures real host-to-device copies of 256x3x224x224 uint8
batches under a real GPU step: the epoch time with copies, against the same steps with no copies
(compute only), for the stock loader (``.cuda()`` in the loop) and for DataLoaderX (side stream).

    python benchmarks/bench_overlap.py                   # CPU part, JSON in benchmarks/results/
    python benchmarks/bench_overlap.py --cuda            # adds the GPU part
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from fastloader import DataLoaderX

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


class JpegDecode(Dataset[torch.Tensor]):
    """Every item decodes one in-memory JPEG (real CPU work, like an image dataset)."""

    def __init__(self, n: int, side: int = 320) -> None:
        rng = np.random.default_rng(0)
        # Smooth gradients plus mild noise: compresses and decodes like a photo more than pure noise.
        y, x = np.mgrid[0:side, 0:side]
        base = np.stack([(x + y) % 256, (x * 2) % 256, (y * 3) % 256], axis=-1).astype(np.int16)
        pixels = np.clip(base + rng.integers(-20, 20, base.shape), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        self.jpeg = buffer.getvalue()
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        image = Image.open(io.BytesIO(self.jpeg)).convert("RGB").resize((224, 224))
        return torch.from_numpy(np.array(image)).permute(2, 0, 1)


def run_epoch(loader: Iterable[Any], step: Callable[[Any], None]) -> dict[str, float]:
    """Epoch time and time spent waiting in next(), with ``step`` run on every batch."""
    waited = 0.0
    start = time.perf_counter()
    iterator = iter(loader)
    while True:
        asked = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            break
        waited += time.perf_counter() - asked
        step(batch)
    epoch = time.perf_counter() - start
    return {"epoch_s": epoch, "wait_s": waited, "wait_fraction": waited / epoch}


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def cpu_part(args: argparse.Namespace) -> list[dict[str, Any]]:
    dataset = JpegDecode(args.batches * args.batch_size)
    step_s = args.step_ms / 1000

    def step(batch: Any) -> None:
        time.sleep(step_s)  # a GPU step: the CPU waits, the GIL is free

    rows = []
    for workers in args.workers:
        kwargs = {"batch_size": args.batch_size, "num_workers": workers}
        loaders = {"torch DataLoader": DataLoader(dataset, **kwargs), "DataLoaderX": DataLoaderX(dataset, **kwargs)}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in loaders}
        for loader in loaders.values():  # warm-up: page cache, worker start-up code paths
            run_epoch(loader, lambda batch: None)
        for _ in range(args.repeats):  # A B A B
            for name, loader in loaders.items():
                runs[name].append(run_epoch(loader, step))
        stock, ours = median_of(runs["torch DataLoader"]), median_of(runs["DataLoaderX"])
        rows.append(
            {
                "num_workers": workers,
                "torch DataLoader": stock,
                "DataLoaderX": ours,
                "compute_only_epoch_s": args.batches * step_s,
                "epoch_time_ratio_stock_over_ours": stock["epoch_s"] / ours["epoch_s"],
            }
        )
    return rows


class PinnedBatches(Dataset[torch.Tensor]):
    """Whole uint8 batches already in pinned memory: the loader's only job is the copy."""

    def __init__(self, batches: int, shape: tuple[int, ...]) -> None:
        self.batches = batches
        self.pool = [torch.randint(0, 256, shape, dtype=torch.uint8).pin_memory() for _ in range(2)]

    def __len__(self) -> int:
        return self.batches

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.pool[i % 2]


def gpu_step_fn(step_ms: float, device: torch.device) -> Callable[[Any], None]:
    """A GPU step of about ``step_ms``: matmuls calibrated on this GPU, plus a read of the batch."""
    weights = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)

    def matmuls(count: int) -> None:
        x = weights
        for _ in range(count):
            x = (x @ weights).clamp_(-1, 1)

    matmuls(3)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    matmuls(50)
    torch.cuda.synchronize(device)
    count = max(1, round(step_ms / 1000 / ((time.perf_counter() - start) / 50)))

    def step(batch: Any) -> None:
        if batch is not None:
            batch.float().mean()  # the step reads the batch, so it must wait for the copy
        matmuls(count)

    return step


def gpu_part(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device("cuda", 0)
    shape = (256, 3, 224, 224)
    dataset = PinnedBatches(args.gpu_batches, shape)
    step = gpu_step_fn(args.gpu_step_ms, device)

    def synchronized(run: Callable[[], dict[str, float]]) -> dict[str, float]:
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        result = run()
        torch.cuda.synchronize(device)
        result["epoch_s"] = time.perf_counter() - start
        return result

    def compute_only() -> dict[str, float]:
        for _ in range(args.gpu_batches):
            step(None)
        return {}

    def stock() -> dict[str, float]:
        loader = DataLoader(dataset, batch_size=None)
        return run_epoch(loader, lambda batch: step(batch.to(device, non_blocking=True)))

    def ours() -> dict[str, float]:
        return run_epoch(DataLoaderX(dataset, batch_size=None, device=device, max_prefetch=2), step)

    parts: dict[str, Callable[[], dict[str, float]]] = {
        "compute only": compute_only,
        "torch DataLoader + .to(cuda)": stock,
        "DataLoaderX": ours,
    }
    for run in parts.values():
        synchronized(run)  # warm-up
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in parts}
    for _ in range(args.repeats):
        for name, run in parts.items():
            runs[name].append(synchronized(run))
    medians = {name: {"epoch_s": statistics.median(r["epoch_s"] for r in rs)} for name, rs in runs.items()}
    base = medians["compute only"]["epoch_s"]
    return {
        "device": torch.cuda.get_device_name(device),
        "batch": list(shape),
        "batches": args.gpu_batches,
        "step_ms": args.gpu_step_ms,
        "epochs": medians,
        "overhead_vs_compute_only": {name: m["epoch_s"] / base - 1 for name, m in medians.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--step-ms", type=float, default=60.0, help="simulated training step")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--repeats", type=int, default=2, help="A B rounds; medians are reported")
    parser.add_argument("--cuda", action="store_true", help="also measure real H2D copies on the GPU")
    parser.add_argument("--gpu-batches", type=int, default=100)
    parser.add_argument("--gpu-step-ms", type=float, default=15.0)
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/overlap_<part>.json)")
    args = parser.parse_args()

    result: dict[str, Any] = {
        "benchmark": "overlap",
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "processor": platform.processor(),
            "torch": torch.__version__,
        },
        "setup": {
            "batches": args.batches,
            "batch_size": args.batch_size,
            "step_ms": args.step_ms,
            "item": "decode a 320x320 JPEG + resize to 224 (PIL)",
        },
        "cpu": cpu_part(args),
    }
    if args.cuda:
        result["cuda"] = gpu_part(args)
    out = args.out or os.path.join(RESULTS, f"overlap_{'cuda' if args.cuda else 'cpu'}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as file:
        json.dump(result, file, indent=2)
    for row in result["cpu"]:
        stock, ours = row["torch DataLoader"], row["DataLoaderX"]
        print(
            f"num_workers={row['num_workers']}: epoch {stock['epoch_s']:.2f}s -> {ours['epoch_s']:.2f}s "
            f"(x{row['epoch_time_ratio_stock_over_ours']:.2f}); waiting {stock['wait_fraction']:.0%} -> "
            f"{ours['wait_fraction']:.0%} (compute only {row['compute_only_epoch_s']:.2f}s)"
        )
    if "cuda" in result:
        for name, overhead in result["cuda"]["overhead_vs_compute_only"].items():
            print(f"cuda {name}: {result['cuda']['epochs'][name]['epoch_s']:.3f}s ({overhead:+.1%} vs compute only)")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
