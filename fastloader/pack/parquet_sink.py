"""The pack output that writes Parquet files (``fastloader pack --format parquet``).

The layout (files ``part-NNNNNN.parquet``, their columns and schema metadata, the manifest) is
described in :mod:`fastloader.formats.parquet_pack`; read it back with
``fastloader.datasets.parquet.ParquetDataset(DST)``, or with any Parquet reader.

Row groups: random access reads a whole row group (``fastloader.datasets.parquet``), so they are
small for Parquet: ``row_group_size`` rows (default 128), cut earlier when they reach
``row_group_bytes`` (default 32 MiB) of images and fields. 128 ImageNet-sized JPEGs (~110 KB) are
~14 MB: one read a sample costs, cheap for shard-aware shuffling, and large enough that per-row-group
overheads (footer entries, page headers) stay negligible. Hugging Face writes image datasets in row
groups of 100 rows for the same reason.

Durability comes in whole files, as for tar shards (``fastloader.pack.tar_sink``): a file is
written under a hidden temporary name, fsynced, renamed, its footer read back, and only then
recorded in the progress file (atomically replaced). A run killed at any moment leaves at most one
unrecorded file (temporary or renamed), which the next run deletes and rewrites from the recorded
source position: 0 samples lost, 0 duplicated. ``checkpoint()`` makes skipped items durable but never
closes a file early, so a resumed run redoes up to one file of work.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fastloader.errors import FormatError
from fastloader.fields.values import check_kind, check_value, encode_value
from fastloader.formats.bad_samples import BadSample
from fastloader.formats.parquet_pack import (
    IMAGE_COLUMN,
    KEY_COLUMN,
    LABEL_COLUMN,
    MANIFEST_NAME,
    PACK_FORMAT,
    PACK_VERSION,
    PART_PREFIX,
    PROGRESS_NAME,
    SCHEMA_META_KEY,
    ParquetPackState,
    column_names,
    import_pyarrow,
    part_name,
)
from fastloader.formats.tar_manifest import ShardRecord
from fastloader.storage import AtomicFile, atomic_write_bytes

DEFAULT_ROW_GROUP_SIZE = 128
DEFAULT_ROW_GROUP_BYTES = 32 << 20
# numpy dtypes a list column holds exactly (Parquet has no float16; other byte orders go as .npy).
_LIST_DTYPES = frozenset(np.dtype(t).str for t in ("?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f4", "f8"))
_BINARY_KINDS = ("image", "bytes")


def _array_encoding(value: np.ndarray) -> tuple[str, str | None]:
    """How an array field's column holds values like ``value``: a list of its dtype, or ``.npy`` bytes."""
    return ("list", value.dtype.str) if value.ndim == 1 and value.dtype.str in _LIST_DTYPES else ("npy", None)


def _fits(encoding: tuple[str, str | None], value: np.ndarray) -> bool:
    return encoding[0] == "npy" or (value.ndim == 1 and value.dtype.str == encoding[1])


def _safe_key(key: str) -> str:
    """A key a UTF-8 column holds: undecodable file-name bytes (surrogates) written as escapes."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return key.encode("utf-8", "backslashreplace").decode("utf-8")
    return key


class _OpenPart:
    """The file being written, under its temporary name: rows buffered a row group at a time."""

    def __init__(self, directory: Path, name: str, kinds: Mapping[str, str], columns: Mapping[str, str]) -> None:
        self.name = name
        self.kinds, self.columns = kinds, columns
        self.target = AtomicFile(directory / name)  # .part-NNNNNN.parquet.XXXX.tmp until committed
        self.writer: Any = None  # opened by the first row group: its schema needs the array encodings
        self.encodings: dict[str, tuple[str, str | None]] = {}  # array fields: ("list", dtype) or ("npy", None)
        self.rows = 0  # rows in the file, written or buffered
        self._empty_buffer()

    def _empty_buffer(self) -> None:
        self.buffer: dict[str, list[Any]] = {name: [] for name in (KEY_COLUMN, IMAGE_COLUMN, LABEL_COLUMN)}
        self.field_buffer: dict[str, list[Any]] = {name: [] for name in self.kinds}
        self.buffered_rows = self.buffered_bytes = 0

    def fits(self, values: Mapping[str, Any]) -> bool:
        """Whether the array values fit the columns of this file (see ``fastloader.formats.parquet_pack``)."""
        return all(
            _fits(self.encodings[name], value)
            for name, value in values.items()
            if self.kinds[name] == "array" and name in self.encodings
        )

    def append(self, key: str, label: int, data: bytes, values: Mapping[str, Any]) -> None:
        self.buffer[KEY_COLUMN].append(_safe_key(key))
        self.buffer[IMAGE_COLUMN].append(data)
        self.buffer[LABEL_COLUMN].append(label)
        size = len(data)
        for name, kind in self.kinds.items():
            if name not in values:
                self.field_buffer[name].append(None)  # a null: JSON's null is the text "null"
                continue
            value = values[name]
            if kind == "array":
                self.encodings.setdefault(name, _array_encoding(value))
                if self.encodings[name][0] == "npy":
                    value = encode_value("array", value)
            elif kind == "json":
                value = encode_value("json", value).decode("utf-8")
            size += len(value) if isinstance(value, (bytes, str)) else getattr(value, "nbytes", 8)
            self.field_buffer[name].append(value)
        self.rows += 1
        self.buffered_rows += 1
        self.buffered_bytes += size

    def _schema(self) -> Any:
        pa, _ = import_pyarrow()
        types = {"image": pa.binary(), "bytes": pa.binary(), "text": pa.string(), "json": pa.string()}
        types |= {"int": pa.int64(), "float": pa.float64()}
        fields = [pa.field(KEY_COLUMN, pa.string()), pa.field(IMAGE_COLUMN, pa.binary())]
        fields.append(pa.field(LABEL_COLUMN, pa.int64()))
        described = []
        for name, kind in self.kinds.items():
            entry: dict[str, Any] = {"name": name, "column": self.columns[name], "kind": kind}
            if kind == "array":
                encoding, dtype = self.encodings.setdefault(name, ("npy", None))  # no value yet: .npy holds any
                entry["encoding"] = encoding
                if encoding == "list":
                    entry["dtype"] = dtype
                    arrow_type = pa.list_(pa.from_numpy_dtype(np.dtype(dtype)))
                else:
                    arrow_type = pa.binary()
            else:
                arrow_type = types[kind]
            fields.append(pa.field(self.columns[name], arrow_type))
            described.append(entry)
        meta = {"format": PACK_FORMAT, "version": PACK_VERSION, "key": KEY_COLUMN, "image": IMAGE_COLUMN}
        meta |= {"label": LABEL_COLUMN, "fields": described}
        return pa.schema(fields, metadata={SCHEMA_META_KEY: json.dumps(meta).encode()})

    def _open_writer(self) -> None:
        _, pq = import_pyarrow()
        schema = self._schema()
        binary = {IMAGE_COLUMN} | {self.columns[n] for n, k in self.kinds.items() if k in _BINARY_KINDS}
        binary |= {self.columns[n] for n, e in self.encodings.items() if e[0] == "npy"}
        lists = {self.columns[n] for n, e in self.encodings.items() if e[0] == "list"}
        # Per leaf column: images, bytes and .npy are stored as they are (compressed already, or
        # noise); the rest with snappy, dictionary-encoded where values repeat.
        compression = {name: "NONE" if name in binary else "SNAPPY" for name in schema.names if name not in lists}
        compression |= {f"{name}.list.element": "SNAPPY" for name in lists}
        repeat = [n for n in schema.names if n not in binary and n not in lists and n != KEY_COLUMN]
        self.writer = pq.ParquetWriter(
            self.target.file,
            schema,
            compression=compression,
            use_dictionary=repeat,
            write_statistics=[LABEL_COLUMN, *(n for n in repeat if n != LABEL_COLUMN)],
            write_page_checksum=True,
        )

    def flush(self) -> None:
        """Write the buffered rows as one row group."""
        if not self.buffered_rows:
            return
        pa, _ = import_pyarrow()
        if self.writer is None:
            self._open_writer()
        schema = self.writer.schema
        arrays = [pa.array(self.buffer[name], schema.field(name).type) for name in (KEY_COLUMN, IMAGE_COLUMN)]
        arrays.append(pa.array(self.buffer[LABEL_COLUMN], pa.int64()))
        for name in self.kinds:
            column_type = schema.field(self.columns[name]).type
            arrays.append(pa.array(self.field_buffer[name], column_type))
        self.writer.write_table(pa.Table.from_arrays(arrays, schema=schema))  # one call, one row group
        self._empty_buffer()

    def commit(self) -> None:
        """Write what is buffered and the footer, fsync, rename into place."""
        self.flush()
        self.writer.close()  # the footer; the file stays open (the writer did not open it)
        self.target.commit()

    def discard(self) -> None:
        try:
            if self.writer is not None:
                self.writer.close()  # may fail to flush (a full disk): the file goes anyway
        except OSError:
            pass
        self.target.abort()


class ParquetSink:
    """Write packed samples into Parquet files of ``shard_size`` rows under ``dst_dir`` (see module doc).

    Implements :class:`fastloader.pack.sink.Sink`. ``fields``: the pack's fields (name -> kind),
    each a column. Opening a destination that holds another pack (another fingerprint or fields, a
    tar pack, an LMDB, or ``part-*.parquet`` files no pack recorded) raises
    :class:`~fastloader.errors.FormatError`. ``add`` raises ValueError, writing nothing, for a field
    value not of its kind; the engine may then ``add_skipped`` the same position.
    """

    def __init__(
        self,
        dst_dir: str | os.PathLike[str],
        fingerprint: dict[str, Any],
        *,
        shard_size: int = 10000,
        row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
        row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
        fields: Mapping[str, str] | None = None,
    ) -> None:
        import_pyarrow()  # a clear ImportError before anything is written
        for name, value in (("shard_size", shard_size), ("row_group_size", row_group_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(row_group_bytes, int) or row_group_bytes < 1:
            raise ValueError(f"row_group_bytes must be a positive integer, got {row_group_bytes!r}")
        self.dst_dir = Path(dst_dir)
        self.shard_size, self.row_group_size, self.row_group_bytes = shard_size, row_group_size, row_group_bytes
        self._kinds = {name: check_kind(kind, name) for name, kind in (fields or {}).items()}
        self._columns = column_names(list(self._kinds))
        if self.dst_dir.exists() and not self.dst_dir.is_dir():
            raise FormatError(f"{self.dst_dir}: exists and is not a directory")
        self.dst_dir.mkdir(parents=True, exist_ok=True)
        fingerprint = json.loads(json.dumps(fingerprint, sort_keys=True))  # as it reads back from JSON
        self._state = self._open_state(fingerprint)
        self._pending_skipped: list[BadSample] = []
        self._next_position = self._state.position  # the lowest position add / add_skipped accept
        self._part: _OpenPart | None = None
        self._closed = False
        if not self._state.complete:
            self._discard_unrecorded()

    def _open_state(self, fingerprint: dict[str, Any]) -> ParquetPackState:
        for name in (MANIFEST_NAME, PROGRESS_NAME):
            if (self.dst_dir / name).exists():
                state = ParquetPackState.read(self.dst_dir / name)
                if state.fingerprint != fingerprint or state.fields != self._kinds:
                    raise FormatError(
                        f"{self.dst_dir}: holds a different pack (fingerprint {state.fingerprint}, fields "
                        f"{state.fields}); pack into a new directory or delete this one"
                    )
                return state
        others = {"fastloader-tar.json": "tar", "fastloader-tar.progress.json": "tar", "data.mdb": "LMDB"}
        for other, what in others.items():
            if (self.dst_dir / other).exists():
                raise FormatError(f"{self.dst_dir}: holds a {what} pack; pack Parquet into a new directory")
        if self._part_files():
            raise FormatError(
                f"{self.dst_dir}: holds {PART_PREFIX}-*.parquet files that no fastloader pack recorded; "
                "refusing to overwrite them (pack into an empty directory)"
            )
        return ParquetPackState(fingerprint=fingerprint, created=int(time.time()), fields=dict(self._kinds))

    def _part_files(self) -> list[Path]:
        pattern = re.compile(rf"{PART_PREFIX}-\d+\.parquet")
        return [path for path in self.dst_dir.iterdir() if pattern.fullmatch(path.name)]

    def _discard_unrecorded(self) -> None:
        """Delete what a killed run left beyond the recorded state: a temporary or an unrecorded file."""
        recorded = {shard.name for shard in self._state.shards}
        for path in self._part_files():
            if path.name not in recorded:
                path.unlink()
        # Temporaries of a killed run: the open file, and atomic_write's of the progress file.
        for path in [*self.dst_dir.glob(f".{PART_PREFIX}-*"), *self.dst_dir.glob("._fastloader-parquet*")]:
            if path.name.endswith(".tmp"):
                path.unlink()
        for name in recorded:
            if not (self.dst_dir / name).is_file():
                raise FormatError(f"{self.dst_dir}: file {name} is recorded as complete but missing")

    # -- the Sink protocol ------------------------------------------------------------------------

    def resume_position(self) -> int:
        return self._state.position

    def add(self, position: int, key: str, label: int, data: bytes, fields: Mapping[str, Any] | None = None) -> None:
        self._check_position(position)
        values: dict[str, Any] = {}
        for name, value in (fields or {}).items():
            kind = self._kinds.get(name)
            if kind is None:
                raise ValueError(f"{key}: field {name!r} is not one of this pack's fields ({sorted(self._kinds)})")
            values[name] = check_value(kind, value, f"{key}: field {name!r}")
            if kind == "text":
                encode_value("text", values[name])  # UnicodeEncodeError (a ValueError) for lone surrogates
        if self._part is not None and not self._part.fits(values):
            self._close_part()  # an array field changed dtype or dimensions: the next file gets its type
        if self._part is None:
            self._part = _OpenPart(self.dst_dir, part_name(len(self._state.shards)), self._kinds, self._columns)
        part = self._part
        part.append(key, int(label), bytes(data), values)
        self._next_position = position + 1
        if part.buffered_rows >= self.row_group_size or part.buffered_bytes >= self.row_group_bytes:
            part.flush()
        if part.rows >= self.shard_size:
            self._close_part()

    def add_skipped(self, position: int, key: str, reason: str) -> None:
        self._check_position(position)
        self._pending_skipped.append(BadSample(position, key, reason))
        self._next_position = position + 1

    def skipped(self) -> list[BadSample]:
        return [*self._state.skipped, *self._pending_skipped]

    def checkpoint(self) -> None:
        """Record skipped items when no file is open; an open file stays open (see module doc)."""
        self._check_open()
        if self._part is None and self._next_position > self._state.position:
            self._record(self._state.shards)

    def finish(self, classes: list[str] | None, meta: dict[str, Any]) -> None:
        self._check_open()
        if self._part is not None:
            self._close_part()  # the last, possibly short, file
        self._state = dataclasses.replace(
            self._state,
            position=self._next_position,
            skipped=(*self._state.skipped, *self._pending_skipped),
            complete=True,
            classes=None if classes is None else list(classes),
            meta=dict(meta),
        )
        self._pending_skipped = []
        atomic_write_bytes(self.dst_dir / MANIFEST_NAME, self._state.to_json())  # the commit point
        (self.dst_dir / PROGRESS_NAME).unlink(missing_ok=True)
        self._closed = True

    def close(self) -> None:
        if self._closed:
            return
        if self._part is not None:
            self._part.discard()  # not durable: the next run rewrites it
            self._part = None
        elif not self._state.complete:
            self.checkpoint()
        self._closed = True

    # -- internals --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self.dst_dir}: this Parquet sink is closed")

    def _check_position(self, position: int) -> None:
        self._check_open()
        if self._state.complete:
            raise ValueError(f"{self.dst_dir}: the pack is already finished; nothing more can be added")
        if position < self._next_position:
            raise ValueError(
                f"{self.dst_dir}: source position {position} is not after the previous one "
                f"({self._next_position - 1}); positions must strictly increase from resume_position()"
            )

    def _close_part(self) -> None:
        """Make the open file durable: footer, fsync, rename into place, read back, then record it."""
        if self._part is None:
            raise RuntimeError("no file is open")
        part, self._part = self._part, None
        try:
            part.commit()
        except BaseException:
            part.discard()
            raise
        final = self.dst_dir / part.name
        _fsync_directory(self.dst_dir)
        _, pq = import_pyarrow()
        rows = pq.read_metadata(final).num_rows
        if rows != part.rows:
            raise FormatError(f"{final}: its footer counts {rows} rows, {part.rows} were written")
        self._record((*self._state.shards, ShardRecord(part.name, part.rows, self._next_position)))

    def _record(self, shards: tuple[ShardRecord, ...]) -> None:
        """Replace the progress file: ``shards`` and every skipped item so far are now durable."""
        self._state = dataclasses.replace(
            self._state,
            shards=shards,
            position=self._next_position,
            skipped=(*self._state.skipped, *self._pending_skipped),
        )
        self._pending_skipped = []
        atomic_write_bytes(self.dst_dir / PROGRESS_NAME, self._state.to_json())


def _fsync_directory(directory: Path) -> None:
    """Persist a rename: without it a power cut can bring back the old directory entry."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
