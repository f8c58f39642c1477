"""MXNet RecordIO (``.rec`` / ``.idx``), read and written without MXNet.

Byte layout (dmlc-core ``recordio.h``, all little-endian)::

    u32 magic 0xced7230a
    u32 lrecord        upper 3 bits: cflag, lower 29 bits: length of this part
    payload[length]
    zero padding to a multiple of 4 bytes

A payload that contains the magic word at a 4-byte aligned position is split there, so that a
reader resynchronising on the magic can never land inside a record: the parts carry cflag 1
(start), 2 (middle) and 3 (end), a whole record has cflag 0, and the reader joins the parts with
the magic word that was cut out. Every part but the last has a length that is a multiple of 4.

An image record's payload starts with an ``IRHeader`` (struct ``IfQQ``: flag, label, id, id2).
With ``flag > 0`` the header's label field is unused and ``flag`` float32 labels follow the
header (multi-label); the encoded image is the rest. The ``.idx`` file is text, one
``key<TAB>offset`` line per record, offset being where the record's first part starts.
"""

from __future__ import annotations

import math
import os
import struct
from array import array
from dataclasses import dataclass
from types import TracebackType

import numpy as np

from fastloader.errors import FormatError
from fastloader.storage import AtomicFile

MAGIC = 0xCED7230A
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_PART_HEAD = struct.Struct("<II")
_LENGTH_BITS = 29
_LENGTH_MASK = (1 << _LENGTH_BITS) - 1
MAX_PART_LENGTH = _LENGTH_MASK
_WHOLE, _START, _MIDDLE, _END = 0, 1, 2, 3
_IR_HEADER = struct.Struct("<IfQQ")
IR_HEADER_SIZE = _IR_HEADER.size

# A caller that knows how many bytes a record spans (from the index) reads it in one pread; past
# this size (a sparse .idx makes the span cover many records) the parts are read one by one.
_MAX_SPAN_READ = 64 << 20

Readable = int | bytes | bytearray | memoryview
"""A file descriptor (read with ``os.pread``) or the file's bytes in memory."""


@dataclass(frozen=True)
class IRHeader:
    """MXNet's image record header.

    ``labels`` holds the float32 labels that follow the header when ``flag > 0`` (then
    ``flag == len(labels)`` and ``label`` is unused, 0 as MXNet writes it); it is empty for a
    single-label record, whose label is ``label``.
    """

    flag: int
    label: float
    id: int
    id2: int = 0
    labels: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.flag != len(self.labels):
            raise ValueError(f"IRHeader flag {self.flag} must equal the number of labels ({len(self.labels)})")


def single_label(label: float, id: int, id2: int = 0) -> IRHeader:
    """The header of a record with one label (``flag == 0``)."""
    return IRHeader(0, float(label), id, id2)


def multi_label(labels: tuple[float, ...] | list[float] | np.ndarray, id: int, id2: int = 0) -> IRHeader:
    """The header of a record with several float32 labels (``flag == len(labels)``)."""
    values = tuple(float(v) for v in np.asarray(labels, dtype=np.float32).reshape(-1))
    return IRHeader(len(values), 0.0, id, id2, values)


def pack(header: IRHeader, image: bytes) -> bytes:
    """The record payload for ``header`` and encoded ``image`` (the inverse of :func:`unpack`)."""
    labels = np.asarray(header.labels, dtype="<f4").tobytes()
    return _IR_HEADER.pack(header.flag, header.label, header.id, header.id2) + labels + image


def unpack_header(payload: bytes | memoryview, where: str = "<payload>") -> tuple[IRHeader, int]:
    """The header at the start of ``payload`` and the offset where the image starts."""
    if len(payload) < IR_HEADER_SIZE:
        raise FormatError(f"{where}: record of {len(payload)} bytes is shorter than an IRHeader ({IR_HEADER_SIZE})")
    flag, label, id_, id2 = _IR_HEADER.unpack_from(payload)
    start = IR_HEADER_SIZE + 4 * flag
    if start > len(payload):
        raise FormatError(f"{where}: IRHeader announces {flag} labels but the record has {len(payload)} bytes")
    labels: tuple[float, ...] = ()
    if flag > 0:
        labels = struct.unpack_from(f"<{flag}f", payload, IR_HEADER_SIZE)
        label = 0.0
    return IRHeader(flag, label, id_, id2, labels), start


def unpack(payload: bytes | memoryview, where: str = "<payload>") -> tuple[IRHeader, bytes]:
    """Split a record payload into its :class:`IRHeader` and the encoded image bytes."""
    header, start = unpack_header(payload, where)
    return header, bytes(payload[start:])


def integer_label(label: float, where: str) -> int:
    """``label`` (stored as float32) as a class index; FormatError when it is not a whole number."""
    if not math.isfinite(label) or label != int(label):
        raise FormatError(f"{where}: label {label} is not a class index (a whole number)")
    return int(label)


def _pread(source: Readable, size: int, offset: int, path: str) -> bytes:
    if isinstance(source, int):
        data = os.pread(source, size, offset)
    else:
        data = bytes(source[offset : offset + size])
    if len(data) != size:
        raise FormatError(f"{path}: short read of {size} bytes at offset {offset} (file truncated while reading?)")
    return data


def _padded(length: int) -> int:
    return (length + 3) & ~3


def _part_head(head: bytes, at: int, offset: int, file_size: int, path: str) -> tuple[int, int]:
    """(cflag, length) of the part whose 8-byte head is ``head[at:at + 8]`` (file offset ``offset``)."""
    magic, lrecord = _PART_HEAD.unpack_from(head, at)
    if magic != MAGIC:
        raise FormatError(
            f"{path}: bad RecordIO magic 0x{magic:08x} at offset {offset} (not a .rec file, or a bad .idx)"
        )
    cflag, length = lrecord >> _LENGTH_BITS, lrecord & _LENGTH_MASK
    if cflag > _END:
        raise FormatError(f"{path}: invalid continuation flag {cflag} at offset {offset}")
    if offset + _PART_HEAD.size + _padded(length) > file_size:
        raise FormatError(
            f"{path}: record part at offset {offset} declares {length} bytes, "
            f"but the file ends at {file_size} (truncated?)"
        )
    return cflag, length


def _check_sequence(cflag: int, first: bool, offset: int, path: str) -> None:
    if first and cflag not in (_WHOLE, _START):
        raise FormatError(
            f"{path}: offset {offset} is inside a split record (continuation flag {cflag}), not its start"
        )
    if not first and cflag not in (_MIDDLE, _END):
        raise FormatError(f"{path}: split record broken at offset {offset} (continuation flag {cflag})")


def read_record(source: Readable, offset: int, file_size: int, path: str, *, span: int = 0) -> bytes:
    """The payload of the record starting at ``offset``, split parts joined.

    ``span`` is how many bytes the record likely occupies (from an index): when given, the whole
    record is read with one ``pread``. Raises FormatError naming ``path`` and the offset for a
    bad magic, a broken split record, or a length that runs past ``file_size``.
    """
    if not 0 <= offset <= file_size - _PART_HEAD.size:
        raise FormatError(f"{path}: record offset {offset} is outside the file ({file_size} bytes)")
    window_start = offset
    first_read = span if _PART_HEAD.size <= span <= _MAX_SPAN_READ else _PART_HEAD.size
    window = _pread(source, min(first_read, file_size - offset), offset, path)
    parts: list[bytes] = []
    pos = offset
    while True:
        if pos + _PART_HEAD.size > file_size:
            raise FormatError(f"{path}: split record starting at offset {offset} is cut off at the end of the file")
        if pos + _PART_HEAD.size > window_start + len(window):
            window_start, window = pos, _pread(source, _PART_HEAD.size, pos, path)
        cflag, length = _part_head(window, pos - window_start, pos, file_size, path)
        _check_sequence(cflag, not parts, pos, path)
        data_at = pos + _PART_HEAD.size
        if data_at + length <= window_start + len(window):
            parts.append(window[data_at - window_start : data_at - window_start + length])
        else:
            parts.append(_pread(source, length, data_at, path))
        pos = data_at + _padded(length)
        if cflag in (_WHOLE, _END):
            return parts[0] if len(parts) == 1 else _MAGIC_BYTES.join(parts)


def read_head(source: Readable, offset: int, file_size: int, path: str, size: int) -> bytes:
    """The first ``size`` payload bytes of the record at ``offset`` (fewer if it is shorter).

    Usually one small ``pread``: reading a label does not read the image.
    """
    if not 0 <= offset <= file_size - _PART_HEAD.size:
        raise FormatError(f"{path}: record offset {offset} is outside the file ({file_size} bytes)")
    # Read no more than a page before the part's own length is known: ``size`` may come from a corrupt header.
    head = _pread(source, min(_PART_HEAD.size + min(size, 4096), file_size - offset), offset, path)
    cflag, length = _part_head(head, 0, offset, file_size, path)
    _check_sequence(cflag, True, offset, path)
    if cflag == _WHOLE or length >= size:
        wanted = min(length, size)
        if _PART_HEAD.size + wanted <= len(head):
            return head[_PART_HEAD.size : _PART_HEAD.size + wanted]
        return _pread(source, wanted, offset + _PART_HEAD.size, path)
    return read_record(source, offset, file_size, path)[:size]


def record_id(source: Readable, offset: int, file_size: int, path: str) -> int:
    """The ``id`` of the IRHeader of the record at ``offset`` (``im2rec`` writes the record's key there)."""
    return unpack_header(read_head(source, offset, file_size, path, IR_HEADER_SIZE), path)[0].id


def scan_offsets(source: Readable, file_size: int, path: str) -> np.ndarray:
    """The start offset of every record in a ``.rec`` file, in file order (for a ``.rec`` without ``.idx``)."""
    starts = array("q")  # 8 bytes a record, not a Python int each: a scan of 10M records stays small
    pos, first = 0, True
    while pos < file_size:
        if pos + _PART_HEAD.size > file_size:
            raise FormatError(f"{path}: {file_size - pos} stray bytes at offset {pos} (truncated record header)")
        cflag, length = _part_head(_pread(source, _PART_HEAD.size, pos, path), 0, pos, file_size, path)
        _check_sequence(cflag, first, pos, path)
        if first:
            starts.append(pos)
        first = cflag in (_WHOLE, _END)
        pos += _PART_HEAD.size + _padded(length)
    if not first:
        raise FormatError(f"{path}: the last split record is cut off at the end of the file")
    return np.frombuffer(starts, dtype=np.int64).copy()


def read_idx_file(idx_path: str) -> tuple[np.ndarray, np.ndarray]:
    """``(keys, offsets)`` of an MXNet ``.idx`` file, as int64 arrays in line order.

    Keys must be integers (MXNet's default ``key_type=int``).
    """
    if os.path.getsize(idx_path) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    try:
        # numpy's C parser: 10M lines without a Python object per line.
        table = np.loadtxt(idx_path, dtype=np.int64, delimiter="\t", ndmin=2, comments=None)
    except ValueError as error:
        raise FormatError(f"{idx_path}: not an MXNet .idx file of 'key<TAB>offset' integer lines ({error})") from error
    if table.shape[1] != 2:
        raise FormatError(f"{idx_path}: expected 2 tab-separated columns, found {table.shape[1]}")
    return np.ascontiguousarray(table[:, 0]), np.ascontiguousarray(table[:, 1])


class RecordIOWriter:
    """Writes a ``.rec`` and its ``.idx`` as MXNet's ``MXIndexedRecordIO`` does.

    Both files are written under temporary names and renamed into place by :meth:`close`, the
    ``.idx`` last (the commit point); leaving a ``with`` block by an exception removes them.
    """

    def __init__(self, rec_path: str | os.PathLike[str], idx_path: str | os.PathLike[str] | None = None) -> None:
        self.rec_path = os.fspath(rec_path)
        self.idx_path = None if idx_path is None else os.fspath(idx_path)
        self._rec = AtomicFile(self.rec_path)
        self._idx = None if self.idx_path is None else AtomicFile(self.idx_path, "w", encoding="ascii")
        self._offset = 0
        self.split_records = 0  # records that contained the magic word and were split

    def tell(self) -> int:
        """The offset the next record will start at."""
        return self._offset

    def write(self, key: int, payload: bytes) -> int:
        """Append ``payload`` as one record under ``key``; returns its offset."""
        offset = self._offset
        cuts = _aligned_magic_positions(payload)
        self.split_records += bool(cuts)
        start = 0
        for number, cut in enumerate(cuts):
            self._write_part(_START if number == 0 else _MIDDLE, payload[start:cut])
            start = cut + 4
        self._write_part(_END if cuts else _WHOLE, payload[start:])
        if self._idx is not None:
            self._idx.file.write(f"{int(key)}\t{offset}\n")
        return offset

    def _write_part(self, cflag: int, data: bytes) -> None:
        if len(data) > MAX_PART_LENGTH:
            raise ValueError(f"{self.rec_path}: a RecordIO record part holds at most {MAX_PART_LENGTH} bytes")
        padding = b"\x00" * (_padded(len(data)) - len(data))
        chunk = _PART_HEAD.pack(MAGIC, (cflag << _LENGTH_BITS) | len(data)) + data + padding
        self._rec.file.write(chunk)
        self._offset += len(chunk)

    def close(self) -> None:
        """Flush, fsync and rename both files into place (``.rec`` first, ``.idx`` last)."""
        self._rec.commit()
        if self._idx is not None:
            self._idx.commit()

    def abort(self) -> None:
        """Close and delete the temporary files; nothing is renamed into place."""
        self._rec.abort()
        if self._idx is not None:
            self._idx.abort()

    def __enter__(self) -> RecordIOWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _aligned_magic_positions(payload: bytes) -> list[int]:
    """Where the magic word sits at a 4-byte aligned position: where dmlc-core splits a record."""
    positions = []
    at = payload.find(_MAGIC_BYTES)
    while at >= 0:
        if at % 4 == 0:
            positions.append(at)
            at = payload.find(_MAGIC_BYTES, at + 4)
        else:
            at = payload.find(_MAGIC_BYTES, at + 1)
    return positions
