"""``fastloader pack SRC s3://bucket/prefix``: tar shards packed locally, then uploaded, the manifest last.

1. The pack runs as ``--format tar`` into a local staging directory (``$FASTLOADER_CACHE/s3-pack/...``),
   resumable after a kill like any local pack.
2. Each shard is uploaded (multipart when large) with its index (``<shard>.fl-idx``: readers then need
   not fetch a shard to index it); a shard already there with the same size is not sent again, so a
   killed upload resumes where it stopped.
3. A marker (``fastloader-tar.progress.json``) goes first and the manifest last, then the marker is
   removed: while the marker is there without the manifest, readers refuse the prefix as an incomplete
   upload, so they never see a half-written dataset.

An LMDB is one local file that readers map into memory: it is not served from object storage. Pack
tar shards for S3 (this), or copy an LMDB to each machine's local disk.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastloader.formats.tar_manifest import MANIFEST_NAME, PROGRESS_NAME, TarPackState
from fastloader.formats.tar_shards import INDEX_SUFFIX, load_shard_index
from fastloader.remote.s3 import S3Store
from fastloader.remote.url import S3Url
from fastloader.storage import cache_dir

if TYPE_CHECKING:
    from fastloader.pack.engine import PackSummary


def staging_dir(url: S3Url) -> Path:
    return cache_dir() / "s3-pack" / f"{url.bucket}-{hashlib.sha1(str(url).encode()).hexdigest()[:16]}"


def upload_pack(directory: str | os.PathLike[str], url: S3Url, store: S3Store) -> dict[str, int]:
    """Upload a finished tar pack: shards and their indexes, then the manifest. Returns what was sent."""
    directory = Path(directory)
    state = TarPackState.read_manifest(directory)
    there = dict(store.list(url))
    marker = url.child(PROGRESS_NAME)
    store.put(marker, (directory / MANIFEST_NAME).read_bytes())  # readers: "an upload is under way"
    sent = {"shards": 0, "indexes": 0, "skipped": 0, "bytes": 0}
    for shard in state.shards:
        local = directory / shard.name
        index = load_shard_index(str(local), directory / f"{shard.name}{INDEX_SUFFIX}")
        for path, target, kind in ((local, url.child(shard.name), "shards"), (Path(index.path), None, "indexes")):
            target = target or url.child(f"{shard.name}{INDEX_SUFFIX}")
            size = path.stat().st_size
            if there.get(target.key) == size:
                sent["skipped"] += 1
                continue
            store.upload(str(path), target)
            sent[kind] += 1
            sent["bytes"] += size
    store.put(url.child(MANIFEST_NAME), (directory / MANIFEST_NAME).read_bytes())  # the commit point: last
    store.delete(marker)
    return sent


def pack_to_remote(
    src: Any, dst: str, *, endpoint_url: str | None = None, keep_staging: bool = False, **options: Any
) -> PackSummary:
    """Pack ``src`` as tar shards into ``dst`` (``s3://bucket/prefix``): see the module docstring."""
    from fastloader.pack.engine import pack

    url = S3Url.parse(dst)
    output = options.get("format", "tar")
    if output == "lmdb":
        raise ValueError(
            f"{dst}: an LMDB cannot be served from object storage (readers map it from a local disk):"
            " pack --format tar for S3, or copy the LMDB to local disk"
        )
    if output != "tar":
        raise ValueError(f"{dst}: packs to S3 are tar shards (--format tar); {output!r} packs go to a local disk")
    options["format"] = "tar"
    staging = staging_dir(url)
    staging.parent.mkdir(parents=True, exist_ok=True)
    summary = pack(src, staging, **options)
    store = S3Store(endpoint_url)
    upload_pack(staging, url, store)
    report = summary.report_path
    if report is not None:  # the skipped images' list goes beside the shards
        target = url.child(Path(report).name)
        store.upload(report, target)
        report = str(target)
    if not keep_staging:
        shutil.rmtree(staging, ignore_errors=True)
    return dataclasses.replace(summary, dst=dst, report_path=report)
