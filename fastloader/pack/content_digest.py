"""A pack's content digest: one SHA-256 of every record's bytes, in order, that a user can pin.

Plain ``verify`` checks a pack against digests that travel with it (CRC32C per LMDB record, SHA-256 per
shard in the manifest): whoever edits a record and recomputes those passes. A digest obtained apart from
the data (printed by ``pack`` on the author's machine, published with the pack) is what proves a pack is
the one its author made: ``fastloader verify PACK --expect-digest HEX``.

Definition (version 1). Each record ``i`` of the pack, in the reader's order, has a *record digest*
``r_i = SHA-256(b"fastloader-record-v1\\0" || F(key) || label || F(image) || fields)``, where ``F(b)`` is
``b``'s length as 8 bytes little-endian then ``b``; ``key`` the UTF-8 of the key the sample had in the
packed source (``source_key``; a Parquet pack's key column; empty when the pack records none); ``label``
the label as 8 bytes little-endian, signed (-1: none); ``image`` the encoded image bytes as stored; and
``fields`` each field the record carries, by name in sorted order, as ``F(name) || F(kind) || F(value)``
with ``value`` the field's canonical bytes (:func:`~fastloader.formats.field_values.encode_value` of the
value read). The pack's digest is ``SHA-256(b"fastloader-content-v1\\0" || n || r_0 || ... || r_{n-1})``,
``n`` the record count as 8 bytes little-endian. Nothing of a manifest or an index enters it but what
the reader serves.

To name the record that differs, ``pack`` also writes the record digests into the pack
(``_fastloader-records.sha256``: ``n`` raw 32-byte digests; beside an LMDB file, ``<file>-records.sha256``).
That file travels with the pack and is trusted only when its record digests combine to the pinned digest:
then the first record whose digest differs is named; else the report says the content differs without
naming a record.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from fastloader.errors import MissingField
from fastloader.formats.field_values import encode_value
from fastloader.storage import atomic_write_bytes

RECORDS_NAME = "_fastloader-records.sha256"  # "_": Parquet readers (pyarrow) skip it in a pack folder
_RECORD_TAG = b"fastloader-record-v1\0"
_PACK_TAG = b"fastloader-content-v1\0"
_DIGEST = 32


def _framed(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def _key(source: Any, index: int) -> str:
    source_key = getattr(source, "source_key", None)
    if source_key is None:
        return str(source.key(index))  # a Parquet pack: its key column
    return source_key(index) or ""


def record_digest(source: Any, index: int) -> bytes:
    """``r_i`` of record ``index`` of ``source`` (see the module docstring)."""
    digest = hashlib.sha256(_RECORD_TAG)
    digest.update(_framed(_key(source, index).encode("utf-8", "surrogateescape")))
    digest.update(struct.pack("<q", int(source.label(index))))
    digest.update(_framed(bytes(source.read(index))))
    for name, kind in sorted(source.field_kinds().items()):
        try:
            value = source.read_field(index, name)
        except MissingField:
            continue  # a record may lack a field
        digest.update(_framed(name.encode()) + _framed(kind.encode()) + _framed(encode_value(kind, value)))
    return digest.digest()


@contextlib.contextmanager
def _opened(path: str) -> Iterator[Any]:
    """The pack at ``path`` opened as its reader opens it, closed after: an LMDB environment left open in
    this process would refuse the next writer of the same path (a pack resumed or made again)."""
    from fastloader.datasets.lmdb import has_shared_handle, release_shared_handle
    from fastloader.datasets.sources import open_source

    held = has_shared_handle(path)  # a dataset of this process reads it: leave its handle open
    source, _ = open_source(path)
    try:
        yield source
    finally:
        close = getattr(source, "close", None)
        if callable(close):
            close()
        if not held:
            release_shared_handle(path)


def record_digests(source: Any, progress: Callable[[int], None] = lambda done: None) -> np.ndarray:
    """The record digests (``n`` x 32 bytes) of an opened pack."""
    found = np.zeros((len(source), _DIGEST), np.uint8)
    for index in range(len(source)):
        found[index] = np.frombuffer(record_digest(source, index), np.uint8)
        progress(index + 1)
    return found


def combine(records: np.ndarray) -> str:
    """The pack's digest (hex) of its record digests."""
    digest = hashlib.sha256(_PACK_TAG + struct.pack("<Q", len(records)))
    digest.update(np.ascontiguousarray(records, np.uint8).tobytes())
    return digest.hexdigest()


def records_path(path: str) -> str:
    """Where the record digests of the pack at ``path`` are kept (inside a pack directory)."""
    return os.path.join(path, RECORDS_NAME) if os.path.isdir(path) else f"{path}-records.sha256"


def pack_digest(path: str | os.PathLike[str]) -> str:
    """The content digest (hex) of the pack at ``path``, read record by record."""
    with _opened(os.fspath(path)) as source:
        return combine(record_digests(source))


def write_records(path: str | os.PathLike[str]) -> str:
    """Read the pack at ``path``, write its record digests into it, and return its content digest (``pack``)."""
    with _opened(os.fspath(path)) as source:
        records = record_digests(source)
    atomic_write_bytes(records_path(os.fspath(path)), records.tobytes())
    return combine(records)


def digest_problems(path: str | os.PathLike[str], expected: str) -> list[str]:
    """Why the pack at ``path`` is not the one whose content digest is ``expected``: [] when it is."""
    path = os.fspath(path)
    expected = expected.strip().lower()
    with _opened(path) as source:
        records = record_digests(source)
        found = combine(records)
        if found == expected:
            return []
        shipped = _shipped_records(path)
        if shipped is not None and combine(shipped) == expected:  # the list the pinned digest vouches for
            if len(shipped) != len(records):
                return [f"{path}: {len(records)} records, the pinned digest's pack has {len(shipped)}"]
            index = int(np.flatnonzero((shipped != records).any(axis=1))[0])
            return [
                f"{path}: record {index} (key {_key(source, index)!r}) is not the one the pinned digest vouches"
                f" for (its key, label, image or fields differ); the pack's content digest is {found}, not {expected}"
            ]
    return [
        f"{path}: its content digest is {found}, not the pinned {expected}; it holds no record digests the "
        "pinned digest vouches for, so the record that differs is not named"
    ]


def _shipped_records(path: str) -> np.ndarray | None:
    """The record digests written into the pack, or None (none, or not a whole number of digests)."""
    try:
        with open(records_path(path), "rb") as file:
            data = file.read()
    except OSError:
        return None
    if len(data) % _DIGEST:
        return None
    return np.frombuffer(data, np.uint8).reshape(-1, _DIGEST)
