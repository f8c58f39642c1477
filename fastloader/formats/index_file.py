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
import math
import os
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from fastloader.errors import FormatError
from fastloader.formats import json_text
from fastloader.storage import atomic_write, file_lock

MAGIC = b"FLIDX\x00\x01\n"
_ALIGN = 64
_ARRAY_KINDS = "biuf"  # bool, integers, floats: what indexes hold (never objects, strings or records)


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
            header = json_text.loads(file.read(header_len), f"{path}: index header")
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
    """The array a header entry describes, memory-mapped; every value of the entry is checked first
    (a header may lie: a huge shape must not size an allocation, an object dtype must not be mapped)."""
    dtype_text, shape_list, offset = spec["dtype"], spec["shape"], spec["offset"]
    if not isinstance(dtype_text, str) or not isinstance(shape_list, list):
        raise FormatError(f"{path}: array {name!r}: malformed dtype or shape in the header")
    dtype = np.dtype(dtype_text)
    if dtype.kind not in _ARRAY_KINDS or dtype.subdtype is not None:
        raise FormatError(f"{path}: array {name!r}: dtype {dtype_text!r} is not a plain numeric type")
    if not all(_is_count(n) for n in shape_list) or not _is_count(offset):
        raise FormatError(f"{path}: array {name!r}: shape {shape_list!r} or offset {offset!r} is not a count")
    shape = tuple(shape_list)
    nbytes = dtype.itemsize * math.prod(shape)  # Python ints: exact, however large the header claims
    if offset + nbytes > size:
        raise FormatError(f"{path}: array {name!r} runs past the end of the file (truncated index)")
    if nbytes == 0:
        return np.empty(shape, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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


# --- checking an index's values before they index arrays or size reads ------------------------------
# An index is read back from disk (or fetched beside a remote shard): its values may lie. Readers that
# index arrays or the indexed file with them check them first, so that a lie is a FormatError naming
# the index, never an IndexError, a MemoryError or an OSError later.


def require_array(index: IndexFile, name: str, dtype: type, length: int | None = None) -> np.ndarray:
    """``index.arrays[name]``, checked to be one-dimensional ``dtype`` values (``length`` of them)."""
    array = index.arrays.get(name)
    if array is None or array.dtype != np.dtype(dtype) or array.ndim != 1:
        raise FormatError(f"{index.path}: array {name!r} is missing or not a 1-D {np.dtype(dtype).name} array")
    if length is not None and len(array) != length:
        raise FormatError(f"{index.path}: array {name!r} holds {len(array)} values, {length} expected")
    return array


def check_csr(index: IndexFile, name: str, rows: int, end: int) -> None:
    """Offsets ``name`` (``rows + 1`` int64) run from 0 to ``end`` without going back."""
    offsets = require_array(index, name, np.int64, rows + 1)
    if int(offsets[0]) != 0 or int(offsets[-1]) != end or bool((offsets[1:] < offsets[:-1]).any()):
        raise FormatError(f"{index.path}: offsets {name!r} do not run from 0 to {end} in order")


def check_spans(index: IndexFile, offsets: str, sizes: str, rows: int, limit: int) -> None:
    """Every (offset, size) of arrays ``offsets`` and ``sizes`` lies within ``limit`` bytes."""
    start, size = require_array(index, offsets, np.int64, rows), require_array(index, sizes, np.int64, rows)
    # limit - size, not start + size: no overflow, however large the values claim to be
    if rows and (int(start.min()) < 0 or int(size.min()) < 0 or bool((start > limit - size).any())):
        raise FormatError(f"{index.path}: {offsets!r} / {sizes!r} reach outside the {limit:,} bytes indexed")


def check_codes(index: IndexFile, name: str, dtype: type, rows: int, count: int) -> None:
    """Array ``name`` holds ``rows`` codes, each below ``count`` (a position in a table of the meta)."""
    codes = require_array(index, name, dtype, rows)
    if rows and (int(codes.min()) < 0 or int(codes.max()) >= count):
        raise FormatError(f"{index.path}: array {name!r} holds codes outside its table of {count}")


def meta_count(index: IndexFile, key: str) -> int:
    """``index.meta[key]``, checked to be a count (an int >= 0)."""
    value = index.meta.get(key)
    if not isinstance(value, int) or not _is_count(value):
        raise FormatError(f"{index.path}: meta {key!r} is {value!r}, not a count")
    return value


def meta_strings(index: IndexFile, key: str) -> list[str]:
    """``index.meta[key]``, checked to be a list of strings."""
    value = index.meta.get(key)
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise FormatError(f"{index.path}: meta {key!r} is not a list of names")
    return value
