"""The layout of a fastloader LMDB: record keys, the record header and the reserved records.

A fastloader LMDB is a standard LMDB environment (a directory holding ``data.mdb``; any LMDB tool
opens it). Its main database holds two kinds of keys:

* **Image records**, keyed by the record number as 8 bytes big-endian (``0, 1, 2, ...``, contiguous),
  so keys sort in record order and reading record ``i`` is one ``txn.get``. The value is a 24-byte
  header followed by the encoded image bytes exactly as packed (JPEG, PNG, ...), little-endian::

      offset  size  field
         0      3   magic b"FLR"
         3      1   record layout version: 1 (image only) or 2 (image, then fields)
         4      1   image format code (FORMAT_CODES; 0 = not recognised)
         5      3   zero
         8      8   label, int64
        16      4   length of the image bytes, uint32
        20      4   CRC32C of header bytes 0..19 followed by every byte after the header
        24      n   the image bytes (n = the length at offset 16)

  A version 1 record ends with the image. A version 2 record (written only by a pack with fields,
  see ``fastloader.fields``) goes on with the item's fields, little-endian::

      size     field
        4      k: the number of fields the item carries, uint32 (0 .. the pack's field count)
        4 * k  each field's number, uint32: its position in the metadata's ``fields``, strictly increasing
        4 * k  each field's length in bytes, uint32
        ...    each field's canonical bytes (``fastloader.formats.field_values.encode_value`` of its kind),
               in table order, back to back: they end exactly where the value ends

  A field the item lacks is simply not in its table. Reading one field is one ``txn.get``, one
  ``struct.unpack_from`` of the table and one decode of that field's bytes; the image is read
  without looking at the fields at all.

  The checksum covers the label, the image and the fields, so a flipped byte anywhere in a record
  is found by ``fastloader verify``. Nothing is pickled: unpickling untrusted data runs code.

* **Reserved records**, all under ``RESERVED_PREFIX`` (longer than 8 bytes, so never a record key):

  ``meta``                    JSON :class:`LMDBMeta`, written last by ``finish``: the commit point.
                              Without it the pack is incomplete and readers refuse it. A pack with
                              fields lists them there in field-number order: ``"fields": [[name,
                              kind], ...]``.
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
another tool) or with a newer version, naming the path. Format version 1 is a pack of images and
labels (version 1 records only); version 2 a pack with fields (version 2 records only). A pack
without fields is still written as version 1, byte for byte as before fields existed, so that
every fastloader reads it; only a pack that needs version 2 asks its readers to be new enough.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence, Sized
from dataclasses import asdict, dataclass, field
from typing import Any

import crc32c
import numpy as np

from fastloader.errors import FormatError
from fastloader.formats import json_text
from fastloader.formats.field_values import check_kind

FORMAT_NAME = "fastloader-lmdb"
FORMAT_VERSION = 2  # the newest this fastloader reads and writes
PLAIN_FORMAT_VERSION = 1  # what a pack without fields is written as
FIELDS_FORMAT_VERSION = 2  # the first version with fields

RECORD_MAGIC = b"FLR"
RECORD_VERSION = 2  # the newest record layout this fastloader reads
PLAIN_RECORD_VERSION, FIELDS_RECORD_VERSION = 1, 2
HEADER = struct.Struct("<3sBB3xqII")
_COUNT = struct.Struct("<I")
_MAX_LENGTH = (1 << 32) - 1
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


def format_version(fields: Sized) -> int:
    """The format version a pack with ``fields`` (its schema: names and kinds) is written as."""
    return FIELDS_FORMAT_VERSION if len(fields) else PLAIN_FORMAT_VERSION


def encode_fields(fields: Sequence[tuple[int, bytes]]) -> bytes:
    """The fields section of a version 2 record: ``fields`` are ``(field number, canonical bytes)``
    of each field the item carries, in increasing field number."""
    numbers = [number for number, _ in fields]
    if any(not 0 <= number <= _MAX_LENGTH for number in numbers) or any(b <= a for a, b in zip(numbers, numbers[1:])):
        raise ValueError(f"field numbers must be distinct, increasing and fit a uint32, got {numbers}")
    lengths = [len(data) for _, data in fields]
    if any(length > _MAX_LENGTH for length in lengths):
        raise ValueError(f"a field of {max(lengths)} bytes does not fit a record (4 GiB at most)")
    table = struct.pack(f"<{1 + 2 * len(fields)}I", len(fields), *numbers, *lengths)
    return table + b"".join(data for _, data in fields)


def encode_record(label: int, data: bytes, fields: Sequence[tuple[int, bytes]] | None = None) -> bytes:
    """The value stored for one image: header + ``data``, a version 1 record; with ``fields`` (see
    :func:`encode_fields`; an empty sequence for an item without any), a version 2 record."""
    if len(data) > _MAX_LENGTH:
        raise ValueError(f"an image of {len(data)} bytes does not fit a record (4 GiB at most)")
    version, tail = (PLAIN_RECORD_VERSION, b"") if fields is None else (FIELDS_RECORD_VERSION, encode_fields(fields))
    head = HEADER.pack(RECORD_MAGIC, version, image_format_code(data), label, len(data), 0)
    checksum = crc32c.crc32c(tail, crc32c.crc32c(data, crc32c.crc32c(head[:_CHECKED_PREFIX])))
    return head[:_CHECKED_PREFIX] + checksum.to_bytes(4, "little") + data + tail


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
    if version == PLAIN_RECORD_VERSION:
        if len(value) != HEADER.size + length:
            raise FormatError(f"{where}: record holds {len(value) - HEADER.size} image bytes, its header says {length}")
    elif version == FIELDS_RECORD_VERSION:
        if len(value) < HEADER.size + length + _COUNT.size:
            raise FormatError(
                f"{where}: record of {len(value)} bytes cannot hold its {length} image bytes and a field table"
            )
    else:
        raise FormatError(f"{where}: unknown record version {version}")
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
    return header.label, bytes(memoryview(value)[HEADER.size : HEADER.size + header.length])


def fields_section(value: bytes | memoryview, header: RecordHeader) -> memoryview:
    """The bytes after a record's image: its fields (empty for a version 1 record)."""
    return memoryview(value)[HEADER.size + header.length :]


def parse_fields(section: bytes | memoryview, where: str) -> dict[int, memoryview]:
    """The canonical bytes of each field in a record's fields section (:func:`fields_section`), by
    field number; FormatError naming ``where`` when the table does not describe the bytes exactly."""
    view = memoryview(section)
    if not len(view):
        return {}
    if len(view) < _COUNT.size:
        raise FormatError(f"{where}: a field table of {len(view)} bytes is truncated")
    (count,) = _COUNT.unpack_from(view)
    data_start = _COUNT.size + 8 * count
    if data_start > len(view):  # checked first: a corrupt count must not make a huge struct format
        raise FormatError(f"{where}: a table of {count} fields does not fit the record's {len(view)} field bytes")
    entries = struct.unpack_from(f"<{2 * count}I", view, _COUNT.size)
    numbers, lengths = entries[:count], entries[count:]
    if any(b <= a for a, b in zip(numbers, numbers[1:])):
        raise FormatError(f"{where}: field numbers {list(numbers)} are not strictly increasing")
    if sum(lengths) != len(view) - data_start:
        raise FormatError(
            f"{where}: the field table announces {sum(lengths)} bytes of fields, the record holds "
            f"{len(view) - data_start}"
        )
    fields, at = {}, data_start
    for number, length in zip(numbers, lengths):
        fields[number] = view[at : at + length]
        at += length
    return fields


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
    doc = json_text.loads(bytes(data), f"{path}: unreadable {what} record")
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
    version: int = PLAIN_FORMAT_VERSION  # that of the pack it describes (format_version)

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
    """The final metadata of a pack: present only once the pack is complete.

    ``fields``: ``(name, kind)`` of each field the records may carry, by field number (empty for a
    pack of images and labels); ``version``: :func:`format_version` of them.
    """

    count: int
    classes: tuple[str, ...] | None
    fingerprint: dict[str, Any]
    num_skipped: int
    created_by: str
    pack: dict[str, Any] = field(default_factory=dict)  # the engine's description: source, options
    fields: tuple[tuple[str, str], ...] = ()
    format: str = FORMAT_NAME
    version: int = PLAIN_FORMAT_VERSION

    def __post_init__(self) -> None:
        names = [name for name, _ in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"field names repeat: {names}")
        for name, kind in self.fields:
            check_kind(kind, name)
        if self.fields and self.version < FIELDS_FORMAT_VERSION:
            raise ValueError(f"a pack with fields is format version {FIELDS_FORMAT_VERSION}, not {self.version}")

    def to_json(self) -> bytes:
        doc = asdict(self)
        if not self.fields:  # a pack without fields: the metadata of format version 1, exactly
            del doc["fields"]
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

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
                fields=tuple((str(name), str(kind)) for name, kind in doc.get("fields", ())),
                version=doc["version"],
            )
        except (KeyError, TypeError, ValueError) as error:
            raise FormatError(f"{path}: incomplete metadata record ({error!r})") from error
