"""Every kind of source a path may name, and how to open one: the registry ``fastloader pack``, ``scan``,
``verify``, ``fields`` and ``doctor`` share.

``detect_source_kind(path)`` tells the kind from the path (an image folder, a file list, a ``.rec``, a
``.tfrecord`` pattern, tar shards, Parquet files, a fastloader LMDB); ``open_source(path, kind)`` opens it
as a :class:`~fastloader.datasets.base.Source`. Each kind's module is imported when it is opened.
"""

from __future__ import annotations

import importlib
import os

from fastloader.datasets.base import Source


def detect_source_kind(src: str) -> str:
    """The source kind ``fastloader pack`` reads from ``src`` (a key of ``SOURCE_KINDS``)."""
    if os.path.isdir(src):
        from fastloader.formats.parquet_pack import ParquetPackState
        from fastloader.formats.tar_manifest import MANIFEST_NAME

        if os.path.exists(os.path.join(src, "data.mdb")):
            return "lmdb"
        if os.path.exists(os.path.join(src, MANIFEST_NAME)):
            return "tar"
        if ParquetPackState.found_in(src) or any(name.endswith(".parquet") for name in os.listdir(src)):
            return "parquet"
        return "folder"
    name = os.path.basename(src).lower()
    if name.endswith((".txt", ".csv", ".lst", ".tsv")):
        return "list"
    if name.endswith(".rec"):
        return "recordio"
    if ".tfrecord" in name or name.endswith(".tfrec"):
        return "tfrecord"
    if name.endswith(".tar"):
        return "tar"
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith((".mdb", ".lmdb")):
        return "lmdb"
    raise ValueError(
        f"{src}: cannot tell what to read: expected an image folder, a file list (.txt/.csv), a .rec, "
        "a .tfrecord pattern, a .tar pattern, .parquet files or a fastloader LMDB (or name its kind: --src-format"
        " on the command line, src_format= in Python)"
    )


_PATTERN_CHARS = "*?[{"  # a glob or a brace range names files that exist one by one, never itself


def check_exists(src: str) -> None:
    """Raise FileNotFoundError naming ``src`` when it is a plain local path that is not there: said first, since
    a mistyped path otherwise reads as a path of an unknown kind, or as an empty pattern."""
    if "://" in src or any(char in src for char in _PATTERN_CHARS):
        return
    if not os.path.lexists(src):
        raise FileNotFoundError(f"{src}: the path does not exist")


# Where each source kind lives: imported when used (their modules need nothing until then).
_SOURCE_CLASSES = {
    "folder": ("fastloader.datasets.folder", "FolderSource"),
    "list": ("fastloader.datasets.folder", "FileListSource"),
    "recordio": ("fastloader.datasets.recordio", "RecordIOSource"),
    "tfrecord": ("fastloader.datasets.tfrecord", "TFRecordSource"),
    "tar": ("fastloader.datasets.tar", "TarShardSource"),
    "lmdb": ("fastloader.datasets.lmdb", "LMDBSource"),
    "parquet": ("fastloader.datasets.parquet", "ParquetSource"),
}
SOURCE_KINDS = tuple(_SOURCE_CLASSES)


def open_source(src: str, kind: str = "auto", *, root: str | None = None, confine: bool = False) -> tuple[Source, str]:
    """Open ``src`` as a Source of kind ``kind`` (``auto``: :func:`detect_source_kind`). ``root``: the base of
    relative paths, a file list's or those of the images a Parquet file names by path. ``confine``: read
    nothing from outside a folder's, a list's or (given ``root``) a Parquet file's image root
    (``fastloader.datasets.confine``)."""
    check_exists(src)
    kind = detect_source_kind(src) if kind == "auto" else kind
    if kind not in _SOURCE_CLASSES:
        raise ValueError(f"--src-format (src_format=) must be auto or one of {', '.join(SOURCE_KINDS)}, got {kind!r}")
    # confine keeps a folder's and a list's sample files, and the images a Parquet file names by path, under
    # their root. The containers (RecordIO, TFRecord, tar, LMDB) read only the files SRC names: nothing to confine.
    module, name = _SOURCE_CLASSES[kind]
    source_class = getattr(importlib.import_module(module), name)
    if kind == "list":
        source: Source = source_class(src, root, confine=confine)
    elif kind == "folder":
        source = source_class(src, confine=confine)
    elif kind == "parquet":
        source = source_class(src, root=root, confine=confine)
    else:
        source = source_class(src)
    return source, kind
