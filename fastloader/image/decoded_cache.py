"""A cache of decoded images for fixed transforms: decode each image once, reuse it every epoch.

Evaluation transforms (``Resize(256)`` + ``CenterCrop(224)``) give the same pixels every epoch,
so decoding them again is wasted work. Turn the cache on with ``dataset.set_cache(path)`` (any
fastloader dataset) or ``ImageDataset(source, transform, cache=path)``. The fused part of the
transform must be fixed (no random crop or flip) and have a fixed output size; trailing user
transforms (``v2.ColorJitter``, ...) still run on every read.

One file holds it all, memory-mapped shared (``MAP_SHARED``) by every process::

    b"FLDCACHE" u32 header length, UTF-8 JSON header (CacheMeta)   first 4096 bytes
    filled flags: uint8[length]                                   at 4096
    pixels: uint8[length, height, width, 3]                       at the next 4096-byte boundary

The file is allocated at full size up front (``posix_fallocate``: a full disk is an error now,
not a SIGBUS in a worker later): ``length * height * width * 3`` bytes, 7.5 GB for ImageNet's
50k validation images at 224 — meant for evaluation sets, not 10M-image training sets. Any
process (a DataLoader worker) that decodes item i writes its pixels, then its flag; readers
check the flag first. Two workers decoding the same item write the same bytes.

The header names the dataset length, the transform (``FusedTransform.describe()``), the output
size and a fingerprint of the source (:func:`source_fingerprint`); a cache whose header differs is
rebuilt empty. Delete the file to force a rebuild after editing images in place.

Pixels are written with ``pwrite``, not through the mapping: storing into fresh pages of a shared
mapping faults each page in (and converts the file's preallocated extents page by page), 40-150 µs
per 224² image measured, against about 35 µs for the same bytes through ``pwrite``. The page cache
is one, so every process's mapping sees them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastloader.errors import FormatError
from fastloader.storage import atomic_write, file_lock

FORMAT_VERSION = 1
MAGIC = b"FLDCACHE"
_HEADER_BYTES = 4096
_FINGERPRINT_SAMPLES = 16


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
        return -(-(_HEADER_BYTES + self.length) // _HEADER_BYTES) * _HEADER_BYTES

    @property
    def file_size(self) -> int:
        return self.pixels_offset + self.length * self.height * self.width * 3


def source_fingerprint(source: Any) -> str:
    """A digest of a source's type, length, and the keys, labels and bytes of 16 spread-out items.

    Cheap (16 reads) and catches a different or re-packed dataset; an image edited in place
    without changing those 16 items is not noticed (delete the cache file then).
    """
    length = len(source)
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{type(source).__module__}.{type(source).__qualname__}:{length}".encode())
    for index in sorted({int(i) for i in np.linspace(0, length - 1, num=min(length, _FINGERPRINT_SAMPLES))}):
        data = source.read(index)
        digest.update(f"|{source.key(index)}|{source.label(index)}|{len(data)}|".encode())
        digest.update(hashlib.blake2b(data, digest_size=16).digest())
    return digest.hexdigest()


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


def _create(path: str, meta: CacheMeta) -> None:
    """Write an empty cache file (all flags clear) of full size, atomically."""
    header = json.dumps(dataclasses.asdict(meta), sort_keys=True).encode()
    if len(MAGIC) + 4 + len(header) > _HEADER_BYTES:
        raise ValueError(f"cache header too long ({len(header)} bytes): the transform description is too long")

    def write(file: Any) -> None:
        file.write(MAGIC + struct.pack("<I", len(header)) + header)
        file.flush()
        os.posix_fallocate(file.fileno(), 0, meta.file_size)  # zeros: every flag clear

    atomic_write(path, write)


class DecodedCache:
    """The cache file at ``path`` for ``meta``, mapped lazily in each process (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], meta: CacheMeta) -> None:
        if meta.length < 1:
            raise ValueError("a decoded cache needs a dataset of at least one item")
        self.path = os.fspath(path)
        self.meta = meta
        self._pid: int | None = None
        self._flags: np.ndarray | None = None
        self._pixels: np.ndarray | None = None
        self._file_id: tuple[int, int] | None = None  # (device, inode) of the file mapped

    @classmethod
    def open(cls, path: str | os.PathLike[str], meta: CacheMeta) -> DecodedCache:
        """Open the cache at ``path``, (re)building it empty unless its header matches ``meta``."""
        path = os.fspath(path)
        with file_lock(path):  # concurrent ranks: one builds, the others find it built
            if _read_meta(path) != meta:
                _create(path, meta)
        return cls(path, meta)

    def _maps(self) -> tuple[np.ndarray, np.ndarray]:
        # Mapped once per process, after fork or spawn (a pickled cache carries only path and meta). Plain
        # ndarray views of the maps: np.memmap's own indexing runs Python for every item.
        if self._flags is None or self._pixels is None or self._pid != os.getpid():
            meta = self.meta
            try:
                file = open(self.path, "r+b")  # the header checked and the maps made from one open file
            except FileNotFoundError:
                raise self._replaced() from None
            with file:
                if _meta_of(file) != meta:
                    raise self._replaced()
                flags = np.memmap(file, np.uint8, "r+", offset=_HEADER_BYTES, shape=(meta.length,))
                shape = (meta.length, meta.height, meta.width, 3)
                pixels = np.memmap(file, np.uint8, "r", offset=meta.pixels_offset, shape=shape)
                stat = os.fstat(file.fileno())
            self._flags, self._pixels = flags.view(np.ndarray), pixels.view(np.ndarray)
            self._file_id, self._pid = (stat.st_dev, stat.st_ino), os.getpid()
        return self._flags, self._pixels

    def _replaced(self) -> FormatError:
        return FormatError(f"{self.path}: the decoded cache was rebuilt or removed by another run")

    def read_into(self, index: int, out: np.ndarray) -> bool:
        """Copy item ``index`` into ``out`` (H×W×3) and return True if it is cached; else False."""
        return bool(self.read_batch([index], out[np.newaxis])[0])

    def read_batch(self, indices: Sequence[int], out: np.ndarray) -> np.ndarray:
        """Copy each cached item of ``indices`` into its ``out[i]`` (N×H×W×3); which were cached (bool, N)."""
        flags, pixels = self._maps()
        rows = np.asarray(indices, dtype=np.int64)
        cached = flags[rows] != 0  # each flag read before its pixels: a writer sets it after them
        for slot in np.flatnonzero(cached):
            out[slot] = pixels[rows[slot]]
        return cached

    def write(self, index: int, image: np.ndarray) -> None:
        """Store item ``index``: the pixels first, then the flag that publishes them."""
        self.write_batch([index], image[np.newaxis])

    def write_batch(self, indices: Sequence[int], images: np.ndarray) -> None:
        """Store items ``indices`` (``images[i]``, N×H×W×3): every image's pixels, then the flags that publish
        them (module docstring: through ``pwrite``)."""
        flags, _ = self._maps()
        meta = self.meta
        if images.dtype != np.uint8 or images.shape != (len(indices), meta.height, meta.width, 3):
            wanted = f"{len(indices)} images of {meta.height}x{meta.width}x3 uint8"
            raise ValueError(f"{wanted} expected, got {images.dtype} {images.shape}")
        image_bytes = meta.height * meta.width * 3
        try:
            descriptor = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise self._replaced() from None
        try:
            stat = os.fstat(descriptor)
            if (stat.st_dev, stat.st_ino) != self._file_id:  # the path now names another run's cache
                raise self._replaced()
            for index, image in zip(indices, images):
                data = np.ascontiguousarray(image).data.cast("B")
                offset, done = meta.pixels_offset + int(index) * image_bytes, 0
                while done < len(data):  # a regular file writes it all at once; a short write is not lost
                    done += os.pwrite(descriptor, data[done:], offset + done)
        finally:
            os.close(descriptor)
        flags[np.asarray(indices, dtype=np.int64)] = 1

    def filled(self) -> int:
        """How many items are cached."""
        return int(np.count_nonzero(self._maps()[0]))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pid": None, "_flags": None, "_pixels": None, "_file_id": None}
