"""The catalog of a list of tar shards, and the source that reads samples through it.

The per-shard indexes (:mod:`fastloader.formats.tar_shards`) are concatenated into one *catalog* for
the whole shard list: global numpy arrays of offsets, sizes, labels and keys, memory-mapped once per
process; local shards (``fastloader.datasets.tar``) and shards in S3 (``fastloader.datasets.remote_tar``)
both read their samples through it (:class:`CatalogSource`). Shard files are opened lazily in each
process, at most ``_MAX_OPEN_SHARDS`` at a time, and read with ``os.pread``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from fastloader.datasets.base import check_index
from fastloader.datasets.handles import OpenHandles, ProcessLocal
from fastloader.errors import FormatError, MissingField
from fastloader.formats.field_values import decode_value, kind_of_extension
from fastloader.formats.index_file import IndexFile, check_csr, read_index, require_array, string_at, write_index
from fastloader.formats.tar_index_check import check_shard_index
from fastloader.formats.tar_manifest import FieldMember
from fastloader.formats.tar_shards import LABEL_EXTS
from fastloader.storage import open_regular

CATALOG_KIND = "tar-catalog"
CATALOG_VERSION = 2
_MAX_OPEN_SHARDS = 64  # file descriptors per process; shards beyond are reopened as needed


def _concat_strings(pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Join ``pack_strings`` (blob, offsets) pairs into one pair."""
    blob = np.concatenate([pair[0] for pair in pairs]) if pairs else np.zeros(0, np.uint8)
    return blob, _concat_offsets([(offsets, len(pair_blob)) for pair_blob, offsets in pairs])


def _concat_offsets(parts: Sequence[tuple[np.ndarray, int]]) -> np.ndarray:
    """Join CSR offset arrays (each starting at 0, with the length of what it indexes) into one."""
    joined, base = [np.zeros(1, np.int64)], 0
    for offsets, length in parts:
        joined.append(np.asarray(offsets[1:]) + base)
        base += length
    return np.concatenate(joined)


def write_catalog(
    path: Path,
    indexes: Sequence[IndexFile],
    identities: list[Any],
    image_exts: Sequence[str],
    extra_meta: Mapping[str, Any] | None = None,
) -> None:
    """One catalog of the shard ``indexes`` (in order); ``identities`` say which shard states they index.
    Each index is checked first (a lying one is a FormatError naming it, never a misread shard)."""
    for index in indexes:
        check_shard_index(index)
    exts: list[str] = []
    for index in indexes:
        exts.extend(ext for ext in index.meta["exts"] if ext not in exts)

    def column(name: str, dtype: type) -> np.ndarray:
        return np.concatenate([np.asarray(index.arrays[name]) for index in indexes] or [np.zeros(0, dtype)])

    def ext_codes(index: IndexFile) -> np.ndarray:
        remap = np.array([exts.index(ext) for ext in index.meta["exts"]] or [0], dtype=np.uint8)
        return remap[np.asarray(index.arrays["ext"])]

    member_exts: dict[str, int] = {}  # every shard's member extensions, numbered in order of appearance
    for index in indexes:
        for ext in index.meta["member_exts"]:
            member_exts.setdefault(ext, len(member_exts))

    def member_codes(index: IndexFile) -> np.ndarray:
        remap = np.array([member_exts[ext] for ext in index.meta["member_exts"]] or [0], dtype=np.int32)
        return remap[np.asarray(index.arrays["member_ext"])]

    counts = [int(index.meta["samples"]) for index in indexes]
    arrays = {
        "starts": np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64),
        "data_offset": column("data_offset", np.int64),
        "data_size": column("data_size", np.int64),
        "label": column("label", np.int64),
        "ext": np.concatenate([ext_codes(index) for index in indexes] or [np.zeros(0, np.uint8)]),
        "member_starts": _concat_offsets(
            [(index.arrays["member_starts"], len(index.arrays["member_ext"])) for index in indexes]
        ),
        "member_ext": np.concatenate([member_codes(index) for index in indexes] or [np.zeros(0, np.int32)]),
        "member_offset": column("member_offset", np.int64),
        "member_size": column("member_size", np.int64),
    }
    arrays["key_blob"], arrays["key_offsets"] = _concat_strings(
        [(index.arrays["key_blob"], index.arrays["key_offsets"]) for index in indexes]
    )
    has_source_keys = bool(indexes) and all("source_key_blob" in index.arrays for index in indexes)
    if has_source_keys:
        arrays["source_key_blob"], arrays["source_key_offsets"] = _concat_strings(
            [(index.arrays["source_key_blob"], index.arrays["source_key_offsets"]) for index in indexes]
        )
    meta = {
        "shards": identities,
        "image_exts": list(image_exts),
        "exts": exts,
        "member_exts": list(member_exts),
        "no_image": sum(int(index.meta["no_image"]) for index in indexes),
        "ignored": sum(int(index.meta["ignored"]) for index in indexes),
        **(extra_meta or {}),
    }
    write_index(path, CATALOG_KIND, CATALOG_VERSION, meta, arrays)


def open_catalog(path: str, count: int) -> IndexFile:
    catalog = read_index(path, CATALOG_KIND, CATALOG_VERSION)
    starts = require_array(catalog, "starts", np.int64)
    if not len(starts) or int(starts[-1]) != count:
        raise FormatError(f"{path}: the shards changed since this dataset was created; create it again")
    check_catalog_lengths(catalog, len(starts) - 1)
    return catalog


def check_catalog_lengths(catalog: IndexFile, shards: int) -> None:
    """The catalog's arrays are as long as its counts say (cheap: its values are checked when built from
    the shard indexes, and each read's offset and size against its shard)."""
    check_csr(catalog, "starts", shards, len(require_array(catalog, "data_offset", np.int64)))
    count = int(catalog.arrays["starts"][-1])
    for name, dtype in (("data_size", np.int64), ("label", np.int64), ("ext", np.uint8)):
        require_array(catalog, name, dtype, count)
    for name in ("key_offsets", "member_starts"):
        require_array(catalog, name, np.int64, count + 1)
    members = len(require_array(catalog, "member_ext", np.int32))
    require_array(catalog, "member_offset", np.int64, members)
    require_array(catalog, "member_size", np.int64, members)


class OpenShards:
    """Read-only descriptors of the shards this process reads, at most ``_MAX_OPEN_SHARDS`` open.

    ``locate(shard)`` gives the local file of shard number ``shard`` (a path; for remote shards, the
    shard cache's file, fetched on a miss); it is asked again only when the descriptor was closed.
    """

    def __init__(self, locate: Callable[[int], str]) -> None:
        self._locate = locate
        # shard -> (descriptor, file size)
        self.open = OpenHandles(self._open, _close_shard, _MAX_OPEN_SHARDS)

    def pread(self, shard: int, size: int, offset: int, key: Callable[[], str]) -> bytes:
        """``size`` bytes at ``offset`` of the shard; FormatError naming ``key()`` when they are not all there."""
        fd, file_size = self.open.get(shard)
        # Checked before the read: a catalog's values may lie (a negative offset, a size of 2**62).
        if offset < 0 or size < 0 or offset > file_size - size:
            raise FormatError(f"{key()}: {size} bytes at byte {offset} lie outside the shard ({file_size} bytes)")
        data = os.pread(fd, size, offset)
        if len(data) != size:
            raise FormatError(f"{key()}: the shard ends early (modified since it was indexed?)")
        return data

    def _open(self, shard: int) -> tuple[int, int]:
        for attempt in range(3):
            try:
                fd = open_regular(self._locate(shard))
                return fd, os.fstat(fd).st_size
            except FileNotFoundError:
                # A cached remote shard may be evicted between its fetch and this open: fetch it again.
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def __del__(self) -> None:
        # Also runs in a forked worker for the copy it inherited: closing that copy is right there.
        self.open.close_all()


def _close_shard(opened: tuple[int, int]) -> None:
    os.close(opened[0])


class CatalogSource:
    """Samples of tar shards read through a catalog: what local and remote tar sources share.

    A subclass sets ``shards`` (their names, for keys) and ``image_exts``, and calls :meth:`_attach`
    with the catalog, how to find each shard's local file, and the fields a pack's manifest records.

    Fields (:class:`~fastloader.fields.source.FieldSource`): see the module docstring; a pack's
    recorded names and kinds win over the extensions' (the members of field ``image/xmin`` are
    ``*.image%2fxmin.npy``).
    """

    shards: Sequence[str]
    image_exts: tuple[str, ...]

    def _attach(
        self, catalog: IndexFile, locate: Callable[[int], str], recorded: Mapping[str, FieldMember] | None = None
    ) -> None:
        check_catalog_lengths(catalog, len(self.shards))
        self._starts = np.array(catalog.arrays["starts"])  # one entry per shard: kept in memory
        self._length = int(self._starts[-1])
        self._exts: list[str] = list(catalog.meta["exts"])
        self.no_image: int = catalog.meta["no_image"]  # samples skipped: no image member
        self.ignored: int = catalog.meta["ignored"]  # unsafe or non-regular members ignored
        self._catalog = ProcessLocal(partial(open_catalog, catalog.path, self._length))
        self._files = ProcessLocal(partial(OpenShards, locate))
        self._attach_fields(list(catalog.meta["member_exts"]), recorded or {})

    def _attach_fields(self, member_exts: list[str], recorded: Mapping[str, FieldMember]) -> None:
        # name -> (kind, member extension), then extension -> code in the catalog: a few entries per dataset.
        self._fields = {name: (record.kind, record.extension) for name, record in recorded.items()}
        taken = {record.extension for record in recorded.values()}
        for ext in member_exts:
            if ext not in taken and ext not in LABEL_EXTS and ext not in self._fields:
                self._fields[ext] = (kind_of_extension(ext), ext)
        self._member_codes = {ext: code for code, ext in enumerate(member_exts)}

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._length} samples in {len(self.shards)} shards)"

    def shard_starts(self) -> np.ndarray:
        """Where each shard's samples start, and the total at the end (for shard-aware samplers)."""
        return self._starts.copy()

    def _shard_of(self, index: int) -> int:
        return int(np.searchsorted(self._starts, index, side="right")) - 1

    def read(self, index: int) -> bytes:
        index = check_index(index, self._length)
        arrays = self._catalog.get().arrays
        offset, size = int(arrays["data_offset"][index]), int(arrays["data_size"][index])
        return self._files.get().pread(self._shard_of(index), size, offset, lambda: self.key(index))

    def label(self, index: int) -> int:
        return int(self._catalog.get().arrays["label"][check_index(index, self._length)])

    def labels(self) -> np.ndarray:
        """Every label (-1 where a sample has none), as a read-only array."""
        return self._catalog.get().arrays["label"].view(np.ndarray)

    def key(self, index: int) -> str:
        """``"<shard>:<sample key>"``."""
        index = check_index(index, self._length)
        arrays = self._catalog.get().arrays
        return f"{self.shards[self._shard_of(index)]}:{string_at(arrays['key_blob'], arrays['key_offsets'], index)}"

    def extension(self, index: int) -> str:
        """The extension of the image member (``jpg``, ``png``, ...)."""
        code = int(self._catalog.get().arrays["ext"][check_index(index, self._length)])
        if code >= len(self._exts):
            raise FormatError(f"{self.key(index)}: extension code {code} is not in the catalog's table")
        return self._exts[code]

    def field_kinds(self) -> dict[str, str]:
        """The fields samples may carry, name -> kind (a pack's recorded ones, else one per extension)."""
        return {name: kind for name, (kind, _) in sorted(self._fields.items())}

    def field_aliases(self) -> dict[str, str]:
        """Image and label extensions (unless one is a field here) name the sample's image and label."""
        aliases = {ext: "image" for ext in self.image_exts if ext not in self._fields}
        aliases.update({ext: "label" for ext in LABEL_EXTS if ext not in self._fields})
        return aliases

    def read_field(self, index: int, name: str) -> Any:
        """Sample ``index``'s field ``name``, decoded (one pread); MissingField when it has none."""
        index = check_index(index, self._length)
        if name not in self._fields:
            known = ", ".join(sorted(self._fields)) or "none"
            raise MissingField(f"{self.key(index)}: no field {name!r} in these shards (fields: {known})")
        kind, ext = self._fields[name]
        arrays = self._catalog.get().arrays
        start, end = int(arrays["member_starts"][index]), int(arrays["member_starts"][index + 1])
        code = self._member_codes.get(ext, -1)
        found = np.flatnonzero(arrays["member_ext"][start:end] == code)
        if not len(found):
            raise MissingField(f"{self.key(index)}: no field {name!r} (no .{ext} member)")
        row = start + int(found[0])
        offset, size = int(arrays["member_offset"][row]), int(arrays["member_size"][row])
        data = self._files.get().pread(self._shard_of(index), size, offset, lambda: self.key(index))
        return decode_value(kind, data, f"{self.key(index)}: field {name!r}")

    def source_key(self, index: int) -> str | None:
        """For packed shards, the key the sample had in the packed source; else None."""
        arrays = self._catalog.get().arrays
        if "source_key_blob" not in arrays:
            return None
        index = check_index(index, self._length)
        return string_at(arrays["source_key_blob"], arrays["source_key_offsets"], index)
