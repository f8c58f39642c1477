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

Durability comes in whole files (a resumed run redoes at most one): see
:mod:`fastloader.pack.shard_sink`. A file is checked by reading its footer back before it is recorded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastloader.errors import FormatError
from fastloader.formats.field_values import check_kind, check_value, encode_value
from fastloader.formats.parquet_pack import (
    FILE_VERSION,
    IMAGE_COLUMN,
    KEY_COLUMN,
    LABEL_COLUMN,
    PACK_FORMAT,
    PART_PREFIX,
    SCHEMA_META_KEY,
    ParquetPackState,
    column_names,
    import_pyarrow,
)
from fastloader.pack.shard_sink import ShardedSink
from fastloader.storage import AtomicFile

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


@dataclass(frozen=True)
class _Row:
    """A checked item: its key (as the column holds it), image, label and field values (``check_value``)."""

    key: str
    image: bytes
    label: int
    values: dict[str, Any]


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

    def append(self, row: _Row) -> None:
        """Buffer ``row``: its cells are all made before any buffer grows, so a failure leaves no half row."""
        cells, encodings = dict(row.values), {}
        for name, value in row.values.items():
            if self.kinds[name] == "array":
                encodings[name] = self.encodings.get(name) or _array_encoding(value)
                if encodings[name][0] == "npy":
                    cells[name] = encode_value("array", value)
        size = len(row.image) + sum(
            len(cell) if isinstance(cell, (bytes, str)) else getattr(cell, "nbytes", 8) for cell in cells.values()
        )
        self.encodings.update(encodings)
        self.buffer[KEY_COLUMN].append(row.key)
        self.buffer[IMAGE_COLUMN].append(row.image)
        self.buffer[LABEL_COLUMN].append(row.label)
        for name in self.kinds:
            self.field_buffer[name].append(cells.get(name))  # None, a null, when missing: JSON's null is "null"
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
        meta = {"format": PACK_FORMAT, "version": FILE_VERSION, "key": KEY_COLUMN, "image": IMAGE_COLUMN}
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
        except (OSError, ValueError):  # pyarrow's errors are either
            pass
        self.target.abort()


class ParquetSink(ShardedSink[ParquetPackState, _OpenPart, _Row]):
    """Write packed samples into Parquet files of ``shard_size`` rows under ``dst_dir`` (see module doc).

    Implements :class:`fastloader.pack.sink.Sink`. ``fields``: the pack's fields (name -> kind),
    each a column. Opening a destination that holds another pack (another fingerprint or fields, a
    tar pack, an LMDB, or ``part-*.parquet`` files no pack recorded) raises
    :class:`~fastloader.errors.FormatError`. ``add`` raises ValueError, writing nothing, for a field
    value not of its kind (or text UTF-8 cannot hold, or a label outside int64); the engine may then
    ``add_skipped`` the same position.
    """

    SUFFIX = ".parquet"

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
        for name, value in (("row_group_size", row_group_size), ("row_group_bytes", row_group_bytes)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.row_group_size, self.row_group_bytes = row_group_size, row_group_bytes
        self._kinds = {name: check_kind(kind, name) for name, kind in (fields or {}).items()}
        self._columns = column_names(list(self._kinds))
        fresh = ParquetPackState(fingerprint=fingerprint, fields=dict(self._kinds))
        super().__init__(dst_dir, fresh, prefix=PART_PREFIX, shard_size=shard_size)

    def _encode(self, key: str, label: int, data: bytes, fields: Mapping[str, Any]) -> _Row:
        """The row of an item, every value checked and in its column's Python type (JSON as its text)."""
        values: dict[str, Any] = {}
        for name, value in fields.items():
            kind = self._kinds.get(name)
            if kind is None:
                raise ValueError(f"{key}: field {name!r} is not one of this pack's fields ({sorted(self._kinds)})")
            values[name] = check_value(kind, value, f"{key}: field {name!r}")
            try:
                if kind in ("text", "json"):  # lone surrogates: valid str (and JSON text), not UTF-8
                    values[name] = encode_value(kind, values[name]).decode("utf-8")
            except UnicodeEncodeError as error:
                raise ValueError(f"{key}: field {name!r}: {error}") from None
        return _Row(_safe_key(key), bytes(data), check_value("int", label, f"{key}: label"), values)

    def _append(self, row: _Row) -> int:
        if self._file is not None and not self._file.fits(row.values):
            self._close_file(self._next_position)  # an array field changed dtype or dimensions: the next file
        if self._file is None:
            self._file = _OpenPart(self.dst_dir, self._next_name(), self._kinds, self._columns)
        part = self._file
        part.append(row)
        if part.buffered_rows >= self.row_group_size or part.buffered_bytes >= self.row_group_bytes:
            part.flush()
        return part.rows

    def _commit(self, part: _OpenPart) -> int:
        """Write the footer, fsync, rename into place, read the footer back."""
        part.commit()
        final = self.dst_dir / part.name
        _, pq = import_pyarrow()
        rows: int = pq.read_metadata(final).num_rows
        if rows != part.rows:
            raise FormatError(f"{final}: its footer counts {rows} rows, {part.rows} were written")
        return rows

    def _discard(self, part: _OpenPart) -> None:
        part.discard()
