"""What ``fastloader pack --format parquet`` writes: the layout of its files and its manifest.

Layout of a destination directory::

    part-000000.parquet                rows 0 .. shard_size - 1 (see "columns" below)
    part-000001.parquet
    ...
    _fastloader-parquet.progress.json  while packing: completed files, source position, skipped items
    _fastloader-parquet.json           written by finish(), last: the commit point that makes it readable

The manifest's name starts with ``_`` so that Parquet readers of the directory (pyarrow, pandas,
Spark, DuckDB) skip it as they skip ``_SUCCESS``: ``pandas.read_parquet(DST)`` reads the pack.

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

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastloader.errors import FormatError
from fastloader.formats.bad_samples import BadSample
from fastloader.formats.tar_manifest import ShardRecord

MANIFEST_NAME = "_fastloader-parquet.json"
PROGRESS_NAME = "_fastloader-parquet.progress.json"
PACK_FORMAT = "fastloader-parquet"
PACK_VERSION = 1
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


def part_name(number: int) -> str:
    return f"{PART_PREFIX}-{number:06d}.parquet"


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


@dataclass(frozen=True)
class ParquetPackState:
    """What a Parquet pack has made durable: the progress file while packing, the manifest once complete.

    ``shards`` are the completed files (name, rows, the source position just after their last row);
    ``fields`` the pack's fields (name -> kind), known even when no file holds a row.
    """

    fingerprint: dict[str, Any]
    created: int
    fields: dict[str, str] = field(default_factory=dict)
    position: int = 0  # the first source position not yet durable
    shards: tuple[ShardRecord, ...] = ()
    skipped: tuple[BadSample, ...] = ()
    complete: bool = False
    classes: list[str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    format: str = PACK_FORMAT
    version: int = PACK_VERSION

    @property
    def count(self) -> int:
        return sum(shard.count for shard in self.shards)

    def to_json(self) -> bytes:
        return json.dumps({**dataclasses.asdict(self), "count": self.count}, indent=1).encode()

    @classmethod
    def read(cls, path: Path) -> ParquetPackState:
        try:
            raw = json.loads(path.read_bytes())
            if raw.get("format") != PACK_FORMAT or raw.get("version") != PACK_VERSION:
                raise ValueError(
                    f"format {raw.get('format')!r} v{raw.get('version')}, expected {PACK_FORMAT!r} v{PACK_VERSION}"
                )
            raw.pop("count", None)
            raw["shards"] = tuple(ShardRecord(**shard) for shard in raw["shards"])
            raw["skipped"] = tuple(BadSample(**item) for item in raw["skipped"])
            state = cls(**raw)
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise FormatError(f"{path}: unreadable Parquet pack state ({error})") from None
        for shard in state.shards:
            if "/" in shard.name or shard.name.startswith("."):  # the manifest only ever names files beside it
                raise FormatError(f"{path}: bad file name {shard.name!r}")
        return state


def is_pack_dir(directory: str | Path) -> bool:
    """True when ``directory`` holds a (possibly unfinished) ``fastloader pack --format parquet``."""
    return any((Path(directory) / name).exists() for name in (MANIFEST_NAME, PROGRESS_NAME))


def read_pack_manifest(directory: str | Path) -> ParquetPackState:
    """The manifest of a finished Parquet pack; FormatError naming the directory when it is unfinished."""
    manifest = Path(directory) / MANIFEST_NAME
    if not manifest.exists():
        started = (Path(directory) / PROGRESS_NAME).exists()
        raise FormatError(
            f"{directory}: incomplete pack: no {MANIFEST_NAME} "
            + ("(the pack was interrupted or is still running; run it again to finish)" if started else "found")
        )
    state = ParquetPackState.read(manifest)
    if not state.complete:
        raise FormatError(f"{manifest}: incomplete pack (not marked complete)")
    return state
