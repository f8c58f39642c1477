"""TFRecord files, read and written without TensorFlow.

Byte layout of each record (TensorFlow ``record_writer``, little-endian), records back to back::

    u64 length
    u32 masked_crc32c(the 8 length bytes)
    data[length]
    u32 masked_crc32c(data)

    masked_crc32c(b) = ((crc >> 15) | (crc << 17)) + 0xa282ead8   (mod 2**32, crc = CRC32C(b))

The format has no index, so random access needs one: :func:`load_index` scans a file once (record
headers only) and keeps the offsets and lengths in a sidecar index beside it (or in the cache
directory), rebuilt when the file changes. Both CRCs are checked on every read; the scan checks
the length CRC (reading every payload would read the whole dataset).
"""

from __future__ import annotations

import os
import struct
import warnings
from array import array
from types import TracebackType

import crc32c
import numpy as np

from fastloader.errors import FormatError, printable
from fastloader.formats.index_file import IndexFile, cached_index, meta_count, read_index, require_array, write_index
from fastloader.storage import AtomicFile, open_regular, sidecar_path

_HEAD = struct.Struct("<QI")
_CRC = struct.Struct("<I")
FRAME_OVERHEAD = _HEAD.size + _CRC.size
_MASK_DELTA = 0xA282EAD8
INDEX_KIND = "tfrecord"
INDEX_VERSION = 1
INDEX_SUFFIX = ".flindex"


def masked_crc32c(data: bytes | memoryview) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """``data`` framed as one TFRecord record."""
    length = struct.pack("<Q", len(data))
    return length + _CRC.pack(masked_crc32c(length)) + data + _CRC.pack(masked_crc32c(data))


def _pread(fd: int, size: int, offset: int, path: str) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise FormatError(f"{path}: short read of {size} bytes at offset {offset} (file truncated since indexed?)")
    return data


def _check_head(head: bytes, offset: int, path: str) -> int:
    """The data length in the 12-byte record header at ``offset``, its CRC checked."""
    length, length_crc = _HEAD.unpack(head)
    if masked_crc32c(head[:8]) != length_crc:
        raise FormatError(
            f"{path}: length CRC mismatch at offset {offset} (not a TFRecord file, compressed, or corrupt?)"
        )
    return int(length)


def read_record(fd: int, offset: int, length: int, file_size: int, path: str) -> memoryview:
    """The data of the record at ``offset`` whose index says it holds ``length`` bytes: one ``pread``,
    both CRCs checked. A zero-copy view into the bytes read."""
    if offset < 0 or length < 0 or offset + length + FRAME_OVERHEAD > file_size:
        raise FormatError(
            f"{path}: a record of {length} bytes at offset {offset} runs past the end of the file (stale index?)"
        )
    record = _pread(fd, length + FRAME_OVERHEAD, offset, path)
    stored = _check_head(record[: _HEAD.size], offset, path)
    if stored != length:
        raise FormatError(
            f"{path}: the record at offset {offset} holds {stored} bytes, its index says {length} (stale)"
        )
    data = memoryview(record)[_HEAD.size : _HEAD.size + length]
    (data_crc,) = _CRC.unpack_from(record, _HEAD.size + length)
    if masked_crc32c(data) != data_crc:
        raise FormatError(f"{path}: data CRC mismatch in the record at offset {offset} (corrupt file)")
    return data


def scan_records(fd: int, file_size: int, path: str) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, lengths)`` of every record of a TFRecord file, in file order (int64 arrays)."""
    offsets, lengths = array("q"), array("q")  # 8 bytes a record, not a Python int each
    pos = 0
    while pos < file_size:
        if pos + _HEAD.size > file_size:
            raise FormatError(f"{path}: {file_size - pos} stray bytes at offset {pos} (truncated record header)")
        length = _check_head(_pread(fd, _HEAD.size, pos, path), pos, path)
        if length > file_size - pos - FRAME_OVERHEAD:
            raise FormatError(
                f"{path}: the record at offset {pos} declares {length} bytes but the file ends at {file_size} "
                "(truncated?)"
            )
        offsets.append(pos)
        lengths.append(length)
        pos += length + FRAME_OVERHEAD
    return np.frombuffer(offsets, dtype=np.int64).copy(), np.frombuffer(lengths, dtype=np.int64).copy()


def _stamp(path: str) -> dict[str, int]:
    stat = os.stat(path)
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def default_index_path(path: str | os.PathLike[str]) -> str:
    return os.fspath(sidecar_path(path, INDEX_SUFFIX))


def load_index(path: str | os.PathLike[str], index_path: str | os.PathLike[str] | None = None) -> IndexFile:
    """The memory-mapped index (``offsets``, ``lengths``) of the TFRecord file at ``path``.

    Built by a scan when missing, foreign, or older than the file (size or mtime changed), under a
    lock so that ranks starting together scan once.
    """
    path = os.fspath(path)
    index_path = default_index_path(path) if index_path is None else os.fspath(index_path)

    def build() -> IndexFile:
        stamp = _stamp(path)
        with open(open_regular(path), "rb") as file:  # a FIFO named *.tfrecord: an error, never a hang
            offsets, lengths = scan_records(file.fileno(), stamp["size"], path)
        meta = {"data": stamp, "count": len(offsets)}
        write_index(index_path, INDEX_KIND, INDEX_VERSION, meta, {"offsets": offsets, "lengths": lengths})
        return read_index(index_path, INDEX_KIND, INDEX_VERSION)

    return cached_index(index_path, lambda: _fresh_index(path, index_path), build)


def _fresh_index(path: str, index_path: str) -> IndexFile | None:
    """The index at ``index_path`` when it is of this file as it is now and describes it as a scan would;
    else None: build it again.

    An index shipped beside the data is the data's to ship, and its metadata (the file's size and mtime,
    which an archive keeps) proves nothing of its arrays. But records lie back to back, so the lengths
    alone give every offset: the first record at 0, each next one where the previous ends, the last ending
    at the end of the file. An index whose offsets are not those (records swapped, dropped or repeated) is
    rebuilt; and each read checks the length it is given against the record's own CRC-checked header, so
    a length that lies is an error at the record, never another record's bytes."""
    try:
        index = read_index(index_path, INDEX_KIND, INDEX_VERSION)
        stamp = _stamp(path)
        if index.meta.get("data") != stamp:
            return None
        count = meta_count(index, "count")
        offsets = require_array(index, "offsets", np.int64, count)
        lengths = require_array(index, "lengths", np.int64, count)
    except (FileNotFoundError, FormatError):
        return None
    size = stamp["size"]
    if count and not ((lengths >= 0) & (lengths <= size)).all():  # no sum below can wrap around
        back_to_back = False
    else:
        ends = np.cumsum(lengths + FRAME_OVERHEAD, dtype=np.int64)
        starts = np.concatenate([np.zeros(1, np.int64), ends[:-1]])
        back_to_back = bool((offsets == starts).all()) and (int(ends[-1]) if count else 0) == size
    if not back_to_back:
        warnings.warn(
            printable(f"rebuilding {index_path}: its offsets are not those of the records of {path} back to back"),
            stacklevel=2,
        )
        return None
    return index


class TFRecordWriter:
    """Appends records to a TFRecord file, written under a temporary name and renamed into place by
    :meth:`close` (a ``with`` block left by an exception leaves nothing behind)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._target = AtomicFile(self.path)
        self._offset = 0

    def write(self, data: bytes) -> int:
        """Append one record; returns its offset."""
        offset = self._offset
        chunk = frame(data)
        self._target.file.write(chunk)
        self._offset += len(chunk)
        return offset

    def close(self) -> None:
        self._target.commit()

    def abort(self) -> None:
        self._target.abort()

    def __enter__(self) -> TFRecordWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
