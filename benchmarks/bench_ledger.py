"""What the delivery ledger costs: the train pipeline over ImageFolder with and without ``ledger=``.

``DataLoaderX(ledger=PATH)`` adds, per image, a CRC32C of its encoded bytes in the worker that read them, and
per batch, in the training process, one block of 12 bytes a sample written with one ``os.write`` (and, the
first time an index is seen, its key). Two measurements, in one run:

* end to end: DataLoaderX over ``fastloader.datasets.ImageFolder`` of ImageNet-like JPEGs (``fastloader.sample``)
  + RandomResizedCrop(224) + RandomHorizontalFlip, ledger off / on, A B A B, medians and their ratio. On a
  shared machine the run-to-run spread is larger than the ledger, so also
* the parts alone: the ledger's work per image (the CRC of each file's bytes, the digest's travel) and per
  batch (the block written, keys seen already), timed in a loop, as a share of the pipeline's measured
  single-threaded time per image (read + decode + crop + resize): the ledger's share of loader CPU.

    python benchmarks/bench_ledger.py [--images 2000] [--workers N] [--batch-size 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from fastloader import DataLoaderX, read_digests
from fastloader import transforms as T
from fastloader.datasets import ImageFolder
from fastloader.loader.ledger_writer import EpochLedger, LedgerWriter
from fastloader.loader.worker_state import Delivery
from fastloader.sample import make_sample_folder

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def epoch_rate(dataset: Any, workers: int, batch_size: int, ledger: str | None) -> float:
    loader = DataLoaderX(dataset, batch_size=batch_size, shuffle=True, num_workers=workers, ledger=ledger)
    start, seen = time.perf_counter(), 0
    for images, _ in loader:
        seen += images.shape[0]
    return seen / (time.perf_counter() - start)


def per_call_us(function: Any, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        function()
    return (time.perf_counter() - start) / count * 1e6


def parts(dataset: Any, batch_size: int, scratch: str) -> dict[str, float]:
    """The ledger's own work, timed alone, against the pipeline's cost per image."""
    count = min(len(dataset), 200)
    blobs = [dataset.source.read(i) for i in range(count)]
    start = time.perf_counter()
    for index in range(count):
        dataset[index]
    image_us = (time.perf_counter() - start) / count * 1e6

    def digests_of_a_batch() -> None:  # the worker's side: CRC each read, ship the digests with the batch
        read_digests.begin(True)
        for index in range(batch_size):
            read_digests.record(index, blobs[index % count])
        pickle.loads(pickle.dumps(read_digests.take()))

    writer = LedgerWriter(os.path.join(scratch, "parts.ledger"), dataset)
    epoch = EpochLedger(writer, 0, 0)
    indices = list(range(batch_size))
    read_digests.begin(True)
    for index in indices:
        read_digests.record(index, blobs[index % count])
    digests, outcomes = read_digests.take()  # no outcomes: no sample failed (the case measured)
    delivery = Delivery(worker=0, task=0, batches=1, digests=digests, outcomes=outcomes)
    epoch.asked(0, indices)
    epoch.delivered(delivery)  # the keys written once: the steady state follows

    def record_a_batch() -> None:  # the training process's side
        epoch.asked(0, indices)
        epoch.delivered(delivery)

    worker_us = per_call_us(digests_of_a_batch, 200) / batch_size
    main_us = per_call_us(record_a_batch, 2000)
    writer.close()
    ledger_us = worker_us + main_us / batch_size
    return {
        "pipeline_us_per_image": image_us,
        "worker_us_per_image": worker_us,
        "main_process_us_per_batch": main_us,
        "ledger_us_per_image": ledger_us,
        "overhead_percent": 100 * ledger_us / image_us,
        "ledger_bytes_per_sample": os.path.getsize(writer.path) / (2001 * batch_size),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data", default=str(ROOT / "data"))
    parser.add_argument("--out", default=str(RESULTS / "ledger.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = make_sample_folder(Path(args.data) / f"sample-{args.images}", args.images)
    dataset = ImageFolder(folder, transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()]))
    with tempfile.TemporaryDirectory() as scratch:
        ledger = os.path.join(scratch, "run.ledger")
        epoch_rate(dataset, args.workers, args.batch_size, None)  # warm-up: page cache, workers' imports
        rates: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(args.repeats):  # A B A B
            rates["off"].append(epoch_rate(dataset, args.workers, args.batch_size, None))
            rates["on"].append(epoch_rate(dataset, args.workers, args.batch_size, ledger))
        recorded = os.path.getsize(ledger)
        alone = parts(dataset, args.batch_size, scratch)
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    result = {
        "benchmark": "ledger",
        "setup": {
            "dataset": "fastloader.datasets.ImageFolder, fastloader.sample JPEGs",
            "transform": "RandomResizedCrop(224) + RandomHorizontalFlip",
            "images": args.images,
            "workers": args.workers,
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "cores": len(os.sched_getaffinity(0)),
        },
        "end_to_end": {
            "images_per_s_ledger_off": off,
            "images_per_s_ledger_on": on,
            "ratio_on_over_off": on / off,
            "runs": rates,
            "spread_percent": 100 * (max(rates["off"]) - min(rates["off"])) / off,
            "ledger_bytes_per_sample": recorded / (args.images * args.repeats),
        },
        "parts": alone,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
