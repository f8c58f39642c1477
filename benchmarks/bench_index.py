"""Index at scale: build and load a 10M-entry folder index, and what workers touching it cost in RAM.

Three parts, compared in one run:

1. Scan: our threaded scan (``FolderSource(..., rebuild=True)``) against torchvision's
   ``make_dataset`` on a small real tree of empty ``.JPEG`` files (median of a few runs, warm cache).
2. Build and load at N entries over 1000 classes, without N files: per-class scan results are
   synthesized (names like ``n01440764/n01440764_10026.JPEG``, real empty class directories) and fed
   to ``assemble_folder_arrays`` + ``write_index``, the code path a real scan takes after listing.
   Load = constructing ``FolderSource`` from the persisted index (mmap + re-stat of every class
   directory); goal < 2 s. Warm page cache (dropping caches would disturb the shared machine).
3. Memory: ``--workers`` forked processes each touch every entry (path and label); each reports
   the growth of its own private memory (Private_Clean + Private_Dirty from
   ``/proc/self/smaps_rollup``, i.e. USS) from just after the fork to after the loop. Ours: the
   source over the index (the parent has the index pages mapped, so they count as shared page
   cache). torchvision's representation: a Python list of ``(str, int)`` tuples in the parent.

    python benchmarks/bench_index.py                      # 10M entries, 4 workers
    python benchmarks/bench_index.py --entries 2000000    # if 10M tuples do not fit in memory
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from fastloader.datasets.folder import FolderSource
from fastloader.datasets.folder_index import (
    FOLDER_KIND,
    FORMAT_VERSION,
    ClassScan,
    IndexMeta,
    assemble_folder_arrays,
    filter_settings,
)
from fastloader.formats.index_file import read_index, write_index

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
MB = 1 << 20


def private_bytes() -> dict[str, int]:
    """This process's USS, Private_Dirty and Anonymous memory, in bytes."""
    fields = {}
    with open("/proc/self/smaps_rollup", encoding="ascii") as rollup:
        for line in rollup:
            parts = line.split()
            if parts[0] in ("Private_Clean:", "Private_Dirty:", "Anonymous:"):
                fields[parts[0][:-1]] = int(parts[1]) * 1024
    uss = fields["Private_Clean"] + fields["Private_Dirty"]
    return {"uss": uss, "dirty": fields["Private_Dirty"], "anon": fields["Anonymous"]}


def class_names(count: int) -> list[str]:
    return [f"n{1440764 + 1000 * c:08d}" for c in range(count)]


def aged_class_dirs(root: str, classes: list[str]) -> None:
    past = time.time() - 3600  # written long before the index, as real data is
    for name in classes:
        os.makedirs(os.path.join(root, name), exist_ok=True)
        os.utime(os.path.join(root, name), (past, past))
    os.utime(root, (past, past))


def synthesize_scans(root: str, classes: list[str], entries: int) -> list[ClassScan]:
    """What scanning a tree of ``entries`` files would yield, spread evenly over ``classes``."""
    scans = []
    per_class = np.diff(np.linspace(0, entries, len(classes) + 1).astype(np.int64))
    for name, count in zip(classes, per_class.tolist()):
        keys = [f"{name}/{name}_{10000 + j}.JPEG".encode() for j in range(count)]
        directory = os.path.join(root, name)
        mtime = os.stat(directory).st_mtime_ns
        lengths = np.fromiter(map(len, keys), np.int64, len(keys))
        scans.append(ClassScan(b"".join(keys), lengths, [directory], [mtime]))
    return scans


def bench_build_and_load(root: str, index_path: str, entries: int, classes: int) -> dict[str, Any]:
    names = class_names(classes)
    aged_class_dirs(root, names)
    started = time.perf_counter()
    scans = synthesize_scans(root, names, entries)
    synthesized = time.perf_counter() - started
    meta = IndexMeta(os.path.realpath(root), filter_settings(None), tuple(names), time.time_ns(), uuid.uuid4().hex)
    started = time.perf_counter()
    arrays = assemble_folder_arrays(os.path.abspath(root), os.stat(root).st_mtime_ns, scans)
    write_index(index_path, FOLDER_KIND, FORMAT_VERSION, dataclasses.asdict(meta), arrays)
    built = time.perf_counter() - started
    del scans, arrays
    read_times, load_times = [], []
    for _ in range(5):
        started = time.perf_counter()
        read_index(index_path, FOLDER_KIND, FORMAT_VERSION)
        read_times.append(time.perf_counter() - started)
        started = time.perf_counter()
        source = FolderSource(root, index_path=index_path)
        load_times.append(time.perf_counter() - started)
    if len(source) != entries or IndexMeta.of(read_index(index_path, FOLDER_KIND, FORMAT_VERSION)) != meta:
        raise RuntimeError("the synthetic index was not reused as built")
    return {
        "synthesize_scan_results_s": round(synthesized, 3),
        "build_s": round(built, 3),
        "index_bytes": os.path.getsize(index_path),
        "read_index_s_median": round(statistics.median(read_times), 4),
        "load_source_s_median": round(statistics.median(load_times), 4),
        "load_goal_s": 2.0,
        "load_goal_met": statistics.median(load_times) < 2.0,
    }


def touch_source(source: FolderSource, conn: Connection) -> None:
    before = private_bytes()
    total = 0
    for i in range(len(source)):
        total += len(source.path(i)) + source.label(i)
    after = private_bytes()
    conn.send({"uss": after["uss"] - before["uss"], "dirty": after["dirty"] - before["dirty"], "check": total})


def touch_tuples(samples: list[tuple[str, int]], conn: Connection) -> None:
    before = private_bytes()
    total = 0
    for path, label in samples:
        total += len(path) + label
    after = private_bytes()
    conn.send({"uss": after["uss"] - before["uss"], "dirty": after["dirty"] - before["dirty"], "check": total})


def in_forked_workers(target: Callable[[Any, Connection], None], payload: Any, workers: int) -> dict[str, Any]:
    """Fork ``workers`` processes running ``target(payload, conn)`` at once; their memory growth in MB."""
    context = multiprocessing.get_context("fork")
    pipes = [context.Pipe(duplex=False) for _ in range(workers)]
    processes = [context.Process(target=target, args=(payload, send)) for _, send in pipes]
    started = time.perf_counter()
    for process in processes:
        process.start()
    reports = [receive.recv() for receive, _ in pipes]
    for process in processes:
        process.join()
    if len({report["check"] for report in reports}) != 1:
        raise RuntimeError("workers disagree on what they read")
    uss = [report["uss"] / MB for report in reports]
    return {
        "worker_uss_increase_mb": [round(value, 1) for value in uss],
        "worker_private_dirty_increase_mb": [round(report["dirty"] / MB, 1) for report in reports],
        "total_uss_increase_mb": round(sum(uss), 1),
        "touch_wall_s": round(time.perf_counter() - started, 1),
    }


def bench_memory(root: str, index_path: str, workers: int) -> dict[str, Any]:
    """Workers touching every entry: our source over the index, then torchvision's tuple list.

    The parent's cost is its growth in anonymous memory (heap): index pages are page cache,
    shared by every process that maps them and reclaimable, and are reported as ``index_bytes``.
    """
    before = private_bytes()
    source = FolderSource(root, index_path=index_path)
    # Map every index page in the parent (as a parent that used the dataset has), so the workers'
    # mappings of the same page cache count as shared, not private, whoever touched them first.
    index = read_index(index_path, FOLDER_KIND, FORMAT_VERSION)
    checksum = sum(int(np.asarray(array).view(np.uint8).sum()) for array in index.arrays.values())
    ours: dict[str, Any] = {"parent_anonymous_increase_mb": round((private_bytes()["anon"] - before["anon"]) / MB, 1)}
    ours |= in_forked_workers(touch_source, source, workers)
    ours["index_checksum"] = checksum

    # torchvision's samples: one (str, int) tuple per file, the int shared per class (as its
    # class_to_idx values are). Built from our index, vectorised: how it is made does not matter.
    keys = index.arrays["keys"].tobytes()
    offsets = index.arrays["key_offsets"].tolist()
    labels = index.arrays["labels"].tolist()
    class_ints = list(range(len(source.classes)))
    prefix = source.root + os.sep
    before = private_bytes()
    started = time.perf_counter()
    samples = [
        (prefix + keys[offsets[i] : offsets[i + 1]].decode(), class_ints[label]) for i, label in enumerate(labels)
    ]
    theirs: dict[str, Any] = {
        "build_list_s": round(time.perf_counter() - started, 1),
        "parent_anonymous_increase_mb": round((private_bytes()["anon"] - before["anon"]) / MB, 1),
    }
    del keys, offsets, labels, index
    theirs |= in_forked_workers(touch_tuples, samples, workers)
    return {"fastloader_index": ours, "torchvision_tuples": theirs}


def bench_scan(root: str, files: int, classes: int, repeats: int = 3) -> dict[str, Any]:
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

    names = class_names(classes)
    for c, name in enumerate(names):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for j in range(c, files, classes):
            open(os.path.join(root, name, f"{name}_{j}.JPEG"), "wb").close()
    ours, theirs = [], []
    for _ in range(repeats):  # A B A B
        started = time.perf_counter()
        count = len(FolderSource(root, rebuild=True, index_path=os.path.join(root + ".idx")))
        ours.append(time.perf_counter() - started)
        started = time.perf_counter()
        samples = make_dataset(root, find_classes(root)[1], extensions=IMG_EXTENSIONS)
        theirs.append(time.perf_counter() - started)
    if not count == len(samples) == files:
        raise RuntimeError(f"scans disagree: {count} vs {len(samples)} of {files} files")
    return {
        "files": files,
        "classes": classes,
        "fastloader_scan_and_write_s_median": round(statistics.median(ours), 4),
        "torchvision_make_dataset_s_median": round(statistics.median(theirs), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=10_000_000)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--scan-files", type=int, default=20_000, help="files in the real tree the scan is timed on")
    parser.add_argument("--dir", default=None, help="where to put the temporary tree and index (default: $TMPDIR)")
    parser.add_argument("--out", default=os.path.join(RESULTS, "index.json"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench_index-") as work:
        scan = bench_scan(os.path.join(work, "scan"), args.scan_files, min(args.classes, 100))
        root, index_path = os.path.join(work, "train"), os.path.join(work, "train.fastloader-index")
        build = bench_build_and_load(root, index_path, args.entries, args.classes)
        memory = bench_memory(root, index_path, args.workers)
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        total_gb = int(meminfo.readline().split()[1]) / (1 << 20)
    result = {
        "benchmark": "index",
        "machine": {"cpus": os.cpu_count(), "memory_gb": round(total_gb, 1)},
        "entries": args.entries,
        "classes": args.classes,
        "workers": args.workers,
        "scan": scan,
        "build_and_load": build,
        "memory": memory,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump(result, out, indent=2)
        out.write("\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
