"""The layout of a fastloader LMDB: record keys, the record header and the reserved records.

A fastloader LMDB is a standard LMDB environment (a directory holding ``data.mdb``; any LMDB tool
opens it). Its main database holds two kinds of keys:

* **Image records**, keyed by the record number as 8 bytes big-endian (``0, 1, 2, ...``, contiguous),
  so keys sort in record order and reading record ``i`` is one ``txn.get``. The value is a 24-byte
  header followed by the encoded image bytes exactly as packed (JPEG, PNG, ...), little-endian::

      offset  size  field
         0      3   magic b"FLR"
         3      1   record layout version (1)
         4      1   image format code (FORMAT_CODES; 0 = not recognised)
         5      3   zero
         8      8   label, int64
        16      4   length of the image bytes, uint32
        20      4   CRC32C of header bytes 0..19 followed by the image bytes

  The checksum covers the label as well as the image, so a flipped byte anywhere in a record is
  found by ``fastloader verify``. Nothing is pickled: unpickling untrusted data runs code.

* **Reserved records**, all under ``RESERVED_PREFIX`` (longer than 8 bytes, so never a record key):

  ``meta``                    JSON :class:`LMDBMeta`, written last by ``finish``: the commit point.
                              Without it the pack is incomplete and readers refuse it.
  ``progress``                JSON :class:`PackProgress`, rewritten in the same transaction as the
                              records it covers, which is what makes a resumed pack exact.
  ``labels``                  every label as one int64 array, written by ``finish`` (readers map
                              it instead of scanning 10M headers).
  ``chunk-labels/<start>``    the labels of the records one transaction wrote, from record
                              ``start`` (8 bytes big-endian); ``labels`` is their concatenation.
  ``chunk-keys/<start>``      those records' source keys (paths, member names), NUL-separated UTF-8,
                              for reports and ``LMDBSource.source_key``.
  ``skipped/<position>``      JSON ``{"key", "reason"}`` of a source item that was not packed.

Metadata carries a format name and version: a reader refuses an LMDB without it (written by
another tool) or with a newer version, naming the path.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import crc32c
import numpy as np

from fastloader.errors import FormatError

FORMAT_NAME = "fastloader-lmdb"
FORMAT_VERSION = 1

RECORD_MAGIC = b"FLR"
RECORD_VERSION = 1
HEADER = struct.Struct("<3sBB3xqII")
_CHECKED_PREFIX = HEADER.size - 4  # the checksum covers every header byte before itself

RESERVED_PREFIX = b"__fastloader__/"
META_KEY = RESERVED_PREFIX + b"meta"
PROGRESS_KEY = RESERVED_PREFIX + b"progress"
LABELS_KEY = RESERVED_PREFIX + b"labels"
LABEL_CHUNK_PREFIX = RESERVED_PREFIX + b"chunk-labels/"
KEY_CHUNK_PREFIX = RESERVED_PREFIX + b"chunk-keys/"
SKIPPED_PREFIX = RESERVED_PREFIX + b"skipped/"

LABEL_DTYPE = np.dtype("<i8")

# Image format codes: sniffed from the leading bytes, so the sink needs no hint from the engine.
FORMAT_CODES = {"JPEG": 1, "PNG": 2, "WEBP": 3, "GIF": 4, "BMP": 5, "TIFF": 6}
_SIGNATURES = (
    (b"\xff\xd8\xff", "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"GIF8", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
)


def record_key(number: int) -> bytes:
    """The key of image record ``number``."""
    return number.to_bytes(8, "big")


def is_record_key(key: bytes) -> bool:
    return len(key) == 8


def record_number(key: bytes) -> int:
    return int.from_bytes(key, "big")


def chunk_key(prefix: bytes, start: int) -> bytes:
    """The key of a per-transaction chunk (labels or source keys) starting at record ``start``."""
    return prefix + start.to_bytes(8, "big")


def chunk_start(prefix: bytes, key: bytes) -> int:
    return int.from_bytes(key[len(prefix) :], "big")


def skipped_key(position: int) -> bytes:
    return SKIPPED_PREFIX + position.to_bytes(8, "big")


def image_format_code(data: bytes | memoryview) -> int:
    """The FORMAT_CODES entry of encoded image bytes, 0 when not recognised."""
    head = bytes(data[:12])
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return FORMAT_CODES["WEBP"]
    for signature, name in _SIGNATURES:
        if head.startswith(signature):
            return FORMAT_CODES[name]
    return 0


def encode_record(label: int, data: bytes) -> bytes:
    """Header + ``data``: the value stored for one image."""
    if len(data) >= 1 << 32:
        raise ValueError(f"an image of {len(data)} bytes does not fit a record (4 GiB at most)")
    head = HEADER.pack(RECORD_MAGIC, RECORD_VERSION, image_format_code(data), label, len(data), 0)
    checksum = crc32c.crc32c(data, crc32c.crc32c(head[:_CHECKED_PREFIX]))
    return head[:_CHECKED_PREFIX] + checksum.to_bytes(4, "little") + data


@dataclass(frozen=True)
class RecordHeader:
    version: int
    format_code: int
    label: int
    length: int
    checksum: int


def parse_header(value: bytes | memoryview, where: str) -> RecordHeader:
    """The header of a stored value; FormatError naming ``where`` when it is not a record."""
    if len(value) < HEADER.size:
        raise FormatError(f"{where}: record of {len(value)} bytes is shorter than its {HEADER.size}-byte header")
    magic, version, code, label, length, checksum = HEADER.unpack_from(value)
    if magic != RECORD_MAGIC:
        raise FormatError(f"{where}: not a fastloader record (bad magic {bytes(magic)!r})")
    if version > RECORD_VERSION:
        raise FormatError(f"{where}: record version {version} is newer than this fastloader reads (upgrade it)")
    if len(value) != HEADER.size + length:
        raise FormatError(f"{where}: record holds {len(value) - HEADER.size} image bytes, its header says {length}")
    return RecordHeader(version, code, label, length, checksum)


def record_checksum(value: bytes | memoryview) -> int:
    """The CRC32C a record's header should hold, computed from the value."""
    view = memoryview(value)
    return crc32c.crc32c(view[HEADER.size :], crc32c.crc32c(view[:_CHECKED_PREFIX]))


def decode_record(value: bytes | memoryview, where: str, verify_checksum: bool = False) -> tuple[int, bytes]:
    """``(label, image bytes)`` of a stored value, checking the header (and the checksum if asked)."""
    header = parse_header(value, where)
    if verify_checksum and record_checksum(value) != header.checksum:
        raise FormatError(f"{where}: checksum mismatch: the record is corrupted")
    return header.label, bytes(memoryview(value)[HEADER.size :])


def encode_labels(labels: Sequence[int] | np.ndarray) -> bytes:
    return np.asarray(labels, dtype=LABEL_DTYPE).tobytes()


def decode_labels(data: bytes | memoryview, where: str) -> np.ndarray:
    if len(data) % LABEL_DTYPE.itemsize:
        raise FormatError(f"{where}: labels record of {len(data)} bytes is not a whole number of int64")
    return np.frombuffer(data, dtype=LABEL_DTYPE)


def encode_keys(keys: Sequence[str]) -> bytes:
    # Paths and member names never hold NUL; a source that invents keys with one gets it escaped.
    return b"\x00".join(key.replace("\x00", "\\x00").encode("utf-8", "surrogateescape") for key in keys)


def decode_keys(data: bytes | memoryview) -> list[str]:
    return bytes(data).decode("utf-8", "surrogateescape").split("\x00")


def _load_json(data: bytes | memoryview, path: str, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(bytes(data))
    except (UnicodeDecodeError, ValueError) as error:
        raise FormatError(f"{path}: unreadable {what} record ({error})") from error
    if not isinstance(doc, dict):
        raise FormatError(f"{path}: the {what} record is not a JSON object")
    if doc.get("format") != FORMAT_NAME:
        raise FormatError(f"{path}: not a fastloader LMDB ({what} names format {doc.get('format')!r})")
    version = doc.get("version")
    if not isinstance(version, int) or version < 1:
        raise FormatError(f"{path}: invalid format version {version!r} in the {what} record")
    if version > FORMAT_VERSION:
        raise FormatError(
            f"{path}: written by a newer fastloader (format version {version}; this one reads up to "
            f"{FORMAT_VERSION}): upgrade fastloader to read it"
        )
    return doc


def _dump_json(obj: Any) -> bytes:
    return json.dumps(asdict(obj), sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class PackProgress:
    """How far a pack got: committed with the records it covers (see the module docstring)."""

    fingerprint: dict[str, Any]
    next_position: int  # the first source position neither packed nor skipped
    count: int  # records written: keys 0 .. count - 1
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION

    def to_json(self) -> bytes:
        return _dump_json(self)

    @classmethod
    def from_json(cls, data: bytes | memoryview, path: str) -> PackProgress:
        doc = _load_json(data, path, "progress")
        try:
            return cls(dict(doc["fingerprint"]), int(doc["next_position"]), int(doc["count"]), version=doc["version"])
        except (KeyError, TypeError, ValueError) as error:
            raise FormatError(f"{path}: incomplete progress record ({error!r})") from error


@dataclass(frozen=True)
class LMDBMeta:
    """The final metadata of a pack: present only once the pack is complete."""

    count: int
    classes: tuple[str, ...] | None
    fingerprint: dict[str, Any]
    num_skipped: int
    created_by: str
    pack: dict[str, Any] = field(default_factory=dict)  # the engine's description: source, options
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION

    def to_json(self) -> bytes:
        return _dump_json(self)

    @classmethod
    def from_json(cls, data: bytes | memoryview, path: str) -> LMDBMeta:
        doc = _load_json(data, path, "metadata")
        try:
            classes = doc["classes"]
            return cls(
                count=int(doc["count"]),
                classes=None if classes is None else tuple(str(name) for name in classes),
                fingerprint=dict(doc["fingerprint"]),
                num_skipped=int(doc["num_skipped"]),
                created_by=str(doc["created_by"]),
                pack=dict(doc.get("pack", {})),
                version=doc["version"],
            )
        except (KeyError, TypeError, ValueError) as error:
            raise FormatError(f"{path}: incomplete metadata record ({error!r})") from error
