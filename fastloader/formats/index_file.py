"""One memory-mappable file holding named numpy arrays: the on-disk form of every index.

At 10M samples an index must load in well under two seconds and cost no per-sample Python
objects, in the main process or in any worker. So indexes are plain numpy arrays (strings as
one bytes blob plus an offsets array) in one file, memory-mapped read-only: loading is an
``mmap``, and every worker shares the same page-cache pages.

Layout (little-endian)::

    b"FLIDX\\x00\\x01\\n"                 8-byte magic (the last-but-one byte is the layout version)
    u64 header length
    header: UTF-8 JSON {"kind", "version", "meta", "arrays": {name: {"dtype", "shape", "offset"}}}
    array data, each array starting at a 64-byte aligned offset

Indexes are derived data: a reader that finds a missing, foreign, truncated or older file gets a
:class:`~fastloader.errors.FormatError` naming it and rebuilds.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from fastloader.errors import FormatError
from fastloader.storage import atomic_write, file_lock

MAGIC = b"FLIDX\x00\x01\n"
_ALIGN = 64


@dataclass(frozen=True)
class IndexFile:
    """An index read back: its ``meta`` dict and read-only memory-mapped ``arrays``."""

    path: str
    kind: str
    version: int
    meta: Mapping[str, Any]
    arrays: Mapping[str, np.ndarray]


def _aligned(offset: int) -> int:
    return (offset + _ALIGN - 1) // _ALIGN * _ALIGN


def write_index(
    path: str | os.PathLike[str], kind: str, version: int, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
) -> None:
    """Write ``arrays`` (C-contiguous copies are made where needed) and ``meta`` atomically to ``path``."""
    arrays = {name: np.ascontiguousarray(array) for name, array in arrays.items()}
    # Offsets depend on the header's own length: lay out with a provisional header, then fix.
    header_len = 0
    for _ in range(3):
        offset = _aligned(len(MAGIC) + 8 + header_len)
        table = {}
        for name, array in arrays.items():
            table[name] = {"dtype": array.dtype.str, "shape": list(array.shape), "offset": offset}
            offset = _aligned(offset + array.nbytes)
        header = json.dumps({"kind": kind, "version": version, "meta": dict(meta), "arrays": table}).encode()
        if len(header) == header_len:
            break
        header_len = len(header)

    def write(file: BinaryIO) -> None:
        file.write(MAGIC + struct.pack("<Q", len(header)) + header)
        for name, array in arrays.items():
            file.write(b"\x00" * (table[name]["offset"] - file.tell()))
            file.write(array.reshape(-1).view(np.uint8).data)

    atomic_write(path, write)


def read_index(path: str | os.PathLike[str], kind: str, version: int) -> IndexFile:
    """Memory-map the index at ``path``; FormatError when it is not a ``kind`` index of ``version``."""
    path = os.fspath(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as file:
            head = file.read(len(MAGIC) + 8)
            if len(head) < len(MAGIC) + 8 or head[: len(MAGIC)] != MAGIC:
                raise FormatError(f"{path}: not a fastloader index file (bad magic)")
            (header_len,) = struct.unpack("<Q", head[len(MAGIC) :])
            if header_len > size:
                raise FormatError(f"{path}: truncated index header")
            header = json.loads(file.read(header_len))
    except FileNotFoundError:
        raise
    except (OSError, ValueError, UnicodeDecodeError) as error:
        if isinstance(error, FormatError):
            raise
        raise FormatError(f"{path}: unreadable index ({error})") from error
    if not isinstance(header, dict):
        raise FormatError(f"{path}: the index header is not a JSON object")
    if header.get("kind") != kind or header.get("version") != version:
        raise FormatError(
            f"{path}: a {header.get('kind')!r} index of version {header.get('version')}, expected {kind!r} v{version}"
        )
    try:
        arrays = {name: _map_array(path, size, name, spec) for name, spec in header["arrays"].items()}
        meta = dict(header["meta"])
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        if isinstance(error, FormatError):
            raise
        raise FormatError(f"{path}: malformed index header ({type(error).__name__}: {error})") from None
    return IndexFile(path, kind, version, meta, arrays)


def cached_index(
    path: str | os.PathLike[str], current: Callable[[], IndexFile | None], build: Callable[[], IndexFile]
) -> IndexFile:
    """The derived index at ``path``: ``current()`` when it returns one (present and up to date), else
    ``build()``, once: the processes and ranks that start together wait on a file lock, and each
    re-checks after taking it, so only the first one scans."""
    index = current()
    if index is not None:
        return index
    with file_lock(path):
        index = current()
        return index if index is not None else build()


def _map_array(path: str, size: int, name: str, spec: Mapping[str, Any]) -> np.ndarray:
    dtype, shape, offset = np.dtype(spec["dtype"]), tuple(spec["shape"]), int(spec["offset"])
    nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    if offset < 0 or offset + nbytes > size:
        raise FormatError(f"{path}: array {name!r} runs past the end of the file (truncated index)")
    if nbytes == 0:
        return np.empty(shape, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)


def pack_strings(strings: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
    """UTF-8 encode ``strings`` into one ``uint8`` blob and ``int64`` offsets (``len + 1`` entries)."""
    encoded = [s.encode("utf-8", "surrogateescape") for s in strings]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    return blob, offsets


def string_at(blob: np.ndarray, offsets: np.ndarray, index: int) -> str:
    """The ``index``-th string of a :func:`pack_strings` pair."""
    start, end = int(offsets[index]), int(offsets[index + 1])
    return bytes(blob[start:end]).decode("utf-8", "surrogateescape")
