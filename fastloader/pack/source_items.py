"""What a resumed pack must find unchanged in its source: every item's identity, not a sample of keys.

A pack killed after some shards and run again continues from its last durable shard: the items
before it are not read again. So the run must first know that each of them is the item that was
packed: the same key (for a folder, its path, so also its class), label, size, ``mtime_ns``,
``ctime_ns`` and inode. An image replaced under the same name or moved to another class would otherwise
keep its old bytes or label in the pack. The size and mtime alone miss a replacement of the same size
whose mtime was put back (``cp -p``, ``rsync -t``, ``os.utime``): the ctime cannot be set back (any
write or metadata change moves it) and a file written beside and renamed over has another inode, as the
decoded cache's identity knows. So a ``chmod``, ``chown`` or hard link of a packed file (its ctime moves)
refuses a resume too: on the safe side.

Each item's identity is an 8-byte digest (:func:`item_digests`), in one numpy array: O(1) memory per
item (80 MB at 10M items). Sizes, times and inodes come from a ``stat`` of each file for sources that read
one file per item (a folder, a file list: threads stat them, about a minute per 10M files on a local
disk); for a container source (LMDB, RecordIO, TFRecord, tar, Parquet) each item's key and label,
and the size, times and inode of the container's files. The pack's fingerprint records the SHA-256 of the
array (``items_sha256``), of its container files (``files_sha256``) and of its class names
(``classes_sha256``, which ``verify`` also checks the manifest against), so any change refuses the
resume. To name the first changed item, the array itself is kept beside the destination,
``<DST>.fl-items`` (:func:`check_unchanged`, :func:`record`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from fastloader.datasets.base import Source
from fastloader.errors import FormatError
from fastloader.formats.pack_state import classes_digest
from fastloader.storage import atomic_write_bytes

ITEMS_SUFFIX = ".fl-items"
_CHUNK = 4096  # items a thread digests at a time
_STAT_THREADS = 8  # stat() waits on the filesystem (a network one above all), not on the GIL


def items_path(dst: str | os.PathLike[str]) -> str:
    """Where the item digests of a pack into ``dst`` are kept: ``<DST>.fl-items``, beside the output."""
    return os.fspath(dst).rstrip(os.sep) + ITEMS_SUFFIX


def _digest(key: str, stat: tuple[int, int, int, int], label: int) -> int:
    size, mtime_ns, ctime_ns, inode = stat
    text = f"{key}\0{size}\0{mtime_ns}\0{ctime_ns}\0{inode}\0{label}".encode("utf-8", "surrogateescape")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def _chunk_digests(source: Source, start: int, stop: int, labels: np.ndarray | None) -> np.ndarray:
    path = getattr(source, "path", None)
    out = np.empty(stop - start, dtype=np.uint64)
    for i in range(start, stop):
        identity = (-1, -1, -1, -1)
        if callable(path):  # one file per item: its size, times and inode
            try:
                identity = _file_identity(os.stat(path(i)))
            except OSError:
                pass  # a missing file has an identity too (the reader will skip it)
        label = int(labels[i]) if labels is not None else int(source.label(i))
        out[i - start] = _digest(source.key(i), identity, label)
    return out


def _file_identity(stat: os.stat_result) -> tuple[int, int, int, int]:
    """What tells a file's content changed without reading it: size, mtime_ns, and ctime_ns and inode (a
    replacement of the same size with its mtime put back moves its ctime; one renamed over has another inode)."""
    return stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino


def item_digests(source: Source) -> np.ndarray:
    """One uint64 digest of (key, size, mtime_ns, ctime_ns, inode, label) per item of ``source``, in source order."""
    labels_of = getattr(source, "labels", None)
    labels = np.asarray(labels_of()) if callable(labels_of) else None
    total = len(source)
    starts = range(0, total, _CHUNK)

    def chunk(start: int) -> np.ndarray:
        return _chunk_digests(source, start, min(start + _CHUNK, total), labels)

    if not callable(getattr(source, "path", None)):  # nothing to stat; and an LMDB is opened once per process
        chunks = [chunk(start) for start in starts]
    else:
        with ThreadPoolExecutor(_STAT_THREADS) as pool:  # the files' stat calls wait on the filesystem
            chunks = list(pool.map(chunk, starts))
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint64)


def _container_files(source: Source) -> list[str]:
    """The files a container source reads its items from (their size and mtime stand for its items')."""
    files: list[str] = []
    for name in ("shards", "paths"):
        value = getattr(source, name, None)
        if isinstance(value, (list, tuple)):
            files += [os.fspath(path) for path in value if isinstance(path, (str, os.PathLike))]
    for name in ("rec_path", "idx_path"):
        value = getattr(source, name, None)
        if isinstance(value, str):
            files.append(value)
    path = getattr(source, "path", None)
    if isinstance(path, str):  # an LMDB: a directory or a file
        files.append(os.path.join(path, "data.mdb") if os.path.isdir(path) else path)
    return [file for file in files if "://" not in file]


def _files_digest(files: list[str]) -> str:
    stats = []
    for file in files:
        try:
            stat = os.stat(file)
            stats.append([os.path.abspath(file), *_file_identity(stat)])
        except OSError:
            stats.append([os.path.abspath(file), None, None, None, None])
    return hashlib.sha256(json.dumps(stats).encode("utf-8", "surrogateescape")).hexdigest()


def identity(source: Source, digests: np.ndarray) -> dict[str, Any]:
    """The fingerprint entries of ``source`` that stand for every item (see the module docstring)."""
    found: dict[str, Any] = {"items_sha256": hashlib.sha256(digests.tobytes()).hexdigest()}
    files = _container_files(source)
    if files:
        found["files_sha256"] = _files_digest(files)
    found["classes_sha256"] = classes_digest(getattr(source, "classes", None))
    return found


def check_unchanged(dst: str, source: Source, digests: np.ndarray) -> None:
    """FormatError naming the first item of ``source`` that differs from the one the pack in ``dst`` began with.

    Nothing to check for a new destination, or one packed before the digests were kept (the
    fingerprint still refuses any change there, without naming the item).
    """
    recorded_path = items_path(dst)
    if not os.path.exists(dst) or not os.path.exists(recorded_path):
        return
    try:
        recorded = np.load(recorded_path, allow_pickle=False, mmap_mode="r")
    except (OSError, ValueError) as error:
        raise FormatError(f"{recorded_path}: unreadable ({error}); delete it and {dst} to pack again") from None
    common = min(len(recorded), len(digests))
    changed = np.flatnonzero(np.asarray(recorded[:common]) != digests[:common])
    remedy = f"delete {dst} and {recorded_path} to pack again from the start"
    if len(changed):
        first = int(changed[0])
        raise FormatError(
            f"{dst}: source item {first} ({source.key(first)}) changed since this pack began (its name, size, mtime, "
            f"ctime, inode or label differ: replaced, rewritten, moved or its metadata changed; {len(changed)} "
            f"item(s) changed in all): the pack may hold its old bytes or label, so it "
            f"cannot resume; {remedy}"
        )
    if len(recorded) != len(digests):
        raise FormatError(
            f"{dst}: the source now holds {len(digests)} items, the pack began with {len(recorded)}: it cannot "
            f"resume; {remedy}"
        )


def record(dst: str, digests: np.ndarray) -> None:
    """Keep ``digests`` beside ``dst`` (atomically), for a resumed run's :func:`check_unchanged`."""
    buffer = io.BytesIO()
    np.save(buffer, digests, allow_pickle=False)
    path = Path(items_path(dst))
    if path.exists() and path.read_bytes() == buffer.getvalue():
        return
    atomic_write_bytes(path, buffer.getvalue())
