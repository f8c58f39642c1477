"""The index of a file list (``path label`` lines, or a ``.csv`` / ``.tsv`` with a header naming its
columns): parsed once into the arrays of :mod:`fastloader.datasets.folder_index`, which persists,
memory-maps and rebuilds it as it does an image folder's."""

from __future__ import annotations

import csv
import itertools
import os
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TextIO

import numpy as np

from fastloader.datasets.folder_index import LIST_SETTINGS, RESERVED_COLUMNS, IndexMeta, content_id
from fastloader.errors import FormatError
from fastloader.formats.index_file import pack_strings


@dataclass
class _ListTable:
    """A list file's columns and its rows ``(where, path, label text or None, field cells)``."""

    fields: tuple[str, ...]
    label_column: str | None
    rows: Iterator[tuple[str, str, str | None, list[str]]]


def parse_file_list(list_path: str) -> tuple[IndexMeta, dict[str, np.ndarray]]:
    """Index arrays for a list file: ``path label`` lines (whitespace; the path may hold spaces), or
    rows of a ``.csv`` (commas) or ``.tsv`` (tabs) with the path, the label and text columns (see
    :class:`~fastloader.datasets.folder.FileListSource`)."""
    started = time.time_ns()
    real = os.path.realpath(list_path)
    mtime_ns = os.stat(real).st_mtime_ns
    keys, key_lengths, labels = bytearray(), array("q"), array("q")
    with open(list_path, encoding="utf-8", errors="surrogateescape", newline="") as file:
        table = (
            _table_rows(list_path, file) if list_path.lower().endswith(_TABLE_SUFFIXES) else _line_rows(list_path, file)
        )
        cells: list[bytearray] = [bytearray() for _ in table.fields]
        cell_lengths = [array("q") for _ in table.fields]
        for where, path, label, extra in table.rows:
            if not path:
                raise FormatError(f"{where}: empty path")
            try:
                labels.append(-1 if label is None else int(label))
            except (ValueError, OverflowError):
                raise FormatError(f"{where}: label {label!r} is not an integer") from None
            encoded = path.encode("utf-8", "surrogateescape")
            keys += encoded
            key_lengths.append(len(encoded))
            for blob, lengths, cell in zip(cells, cell_lengths, extra):
                # Bytes as in the file: a cell that is not UTF-8 fails when read (naming it), not here.
                data = cell.encode("utf-8", "surrogateescape")
                blob += data
                lengths.append(len(data))
    if not labels:
        raise FormatError(f"{list_path}: the file list has no entries")
    label_array = np.frombuffer(labels, dtype=np.int64)
    watched, watched_offsets = pack_strings([real])
    arrays: dict[str, np.ndarray] = {
        "keys": np.frombuffer(bytes(keys), dtype=np.uint8),
        "key_offsets": _offsets(key_lengths),
        "labels": label_array,
        "label_range": np.array([label_array.min(), label_array.max()], dtype=np.int64),
        "watched": watched,
        "watched_offsets": watched_offsets,
        "watched_mtime_ns": np.array([mtime_ns], dtype=np.int64),
    }
    for number, (blob, lengths) in enumerate(zip(cells, cell_lengths)):
        arrays[f"field{number}"] = np.frombuffer(bytes(blob), dtype=np.uint8)
        arrays[f"field{number}_offsets"] = _offsets(lengths)
    meta = IndexMeta(real, LIST_SETTINGS, (), started, content_id(arrays), table.fields, table.label_column)
    return meta, arrays


def _offsets(lengths: array[int]) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(np.frombuffer(lengths, dtype=np.int64), out=offsets[1:])
    return offsets


_TABLE_SUFFIXES = (".csv", ".tsv")


def _line_rows(list_path: str, file: TextIO) -> _ListTable:
    """``path label`` lines: the label is the last word, the path all before it (spaces included)."""

    def rows() -> Iterator[tuple[str, str, str | None, list[str]]]:
        for number, line in enumerate(file, 1):
            text = line.strip()
            if not text:
                continue
            fields = text.rsplit(None, 1)
            if len(fields) != 2:
                hint = " (CSV lists must be named *.csv)" if "," in text else ""
                raise FormatError(f"{list_path}, line {number}: expected 'path label', got {text!r}{hint}")
            yield f"{list_path}, line {number}", fields[0], fields[1], []

    return _ListTable((), None, rows())


def _table_rows(list_path: str, file: TextIO) -> _ListTable:
    """The rows of a ``.csv`` or ``.tsv``: a first row whose second cell is not an integer is a
    header naming the columns (see :class:`~fastloader.datasets.folder.FileListSource`)."""
    if list_path.lower().endswith(".tsv"):  # tab-separated values have no quoting: a cell is what lies between tabs
        reader = csv.reader(file, delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(file)
    # Blank lines (or holding only spaces) are skipped; the others are rows, named by their line.
    rows = ((f"{list_path}, line {reader.line_num}", row) for row in reader if row and (len(row) > 1 or row[0].strip()))
    first = next(rows, None)
    if first is None:
        return _ListTable((), None, iter(()))
    where, row = first
    if len(row) >= 2 and _is_int(row[1].strip()):
        return _ListTable((), None, _data_rows(itertools.chain([first], rows), None, 0, 1, []))
    header = [cell.strip() for cell in row]
    if "" in header or len(set(header)) != len(header):
        raise FormatError(f"{where}: the header row must name every column once, got {row!r}")
    if "path" in header:
        path_at, label_at = header.index("path"), header.index("label") if "label" in header else None
    elif len(header) >= 2:
        path_at, label_at = 0, 1
    else:
        raise FormatError(f"{where}: a header row names a 'path' column or at least two columns (path, label)")
    fields = [i for i in range(len(header)) if i not in (path_at, label_at)]
    reserved = [header[i] for i in fields if header[i] in RESERVED_COLUMNS]
    if reserved:
        raise FormatError(f"{where}: a column named {reserved[0]!r} cannot be a field (it means the {reserved[0]})")
    label_column = None if label_at is None else header[label_at]
    return _ListTable(
        tuple(header[i] for i in fields), label_column, _data_rows(rows, header, path_at, label_at, fields)
    )


def _data_rows(
    rows: Iterator[tuple[str, list[str]]],
    header: list[str] | None,
    path_at: int,
    label_at: int | None,
    fields: list[int],
) -> Iterator[tuple[str, str, str | None, list[str]]]:
    width = 2 if header is None else len(header)
    for where, row in rows:
        if len(row) != width:
            if header is None:
                expected = "2 fields 'path,label' (more columns need a header row naming them)"
            else:
                expected = f"{width} fields ({','.join(header)})"
            raise FormatError(f"{where}: expected {expected}, got {len(row)}: {row!r}")
        label = None if label_at is None else row[label_at].strip()
        yield where, row[path_at].strip(), label, [row[i] for i in fields]


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True
