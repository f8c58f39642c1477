"""A cache of decoded images for fixed transforms: decode each image once, reuse it every epoch.

Evaluation transforms (``Resize(256)`` + ``CenterCrop(224)``) give the same pixels every epoch,
so decoding them again is wasted work. Turn the cache on with ``dataset.set_cache(path)`` (any
fastloader dataset) or ``ImageDataset(source, transform, cache=path)``. The fused part of the
transform must be fixed (no random crop or flip) and have a fixed output size; trailing user
transforms (``v2.ColorJitter``, ...) still run on every read.

One file holds it all, memory-mapped shared (``MAP_SHARED``) by every process::

    b"FLDCACHE" u32 header length, UTF-8 JSON header (CacheMeta)   first 4096 bytes
    records: 16 bytes each, [length]                              at 4096
        u64 the item's identity, u32 CRC32C of its pixels, u32 CRC32C of (index, identity, pixel CRC)
    pixels: uint8[length, height, width, 3]                       at the next 4096-byte boundary

The file is allocated at full size up front (``posix_fallocate``: a full disk is an error now,
not a SIGBUS in a worker later): ``length * height * width * 3`` bytes, 7.5 GB for ImageNet's
50k validation images at 224 — meant for evaluation sets, not 10M-image training sets.

What makes a cached image the one to serve, checked at every read:

* its record is whole: the record's own CRC32C matches (an all-zero record, a torn or stray one
  never does);
* the item's identity now is the one recorded (:func:`item_identities`): a source with a
  ``content_identity(index)`` method says what identifies the item's content (a folder or a file
  list: the file's size, mtime_ns, ctime_ns, inode and device, one ``stat``; an LMDB pack: the
  record's header, with its length and CRC32C), any other source the length and CRC32C of its
  encoded bytes (one read, no decode: tar shards, RecordIO, TFRecord, Parquet, ...). The identity
  is taken before the bytes are read for a decode, so an edit racing a decode leaves an identity
  older than the pixels (decoded again next time), never old pixels under a new identity;
* the CRC32C of the pixels copied out is the recorded one (about 6 µs per 224² image measured on a
  CPU with the CRC32C instruction, against hundreds for a decode): a bit flip on disk, pixels a crash
  never wrote (the file's pages reach the disk in any order) or a concurrent rewrite are caught.

An item failing a check is decoded again and stored again; a pixel CRC that fails is logged (the
cache file and the item), a changed identity is not (an edited image). Any process (a DataLoader
worker) that decodes item i writes its pixels, then its record, both with ``pwrite``; two workers
decoding the same item write the same bytes.

The header names the dataset length, what makes the pixels (the transform, ``FusedTransform.describe()``,
and the decoder, ``fastloader.image.decode.pixels_made_by``: the exact or fast decode, the JPEG
extension's libjpeg-turbo and resize pass order, PIL's version and libjpeg), the output size and a
fingerprint of the source (:func:`source_fingerprint`); a cache whose header differs is rebuilt empty.
The file's name holds the key of what makes the pixels (:func:`cache_file`): jobs with other transforms
or decoders on one ``set_cache`` path keep a file each, never rebuilding each other's. A disk without room
for the file is an error naming the file and the bytes it needs.

Not detected: an edit that keeps a file's size, inode, mtime_ns and ctime_ns (timestamps coarser
than the edits: a folder source does not trust, and so does not cache, a file modified within 2 s
of being read, see ``fastloader.datasets.folder_index.RACY_NS``); encoded bytes that change but keep
their length and CRC32C (1 in 2^32 by chance); pixels corrupted so that their CRC32C still matches
(as likely); an identity that a custom ``content_identity`` does not change when the content does.

Pixels are written with ``pwrite``, not through the mapping: storing into fresh pages of a shared
mapping faults each page in (and converts the file's preallocated extents page by page), 40-150 µs
per 224² image measured, against about 35 µs for the same bytes through ``pwrite``. The page cache
is one, so every process's mapping sees them.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import logging
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import crc32c
import numpy as np

from fastloader.errors import FormatError
from fastloader.storage import atomic_write, file_lock

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: per-item records (identity and pixel CRC32C) instead of a flag byte
MAGIC = b"FLDCACHE"
_HEADER_BYTES = 4096
_FINGERPRINT_SAMPLES = 16
RECORD = np.dtype([("identity", "<u8"), ("pixels_crc", "<u4"), ("check", "<u4")])
UNTRUSTED = 0  # an identity that cannot be told now: never served from the cache, never stored
_CHECKED = struct.Struct("<QQI")  # what a record's check covers: index, identity, pixel CRC
_LOGGED_MISMATCHES = 10  # pixel CRC failures logged per process; more are only decoded again


@dataclass(frozen=True)
class CacheMeta:
    """What a cache file holds; a file whose meta differs from the wanted one is rebuilt."""

    length: int
    height: int
    width: int
    transform: str
    fingerprint: str
    version: int = FORMAT_VERSION

    @property
    def pixels_offset(self) -> int:
        return -(-(_HEADER_BYTES + self.length * RECORD.itemsize) // _HEADER_BYTES) * _HEADER_BYTES

    @property
    def file_size(self) -> int:
        return self.pixels_offset + self.length * self.height * self.width * 3


def source_fingerprint(source: Any) -> str:
    """A digest of a source's type, length, and the keys, labels and bytes of 16 spread-out items.

    Cheap (16 reads) and catches a different or re-packed dataset at once (the cache is rebuilt
    empty); an item edited since is caught by its own identity when it is read (module docstring).
    """
    length = len(source)
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{type(source).__module__}.{type(source).__qualname__}:{length}".encode())
    for index in sorted({int(i) for i in np.linspace(0, length - 1, num=min(length, _FINGERPRINT_SAMPLES))}):
        try:
            data = source.read(index)
        except OSError as error:  # a file gone, a link confine=True refuses: the error policy's, when read
            digest.update(f"|{source.key(index)}|unreadable: {type(error).__name__}|".encode())
            continue
        digest.update(f"|{source.key(index)}|{source.label(index)}|{len(data)}|".encode())
        digest.update(hashlib.blake2b(data, digest_size=16).digest())
    return digest.hexdigest()


def item_identities(source: Any, indices: Sequence[int]) -> np.ndarray:
    """The identity of each item's content now (uint64; ``UNTRUSTED`` where it cannot be told).

    ``source.content_identity(index) -> bytes | None`` where the source has it (bytes that change
    whenever the item's content does; None: not to be trusted now), else the length and CRC32C of the
    item's encoded bytes. Take it before reading the bytes to decode (module docstring).
    """
    identify = getattr(source, "content_identity", None)
    identities = np.empty(len(indices), dtype=np.uint64)
    for slot, index in enumerate(indices):
        try:
            if identify is not None:
                token = identify(index)
            else:
                data = source.read(index)
                token = struct.pack("<QI", len(data), crc32c.crc32c(data))
        except Exception:  # a bad sample, whatever it raised: not cached; the decode's read raises it again,
            token = None  # where the error policy handles it
        identities[slot] = _digest(token)
    return identities


def _digest(token: bytes | None) -> int:
    if token is None:
        return UNTRUSTED
    value = int.from_bytes(hashlib.blake2b(token, digest_size=8).digest(), "little")
    return value if value != UNTRUSTED else 1  # a real identity is never taken for "untrusted"


def record_bytes(index: int, identity: int, pixels: np.ndarray) -> bytes:
    """The record that publishes item ``index``'s ``pixels`` under ``identity`` (module docstring)."""
    pixels_crc = crc32c.crc32c(np.ascontiguousarray(pixels).data)
    check = crc32c.crc32c(_CHECKED.pack(int(index), int(identity), pixels_crc))
    return struct.pack("<QII", int(identity), pixels_crc, check)


def _record_whole(index: int, identity: int, pixels_crc: int, check: int) -> bool:
    return identity != UNTRUSTED and check == crc32c.crc32c(_CHECKED.pack(index, identity, pixels_crc))


def _read_meta(path: str) -> CacheMeta | None:
    """The meta of the cache file at ``path``; None if it is missing or not a complete cache file."""
    try:
        with open(path, "rb") as file:
            return _meta_of(file)
    except FileNotFoundError:
        return None


def _meta_of(file: Any) -> CacheMeta | None:
    """The meta of the open cache ``file``; None if it is not a complete cache file."""
    head = os.pread(file.fileno(), _HEADER_BYTES, 0)
    size = os.fstat(file.fileno()).st_size
    if len(head) < len(MAGIC) + 4 or not head.startswith(MAGIC):
        return None
    (header_len,) = struct.unpack_from("<I", head, len(MAGIC))
    try:
        fields = json.loads(head[len(MAGIC) + 4 : len(MAGIC) + 4 + header_len])
        meta = CacheMeta(**fields)
    except (ValueError, TypeError):
        return None
    return meta if size == meta.file_size else None


def cache_file(path: str | os.PathLike[str], meta: CacheMeta) -> str:
    """The file at ``path`` for ``meta``'s pixels: ``path`` with the key of what makes them (the transform, its
    output size, the decoder: ``meta.transform``) before its extension, ``val.cache`` ->
    ``val.<16 hex digits>.cache``. Jobs with other transforms on one ``path`` each keep their own file; a
    changed dataset (its length, its fingerprint) rebuilds the file of its key."""
    path = os.fspath(path)
    text = f"{meta.version}|{meta.height}x{meta.width}|{meta.transform}".encode()
    key = hashlib.blake2b(text, digest_size=8).hexdigest()
    root, extension = os.path.splitext(path)
    if not extension or os.sep in extension:
        return f"{path}.{key}"
    return f"{root}.{key}{extension}"


def _create(path: str, meta: CacheMeta) -> None:
    """Write an empty cache file (every record zero: none whole) of full size, atomically."""
    header = json.dumps(dataclasses.asdict(meta), sort_keys=True).encode()
    if len(MAGIC) + 4 + len(header) > _HEADER_BYTES:
        raise ValueError(f"cache header too long ({len(header)} bytes): the transform description is too long")

    def write(file: Any) -> None:
        file.write(MAGIC + struct.pack("<I", len(header)) + header)
        file.flush()
        os.posix_fallocate(file.fileno(), 0, meta.file_size)  # zeros: no record whole

    try:
        atomic_write(path, write)
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # A bare "No space left on device" names neither the file nor what it needs.
        raise OSError(
            error.errno,
            f"{path}: no room for the decoded cache: it needs {meta.file_size:,} bytes ({meta.length} images of "
            f"{meta.height}x{meta.width}x3) on {os.path.dirname(os.path.abspath(path))}; free space, or give "
            "set_cache a path on a larger disk",
        ) from error


class DecodedCache:
    """The cache file at ``path`` for ``meta``, mapped lazily in each process (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], meta: CacheMeta) -> None:
        if meta.length < 1:
            raise ValueError("a decoded cache needs a dataset of at least one item")
        self.path = os.fspath(path)
        self.meta = meta
        self._pid: int | None = None
        self._records: np.ndarray | None = None
        self._pixels: np.ndarray | None = None
        self._file_id: tuple[int, int] | None = None  # (device, inode) of the file mapped
        self._mismatches = 0  # pixel CRC failures seen by this process

    @classmethod
    def open(cls, path: str | os.PathLike[str], meta: CacheMeta) -> DecodedCache:
        """Open the cache at ``path`` for ``meta`` (its file: :func:`cache_file`), (re)building it empty unless its
        header matches ``meta``."""
        path = cache_file(path, meta)
        with file_lock(path):  # concurrent ranks: one builds, the others find it built
            if _read_meta(path) != meta:
                _create(path, meta)
        return cls(path, meta)

    def _maps(self) -> tuple[np.ndarray, np.ndarray]:
        # Mapped once per process, after fork or spawn (a pickled cache carries only path and meta). Plain
        # ndarray views of the maps: np.memmap's own indexing runs Python for every item. Both read-only:
        # every write goes through pwrite (module docstring).
        if self._records is None or self._pixels is None or self._pid != os.getpid():
            meta = self.meta
            try:
                file = open(self.path, "rb")  # the header checked and the maps made from one open file
            except FileNotFoundError:
                raise self._replaced() from None
            with file:
                if _meta_of(file) != meta:
                    raise self._replaced()
                records = np.memmap(file, RECORD, "r", offset=_HEADER_BYTES, shape=(meta.length,))
                shape = (meta.length, meta.height, meta.width, 3)
                pixels = np.memmap(file, np.uint8, "r", offset=meta.pixels_offset, shape=shape)
                stat = os.fstat(file.fileno())
            self._records, self._pixels = records.view(np.ndarray), pixels.view(np.ndarray)
            self._file_id, self._pid = (stat.st_dev, stat.st_ino), os.getpid()
        return self._records, self._pixels

    def _replaced(self) -> FormatError:
        return FormatError(f"{self.path}: the decoded cache was rebuilt or removed by another run")

    def read_into(self, index: int, out: np.ndarray, identity: int) -> bool:
        """Copy item ``index`` into ``out`` (H×W×3) and return True if it is cached under ``identity``
        (:func:`item_identities`) and its pixels check; else False."""
        return bool(self.read_batch([index], out[np.newaxis], np.array([identity], dtype=np.uint64))[0])

    def read_batch(self, indices: Sequence[int], out: np.ndarray, identities: np.ndarray) -> np.ndarray:
        """Copy each cached item of ``indices`` into its ``out[i]`` (N×H×W×3): which were cached under their
        ``identities[i]`` with pixels that check (bool, N); the others' slots hold anything."""
        records, pixels = self._maps()
        rows = np.asarray(indices, dtype=np.int64)
        found = records[rows]  # a copy: each record read once, before its pixels (a writer writes it after them)
        cached = (found["identity"] == identities) & (identities != UNTRUSTED)
        crcs, checks = found["pixels_crc"].tolist(), found["check"].tolist()  # Python ints: no numpy scalar per item
        for slot in np.flatnonzero(cached).tolist():
            index = int(rows[slot])
            if not _record_whole(index, int(identities[slot]), crcs[slot], checks[slot]):
                cached[slot] = False
                continue
            out[slot] = pixels[index]
            served = np.ascontiguousarray(out[slot]).data  # what is served is what was checked
            if crc32c.crc32c(served) != crcs[slot]:
                cached[slot] = False
                self._mismatch(index)
        return cached

    def _mismatch(self, index: int) -> None:
        self._mismatches += 1
        if self._mismatches <= _LOGGED_MISMATCHES:
            log.warning(
                "%s: the cached pixels of item %d fail their CRC32C (a bit flip on disk, or pixels a crash"
                " never wrote); decoding it again",
                self.path,
                index,
            )

    def write(self, index: int, image: np.ndarray, identity: int) -> None:
        """Store item ``index`` under ``identity``: the pixels first, then the record that publishes them."""
        self.write_batch([index], image[np.newaxis], np.array([identity], dtype=np.uint64))

    def write_batch(self, indices: Sequence[int], images: np.ndarray, identities: np.ndarray) -> None:
        """Store items ``indices`` (``images[i]``, N×H×W×3) under ``identities[i]`` (those ``UNTRUSTED`` not at
        all): every image's pixels, then the records that publish them, all through ``pwrite``."""
        meta = self.meta
        if images.dtype != np.uint8 or images.shape != (len(indices), meta.height, meta.width, 3):
            wanted = f"{len(indices)} images of {meta.height}x{meta.width}x3 uint8"
            raise ValueError(f"{wanted} expected, got {images.dtype} {images.shape}")
        if len(identities) != len(indices):
            raise ValueError(f"{len(indices)} identities expected, got {len(identities)}")
        self._maps()
        kept = [slot for slot in range(len(indices)) if int(identities[slot]) != UNTRUSTED]
        if not kept:
            return
        image_bytes = meta.height * meta.width * 3
        try:
            descriptor = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise self._replaced() from None
        try:
            stat = os.fstat(descriptor)
            if (stat.st_dev, stat.st_ino) != self._file_id:  # the path now names another run's cache
                raise self._replaced()
            for slot in kept:
                pixels = np.ascontiguousarray(images[slot])
                _write_all(descriptor, pixels, meta.pixels_offset + int(indices[slot]) * image_bytes)
            for slot in kept:  # after every image: a record never goes ahead of its pixels in this process
                record = record_bytes(int(indices[slot]), int(identities[slot]), images[slot])
                _write_all(descriptor, record, _HEADER_BYTES + int(indices[slot]) * RECORD.itemsize)
        finally:
            os.close(descriptor)

    def filled(self) -> int:
        """How many items hold a whole record (their pixels are checked when read)."""
        records, _ = self._maps()
        rows = np.flatnonzero(records["identity"])
        found = zip(rows.tolist(), *(records[name][rows].tolist() for name in ("identity", "pixels_crc", "check")))
        return sum(_record_whole(*record) for record in found)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pid": None, "_records": None, "_pixels": None, "_file_id": None, "_mismatches": 0}


def _write_all(descriptor: int, data: Any, offset: int) -> None:
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):  # a regular file writes it all at once; a short write is not lost
        done += os.pwrite(descriptor, view[done:], offset + done)
