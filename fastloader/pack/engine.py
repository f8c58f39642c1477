"""``fastloader pack``: turn an image folder, file list, RecordIO, TFRecord, tar shards, Parquet files or a
fastloader LMDB into a fastloader LMDB (default), WebDataset-compatible tar shards or Parquet files::

    from fastloader.pack.engine import pack
    summary = pack("imagenet/train", "train.lmdb", resize_max_side=512, quality=90)
    print(summary.format_text())

Three engines, one door (:func:`pack`): the local engine (``fastloader.pack.local``: reader processes
on this machine, one writer, a sink that owns durability), a pack to ``s3://`` (``fastloader.pack.remote``:
the local engine into a staging directory, then an upload, the manifest last) and ``engine="ray"``
(``fastloader.pack.ray_engine``: the local engine's per-item code on a Ray cluster).

Resume: the options and digests of the source (kind, count, every item's name, size, mtime and
label) form the pack's fingerprint. Run again with the same arguments after a kill (even SIGKILL), a
pack continues where it stopped: 0 samples lost, 0 duplicated. A destination holding a pack with
another fingerprint is a clear error, never a silent mix.

Bad inputs never abort a pack: an item that cannot be read, is empty or does not decode is
skipped with its reason, counted in the summary (grouped by reason) and listed in
``<DST>.skipped.tsv``. Without re-encoding every image is still decoded once to prove it whole;
JPEGs at 1/8 scale in grayscale (libjpeg still parses the whole entropy-coded stream, so a
truncated or corrupt file fails, for a fraction of a full decode's cost).

Re-encoding (the FFCV trick: decode cost falls with pixel count): ``resize_max_side=N`` shrinks
images whose longer side exceeds N to exactly N (never upscaling); the others keep their original
bytes unless ``quality`` is given. Re-encoded images are RGB JPEGs at ``quality`` (default 90),
CMYK / grayscale / palette / RGBA converted to RGB as ``decode_pil`` does at read time. An image
re-encoded at its own size keeps its original bytes when the JPEG would not be smaller.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from fastloader.datasets.base import Source
from fastloader.pack.content_digest import write_records
from fastloader.pack.dest_lock import destination_lock
from fastloader.pack.lmdb_sink import DEFAULT_COMMIT_EVERY, DEFAULT_MAP_SIZE
from fastloader.pack.local import pack_local
from fastloader.pack.overlap import check_apart
from fastloader.pack.ray_engine import pack_on_ray  # imports Ray only when it runs
from fastloader.pack.remote import pack_to_remote, staging_dir
from fastloader.pack.summary import PackSummary
from fastloader.remote.url import S3Url, is_remote


def pack(
    src: str | os.PathLike[str] | Source,
    dst: str | os.PathLike[str],
    *,
    format: str | None = None,
    resize_max_side: int | None = None,
    quality: int | None = None,
    workers: int | None = None,
    progress: bool = True,
    src_format: str = "auto",
    root: str | None = None,
    confine: bool = False,
    shard_size: int = 10000,
    commit_every: int = DEFAULT_COMMIT_EVERY,
    map_size: int = DEFAULT_MAP_SIZE,
    engine: str = "local",
    ray_address: str | None = None,
    break_lock: bool = False,
) -> PackSummary:
    """Pack ``src`` (a path, or any :class:`~fastloader.datasets.Source`) into ``dst``, resuming a run cut short.

    ``format``: ``lmdb`` (default), ``tar`` or ``parquet`` (files of ``shard_size`` items); ``dst`` may be an
    ``s3://bucket/prefix`` (tar shards, uploaded: see ``fastloader.pack.remote``). ``workers``: reader processes
    (default: the usable cores; 0 reads in this process). ``src_format``: how to read a path (default:
    guessed, see ``fastloader.datasets.sources.detect_source_kind()``); ``root``: the base of a file list's
    relative paths, or of those of the images a Parquet file names by path. ``confine``: pack nothing from
    outside a folder's or a file list's root (a sample whose real path, symbolic links resolved, leaves it is
    skipped, listed with where it points; see ``fastloader.datasets.confine``); without it the summary counts
    the samples read from outside and names one. ``commit_every`` / ``map_size``:
    LMDB images per transaction / initial map size (it grows by itself). A progress bar goes to stderr when
    ``progress``.

    ``engine="ray"`` packs on a Ray cluster (``ray_address``: ``auto``, ``HOST:PORT``, or None for
    ``RAY_ADDRESS`` or a new local Ray) into tar shards (default) or Parquet files: see
    ``fastloader.pack.ray_engine``.

    One run at a time writes into ``dst``: a second is refused at once with
    :class:`~fastloader.errors.DestinationLocked` naming the holder (pid, host, since when); a lock left by
    a run that is gone is taken over, one of another host only with ``break_lock`` (see
    ``fastloader.pack.dest_lock``). A ``dst`` that is ``src``, is inside it or holds it is a ValueError.
    """
    dst = os.fspath(dst)
    if confine and isinstance(src, Source) and not getattr(src, "confine", False):
        raise ValueError("confine=True applies to a path: a Source given as an object is read as it was opened")
    check_apart(src, dst)
    # What every engine takes; each adds its own (LMDB's commit_every and map_size, Ray's address).
    common: dict[str, Any] = {
        "resize_max_side": resize_max_side,
        "quality": quality,
        "workers": workers,
        "progress": progress,
        "src_format": src_format,
        "root": root,
        "confine": confine,
        "shard_size": shard_size,
    }
    if engine not in ("local", "ray"):
        raise ValueError(f"engine must be local or ray, got {engine!r}")
    if engine == "local" and ray_address is not None:
        raise ValueError("--ray-address (ray_address=) is for --engine ray (engine='ray')")
    # The driver holds the lock, whatever the engine; an s3:// DST's is its staging directory's on this machine.
    with destination_lock(staging_dir(S3Url.parse(dst)) if is_remote(dst) else dst, break_lock=break_lock):
        if engine == "ray":
            summary = pack_on_ray(src, dst, format=format, ray_address=ray_address, **common)
        elif is_remote(dst):
            return pack_to_remote(src, dst, format=format or "tar", **common)
        else:
            summary = pack_local(src, dst, format=format, commit_every=commit_every, map_size=map_size, **common)
        if is_remote(dst):
            return summary
        # Read back from what was written, never from the records' own claims: the digest a user pins.
        return dataclasses.replace(summary, content_sha256=write_records(dst))
