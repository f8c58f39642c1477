"""Random-order read throughput of raw (encoded) image bytes: each packed format against single files.

The sample folder (ImageNet-like JPEGs from real photographs) is written once as individual files,
a fastloader LMDB, WebDataset tar shards, an MXNet RecordIO and TFRecord shards; then each source
reads every item's bytes in the same random order, A B A B, in one process. Reported: items/s and
MB/s (medians), and the ratio to individual files.

The page cache is warm (this benchmark cannot drop it without privileges): the figures compare the
per-item overhead of each format (open/close and path lookups against one pread or one B-tree get),
not disk seeks. On a network filesystem with a cold cache the gap to individual files is larger.

    python benchmarks/bench_read.py [--images 2000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fastloader.datasets import FolderSource, LMDBSource, RecordIOSource, Source, TarShardSource, TFRecordSource
from fastloader.formats.protobuf import bytes_feature, encode_example, int64_feature
from fastloader.formats.recordio import RecordIOWriter, single_label
from fastloader.formats.recordio import pack as pack_record
from fastloader.formats.tfrecord import TFRecordWriter
from fastloader.pack import pack
from fastloader.sample import make_sample_folder

RESULTS = Path(__file__).resolve().parent / "results"


class FileReads:
    """The baseline: open, read and close one file per item (what ImageFolder does)."""

    def __init__(self, folder: FolderSource) -> None:
        self.paths = [folder.path(i) for i in range(len(folder))]

    def __len__(self) -> int:
        return len(self.paths)

    def read(self, index: int) -> bytes:
        with open(self.paths[index], "rb") as file:
            return file.read()


def write_recordio(folder: FolderSource, rec: Path) -> None:
    writer = RecordIOWriter(rec, rec.with_suffix(".idx"))
    for i in range(len(folder)):
        writer.write(i, pack_record(single_label(folder.label(i), i), folder.read(i)))
    writer.close()


def write_tfrecords(folder: FolderSource, out: Path, shards: int = 4) -> str:
    per_shard = -(-len(folder) // shards)
    for shard in range(shards):
        writer = TFRecordWriter(out / f"train-{shard:05d}.tfrecord")
        for i in range(shard * per_shard, min(len(folder), (shard + 1) * per_shard)):
            features = {
                "image/encoded": bytes_feature(folder.read(i)),
                "image/class/label": int64_feature(folder.label(i)),
            }
            writer.write(encode_example(features))
        writer.close()
    return str(out / "train-*.tfrecord")


def build_sources(work: Path, images: int) -> dict[str, Any]:
    folder = FolderSource(make_sample_folder(work / "folder", images))
    pack(folder.root, work / "train.lmdb", progress=False)
    pack(folder.root, work / "tar", format="tar", shard_size=500, progress=False)
    write_recordio(folder, work / "train.rec")
    pattern = write_tfrecords(folder, work)
    return {
        "files": FileReads(folder),
        "lmdb": LMDBSource(work / "train.lmdb"),
        "tar": TarShardSource(str(work / "tar")),
        "recordio": RecordIOSource(work / "train.rec", work / "train.idx"),
        "tfrecord": TFRecordSource(pattern),
    }


def read_all(source: Source | FileReads, order: np.ndarray) -> tuple[float, int]:
    start = time.perf_counter()
    total = 0
    for index in order:
        total += len(source.read(int(index)))
    return time.perf_counter() - start, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS / "read.json"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="fastloader-bench-read-") as tmp:
        sources = build_sources(Path(tmp), args.images)
        order = np.random.default_rng(0).permutation(args.images)
        for source in sources.values():
            read_all(source, order)  # warm-up: page cache, lazily opened handles and indexes
        runs: dict[str, list[tuple[float, int]]] = {name: [] for name in sources}
        for _ in range(args.repeats):  # A B A B
            for name, source in sources.items():
                runs[name].append(read_all(source, order))

    rows = {}
    for name, measured in runs.items():
        seconds = statistics.median(elapsed for elapsed, _ in measured)
        rows[name] = {"items_per_s": args.images / seconds, "mb_per_s": measured[0][1] / seconds / 1e6}
    for row in rows.values():
        row["ratio_to_files"] = row["items_per_s"] / rows["files"]["items_per_s"]
    result = {
        "benchmark": "random-order raw reads",
        "machine": {"cpus": len(os.sched_getaffinity(0)), "processor": platform.processor()},
        "data": f"{args.images} ImageNet-like JPEGs (fastloader.sample), warm page cache, one process",
        "repeats": args.repeats,
        "formats": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    for name, row in rows.items():
        print(f"{name:<9} {row['items_per_s']:9.0f} items/s {row['mb_per_s']:8.1f} MB/s  x{row['ratio_to_files']:.2f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
