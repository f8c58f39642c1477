"""``worker_method="ray"`` against worker processes: images/s, the training process's CPU, the cost per batch.

A loopback Ray cluster of two raylets with one CPU each (``ray start --head`` and a second ``ray start``, as the
tests run it, ``tests/pack/ray_cluster.py``) and, on the same machine, DataLoaderX over
``fastloader.datasets.ImageFolder`` of ImageNet-like JPEGs (``fastloader.sample``) + RandomResizedCrop(224) +
RandomHorizontalFlip, uint8 batches. Four loaders, each warmed up by one epoch (actors placed, workers started:
``persistent_workers=True``), then measured epoch by epoch, A B A B: process mode with 1 and 2 workers, Ray
mode with 1 and 2 actors (one per raylet). Per epoch: images/s, and the training process's own CPU (its every
thread: the loop, the producer, Ray's client threads; not its worker processes or the actors) per 1,000 images.
Per batch: the stage clock's ``handoff`` (receiving the batch: ``ray.get``, or torch's unpickling), and the
object store's transfer of one batch from the second raylet's store, alone (MB/s on loopback). From these, the
model of docs/guide/ray-workers.md: how many images/s one training node can take at 10, 25 and 100 Gbit/s.

    python benchmarks/bench_ray_workers.py [--images 1000] [--batch-size 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastloader import DataLoaderX  # noqa: E402
from fastloader import transforms as T  # noqa: E402
from fastloader.datasets import ImageFolder  # noqa: E402
from fastloader.sample import make_sample_folder  # noqa: E402
from tests.pack.ray_cluster import ENV, RayCluster  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
IMAGE_BYTES = 3 * 224 * 224  # one uint8 image of the batch
LINKS_GBIT = (10, 25, 100)


def one_epoch(loader: DataLoaderX[Any]) -> dict[str, float]:
    cpu, start, seen = time.process_time(), time.perf_counter(), 0
    for images, _ in loader:
        seen += images.shape[0]
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"images_per_s": seen / wall, "cpu_ms_per_1000_images": 1e6 * cpu / seen, "images": seen}


def transfer(ray: Any, batch_size: int, repeats: int = 5) -> dict[str, float]:
    """One uint8 batch made on the second raylet (a task pinned away from this driver's node), fetched here."""
    head = ray.get_runtime_context().get_node_id()
    other = next(node["NodeID"] for node in ray.nodes() if node["Alive"] and node["NodeID"] != head)
    strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(other, soft=False)

    @ray.remote(num_cpus=1, scheduling_strategy=strategy)
    def make(size: int) -> Any:
        import numpy as np

        return np.full((size, 3, 224, 224), 7, dtype=np.uint8)

    times = []
    for _ in range(repeats):
        ref = make.remote(batch_size)
        ray.wait([ref], fetch_local=False)  # made and sealed over there
        start = time.perf_counter()
        ray.get(ref)
        times.append(time.perf_counter() - start)
        del ref
    seconds = statistics.median(times)
    return {"batch_ms": 1e3 * seconds, "mb_per_s": batch_size * IMAGE_BYTES / seconds / 1e6}


def model(cpu_ms_per_1000: float, handoff_ms: float, batch_size: int, in_flight: int) -> dict[str, Any]:
    """The training node's ceilings (images/s): the link, the training process's own CPU per image, the leases."""
    per_image_cpu_s = cpu_ms_per_1000 / 1e6
    rows = {}
    for gbit in LINKS_GBIT:
        link = gbit * 1e9 / 8 / IMAGE_BYTES
        rows[f"{gbit} Gbit/s"] = {"link_images_per_s": link, "one_core_images_per_s": 1 / per_image_cpu_s}
    return {
        "image_bytes": IMAGE_BYTES,
        "driver_cpu_ms_per_1000_images": cpu_ms_per_1000,
        "handoff_ms_per_batch": handoff_ms,
        "links": rows,
        "in_flight": in_flight,
        "leases_images_per_s_at_1s_per_batch": in_flight * batch_size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", default=str(ROOT / "data"))
    parser.add_argument("--out", default=str(RESULTS / "ray_workers.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.update(ENV)
    folder = make_sample_folder(Path(args.data) / f"sample-{args.images}", args.images)
    dataset = ImageFolder(folder, transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()]))
    import ray

    with tempfile.TemporaryDirectory() as cache:
        cluster = RayCluster.start(Path(cache))
        try:
            ray.init(address=cluster.address, log_to_driver=False)
            settings: dict[str, Any] = {"batch_size": args.batch_size, "shuffle": True, "persistent_workers": True}
            runs: dict[str, list[dict[str, float]]] = {}
            handoff: dict[str, float] = {}
            for n in (1, 2):
                # One Ray loader at a time: its actors hold the cluster's CPUs (two actors: one per raylet).
                loaders = {f"{mode}_{n}": DataLoaderX(dataset, num_workers=n, worker_method=mode, **settings)
                           for mode in ("process", "ray")}  # fmt: skip
                for name, loader in loaders.items():
                    one_epoch(loader)  # warm-up: the actors placed, the workers started, the page cache
                    runs[name] = []
                for _ in range(args.repeats):  # A B A B
                    for name, loader in loaders.items():
                        runs[name].append(one_epoch(loader))
                for name, loader in loaders.items():
                    handoff[name] = loader.stats()["stages"]["handoff"]["per_batch_ms"]["p50"]
                pool = loaders[f"ray_{n}"]._runtime.ray_pool
                assert pool is not None and len(pool.live()) == n and all(actor.ready for _, actor in pool.live())
                pool.stop()
                del loaders
            moved = transfer(ray, args.batch_size)
        finally:
            ray.shutdown()
            cluster.stop()
    medians = {
        name: {key: statistics.median(run[key] for run in rows) for key in ("images_per_s", "cpu_ms_per_1000_images")}
        for name, rows in runs.items()
    }
    result = {
        "benchmark": "worker_method='ray' against worker processes",
        "machine": {"cpus": len(os.sched_getaffinity(0))},
        "setup": {
            "dataset": "fastloader.datasets.ImageFolder, fastloader.sample JPEGs",
            "transform": "RandomResizedCrop(224) + RandomHorizontalFlip, uint8",
            "images": args.images,
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "cluster": "two raylets on loopback, one CPU each; the training process on the same machine",
        },
        "medians": medians,
        "ratios": {
            f"ray_{n}_over_process_{n}_images_per_s": medians[f"ray_{n}"]["images_per_s"]
            / medians[f"process_{n}"]["images_per_s"]
            for n in (1, 2)
        },
        "handoff_ms_per_batch_p50": handoff,
        "object_store_transfer_one_batch": moved,
        "model": model(medians["ray_2"]["cpu_ms_per_1000_images"], handoff["ray_2"], args.batch_size, 2 * 2),
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({key: result[key] for key in ("medians", "ratios", "handoff_ms_per_batch_p50")}, indent=2))


if __name__ == "__main__":
    main()
