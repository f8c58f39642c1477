"""What ``fastloader pack --format parquet`` writes: the layout of its files and its manifest.

Layout of a destination directory::

    part-000000.parquet                rows 0 .. shard_size - 1 (see "columns" below)
    part-000001.parquet
    ...
    _fastloader-parquet.progress.json  while packing: completed files, source position, skipped items
    _fastloader-parquet.json           written by finish(), last: the commit point that makes it readable

The manifest's name starts with ``_`` so that Parquet readers of the directory (pyarrow, pandas,
Spark, DuckDB) skip it as they skip ``_SUCCESS``: ``pandas.read_parquet(DST)`` reads the pack.
Both are the JSON object of :mod:`fastloader.formats.pack_state`, with its keys in this order:
``fingerprint``, ``created``, ``fields`` (the pack's fields, name -> kind), ``position``, ``shards``,
``skipped``, ``complete``, ``classes``, ``meta``, ``format`` (``fastloader-parquet``), ``version`` (2),
``count``. Version 2 added each file's ``size`` and ``sha256`` (of its bytes), checked by ``verify``.

Columns of every file, in order: ``key`` (string: the item's key in the packed source), ``image``
(binary: the encoded image), ``label`` (int64, -1 for none), then one column per field, named as
the field (or ``_<name>``, again until unique, when the name is ``key``, ``image`` or ``label``):

========  ==============================================================================
kind      column
========  ==============================================================================
image     binary (encoded image bytes)
bytes     binary
text      string
json      string (the JSON text, ``encode_value("json", ...)``)
int       int64
float     float64
array     ``list<value type>`` when 1-D values of one dtype fill the file (bool, int8..64,
          uint8..64, float32, float64); else binary holding ``.npy`` (``encode_value``)
========  ==============================================================================

A missing field is a null. Each file's Parquet schema metadata holds, under the key
``fastloader``, the JSON ``SchemaMeta`` of that file: which columns hold the key, image and label,
and for each field its name, column, kind and encoding (``list`` with its numpy dtype, or ``npy``),
so reading it back gives exact names, kinds and values whatever another reader makes of it. A
column has one type per file, so an array field whose dtype or dimensions change mid-file ends
that file early (the next one gets the type it needs): files hold ``shard_size`` rows otherwise.

Page checksums are written (``fastloader verify`` reads with checksum verification, so a flipped
byte is found), images and bytes are stored uncompressed (they are compressed already), other
columns with snappy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from fastloader.formats.pack_state import PackState

MANIFEST_NAME = "_fastloader-parquet.json"
PROGRESS_NAME = "_fastloader-parquet.progress.json"
PACK_FORMAT = "fastloader-parquet"
PACK_VERSION = 2
FILE_VERSION = 1  # of each file's schema metadata (the files did not change when the manifest did)
SCHEMA_META_KEY = b"fastloader"  # the key of each file's schema metadata
PART_PREFIX = "part"
KEY_COLUMN, IMAGE_COLUMN, LABEL_COLUMN = "key", "image", "label"
NO_LABEL = -1


def import_pyarrow() -> tuple[Any, Any]:
    """``pyarrow`` and ``pyarrow.parquet``, imported when Parquet is first used (never by ``import fastloader``)."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as error:
        raise ImportError(f"Parquet needs pyarrow ({error}): pip install fastloader[parquet]") from error
    return pyarrow, pyarrow.parquet


def column_names(fields: list[str]) -> dict[str, str]:
    """The column of each field: its own name unless a reserved one or another column has it."""
    taken = {KEY_COLUMN, IMAGE_COLUMN, LABEL_COLUMN}
    columns: dict[str, str] = {}
    for name in fields:
        column = name
        while column in taken:
            column = f"_{column}"
        taken.add(column)
        columns[name] = column
    return columns


@dataclass(frozen=True, kw_only=True)
class ParquetPackState(PackState):
    """What a Parquet pack has made durable: the progress file while packing, the manifest once complete.

    ``shards`` are the completed files; ``fields`` the pack's fields (name -> kind), known even when
    no file holds a row.
    """

    MANIFEST_NAME: ClassVar[str] = MANIFEST_NAME
    PROGRESS_NAME: ClassVar[str] = PROGRESS_NAME
    FORMAT: ClassVar[str] = PACK_FORMAT
    VERSIONS: ClassVar[tuple[int, ...]] = (1, PACK_VERSION)  # 1: before content hashes
    KEYS: ClassVar[tuple[str, ...]] = tuple(
        "fingerprint created fields position shards skipped complete classes meta format version count".split()
    )
    IDENTITY: ClassVar[tuple[str, ...]] = ("fingerprint", "fields")
    WHAT: ClassVar[str] = "Parquet"

    fields: dict[str, str] = field(default_factory=dict)
