"""RecordIODataset: MXNet ``.rec`` / ``.idx`` image records, read without MXNet.

Item order is MXNet's ``MXIndexedRecordIO.keys``: the order of the lines of the ``.idx`` file
(``im2rec`` writes them in ``.lst`` order). Without an ``.idx`` the ``.rec`` is scanned once and
item ``k`` is the ``k``-th record of the file, under key ``k`` (as ``im2rec`` and InsightFace
number them).

InsightFace layout (``train.rec`` of MS1M, Glint360K, ...): when the record with key 0 has
``flag > 0`` and no image, it is a header whose ``label[0]`` is one past the last image key, so
the images are the records with keys ``1 .. int(label[0]) - 1``, in key order; the records after
them describe identities and are not items. This is what InsightFace's ``MXFaceDataset`` reads,
and, as there, a multi-label image record's label is its first value.

Multi-label records (``im2rec --pack-label``: ``flag > 0`` float32 labels after the header) carry
their labels as the field ``labels`` (``fastloader.fields``: a float32 array, as
:meth:`RecordIOSource.labels_of`); a single-label record lacks it. ``label(i)``, what ``fastloader
pack`` stores, is -1 (no single class) for a multi-label record, or its first label in the
InsightFace layout; ``RecordIODataset`` items keep their targets (the labels array). Whether a
file has the field is told by the headers of up to ``_PROBES`` items spread over it (im2rec gives
every record of a file the same label width): a file whose sampled items are all single-label
has no fields.

The ``.idx`` (or the scan) is turned once into a memory-mapped index beside the ``.rec`` (or in the
cache directory): item keys, offsets, and the bytes each record spans, so that a read is one
``pread``. It is rebuilt when the ``.rec`` or ``.idx`` changes.

An index is the data's word for where each record lies, and an offset swapped with another's still lands on
a record. ``im2rec`` writes each record's key as its header's ``id``: when the records probed while building
the index (up to ``_PROBES``, spread over it) mostly carry their keys, every read checks that the record it
reached is its key's and refuses another (a FormatError naming the file, the key and the id found). A file
whose records do not carry their keys cannot be checked so: a warning names it once, when opened.
``fastloader verify FILE.rec`` checks every entry of the index against a walk of the whole file.
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from fastloader.datasets.base import ImageDataset, check_index
from fastloader.datasets.handles import ProcessLocal
from fastloader.errors import FormatError, MissingField, printable
from fastloader.fields.specs import Spec
from fastloader.formats.index_file import IndexFile, cached_index, read_index, require_array, write_index
from fastloader.formats.recordio import (
    IR_HEADER_SIZE,
    IRHeader,
    integer_label,
    read_head,
    read_idx_file,
    read_record,
    record_id,
    scan_offsets,
    unpack_header,
)
from fastloader.image.pil import decode_pil
from fastloader.storage import open_regular, sidecar_path

INDEX_KIND = "recordio"
INDEX_VERSION = 1
INDEX_SUFFIX = ".flindex"
PLAIN, INSIGHTFACE = "plain", "insightface"
IDS_ARE_KEYS, IDS_OTHER = "keys", "other"  # whether the records' header ids are their keys (im2rec's files)
LABELS_FIELD = "labels"
_PROBES = 64  # item headers read to tell whether a file holds multi-label records


def _stamp(path: str) -> dict[str, int]:
    stat = os.stat(path)
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _sources_stamp(rec_path: str, idx_path: str | None) -> dict[str, Any]:
    idx = None if idx_path is None else {"path": os.path.abspath(idx_path), **_stamp(idx_path)}
    return {"rec": _stamp(rec_path), "idx": idx}


def load_index(rec_path: str, idx_path: str | None) -> IndexFile:
    """The memory-mapped item index of ``rec_path`` (arrays ``keys``, ``offsets``, ``spans``),
    built from ``idx_path`` (or a scan when None) when missing or stale, under a lock."""
    index_path = os.fspath(sidecar_path(rec_path, INDEX_SUFFIX))

    def build() -> IndexFile:
        stamp = _sources_stamp(rec_path, idx_path)
        with open(open_regular(rec_path), "rb") as rec:  # a FIFO named *.rec: an error, never a hang
            meta, arrays = _build_index(rec.fileno(), stamp["rec"]["size"], rec_path, idx_path)
        write_index(index_path, INDEX_KIND, INDEX_VERSION, {"sources": stamp, **meta}, arrays)
        return read_index(index_path, INDEX_KIND, INDEX_VERSION)

    return cached_index(index_path, lambda: _fresh_index(index_path, rec_path, idx_path), build)


def _fresh_index(index_path: str, rec_path: str, idx_path: str | None) -> IndexFile | None:
    """The index at ``index_path`` when it is of these files as they are now and its arrays agree in
    length (each record's offset is checked when it is read); else None: build it again."""
    try:
        index = read_index(index_path, INDEX_KIND, INDEX_VERSION)
        if index.meta.get("sources") != _sources_stamp(rec_path, idx_path):
            return None
        count = len(require_array(index, "offsets", np.int64))
        require_array(index, "keys", np.int64, count)
        require_array(index, "spans", np.int64, count)
        if index.meta.get("layout") not in (PLAIN, INSIGHTFACE):
            raise FormatError(f"{index_path}: unknown layout {index.meta.get('layout')!r}")
        if index.meta.get("ids") not in (IDS_ARE_KEYS, IDS_OTHER):  # written before ids were probed
            return None
    except (FileNotFoundError, FormatError):
        return None
    return index


def _build_index(
    fd: int, size: int, rec_path: str, idx_path: str | None
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    if idx_path is None:
        offsets = scan_offsets(fd, size, rec_path)
        keys = np.arange(len(offsets), dtype=np.int64)
    else:
        keys, offsets = read_idx_file(idx_path)
        bad = np.flatnonzero((offsets < 0) | (offsets > size - 8))
        if len(bad):
            line = int(bad[0])
            raise FormatError(
                f"{idx_path}: line {line + 1}: offset {offsets[line]} is outside {rec_path} ({size} bytes)"
            )
    # A record spans up to the next record's start: read() fetches it in one pread.
    starts = np.unique(offsets)
    spans = np.append(starts, size)[np.searchsorted(starts, offsets, side="right")] - offsets
    meta: dict[str, Any] = {"layout": PLAIN, "ids": _probe_ids(fd, size, rec_path, keys, offsets)}
    header0 = _insightface_header(fd, size, rec_path, keys, offsets, spans)
    if header0 is not None:
        selection = _insightface_items(keys, header0, idx_path or rec_path)
        keys, offsets, spans = keys[selection], offsets[selection], spans[selection]
        meta = {**meta, "layout": INSIGHTFACE, "header0": list(header0.labels)}
    return meta, {"keys": keys, "offsets": offsets, "spans": spans}


def _probe_ids(fd: int, size: int, rec_path: str, keys: np.ndarray, offsets: np.ndarray) -> str:
    """IDS_ARE_KEYS when most of the records probed carry their keys as ids (one swapped offset among them
    must not make the file look unnumbered), else IDS_OTHER. A record that cannot be read is not counted:
    reading it as an item reports it."""
    lines = np.unique(np.linspace(0, len(keys) - 1, min(len(keys), _PROBES)).round().astype(np.int64))
    matched = probed = 0
    for line in lines:
        try:
            found = record_id(fd, int(offsets[line]), size, rec_path)
        except FormatError:
            continue
        probed += 1
        matched += found == int(keys[line])
    return IDS_ARE_KEYS if probed and 2 * matched > probed else IDS_OTHER


def _insightface_header(
    fd: int, size: int, rec_path: str, keys: np.ndarray, offsets: np.ndarray, spans: np.ndarray
) -> IRHeader | None:
    """The header of record 0 when it is an InsightFace dataset header (flag > 0, no image)."""
    lines = np.flatnonzero(keys == 0)
    if not len(lines):
        return None
    line = int(lines[-1])  # MXNet's idx dict keeps the last line of a repeated key
    try:
        payload = read_record(fd, int(offsets[line]), size, rec_path, span=int(spans[line]))
        header, image_start = unpack_header(payload, f"{rec_path}: record 0")
    except FormatError:
        return None  # not a header; reading record 0 as an item reports the problem
    return header if header.flag > 0 and image_start == len(payload) else None


def _insightface_items(keys: np.ndarray, header0: IRHeader, where: str) -> np.ndarray:
    """Line numbers of the image records, keys ``1 .. int(label[0]) - 1`` in key order."""
    end = header0.labels[0]
    if not 1 <= end <= len(keys):  # checked before np.arange: a corrupt header must not allocate much
        raise FormatError(
            f"{where}: InsightFace header record 0 announces {end - 1:g} images, but there are {len(keys)} records"
        )
    wanted = np.arange(1, int(end), dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    at = np.searchsorted(sorted_keys, wanted, side="right") - 1  # the last line of a repeated key
    missing = (at < 0) | (sorted_keys[np.maximum(at, 0)] != wanted)
    if missing.any():
        first = int(wanted[np.flatnonzero(missing)[0]])
        raise FormatError(
            f"{where}: InsightFace header announces images 1..{int(end) - 1} but key {first} has no record"
        )
    return order[at]


class _OpenRecordIO:
    """Per process: the ``.rec`` descriptor, the memory-mapped index, and the last header read
    (so that ``label(i)`` right after ``read(i)`` reads nothing)."""

    def __init__(self, rec_path: str, index_path: str) -> None:
        self.fd = open_regular(rec_path)
        weakref.finalize(self, os.close, self.fd)
        self.size = os.fstat(self.fd).st_size
        arrays = read_index(index_path, INDEX_KIND, INDEX_VERSION).arrays
        self.keys, self.offsets, self.spans = arrays["keys"], arrays["offsets"], arrays["spans"]
        self.last: tuple[int, IRHeader] | None = None


class RecordIOSource:
    """A :class:`~fastloader.datasets.base.Source` over an MXNet ``.rec`` file (see the module docstring).

    ``idx_path`` defaults to the ``.idx`` beside ``rec_path`` (``train.rec`` -> ``train.idx``);
    without one the ``.rec`` is scanned once. ``read(i)`` is the encoded image; ``label(i)`` the
    integer label (-1 for a multi-label record outside the InsightFace layout: see :meth:`labels_of`
    and the field ``labels``).
    """

    def __init__(self, rec_path: str | os.PathLike[str], idx_path: str | os.PathLike[str] | None = None) -> None:
        self.rec_path = os.fspath(rec_path)
        if idx_path is None:
            beside = os.path.splitext(self.rec_path)[0] + ".idx"
            self.idx_path = beside if os.path.exists(beside) else None
        else:
            self.idx_path = os.fspath(idx_path)
        index = load_index(self.rec_path, self.idx_path)
        self.layout: str = index.meta["layout"]
        self.ids_are_keys = index.meta["ids"] == IDS_ARE_KEYS
        if not self.ids_are_keys and self.idx_path is not None:
            warnings.warn(
                f"{printable(self.idx_path)}: the records of {printable(self.rec_path)} do not carry their keys as ids"
                " (not written by im2rec?): fastloader cannot check that this index's offsets lead to the records it"
                " names; a .idx you did not make can serve one record under another's key",
                UserWarning,
                stacklevel=2,
            )
        self._length = len(index.arrays["offsets"])
        self._local = ProcessLocal(partial(_OpenRecordIO, self.rec_path, index.path))
        self._kinds: dict[str, str] | None = None

    def __len__(self) -> int:
        return self._length

    def _where(self, handle: _OpenRecordIO, index: int) -> str:
        return f"{self.rec_path}: record {int(handle.keys[index])} (offset {int(handle.offsets[index])})"

    def read(self, index: int) -> bytes:
        index = check_index(index, self._length)
        handle = self._local.get()
        offset, span = int(handle.offsets[index]), int(handle.spans[index])
        payload = read_record(handle.fd, offset, handle.size, self.rec_path, span=span)
        header, image_start = unpack_header(payload, self._where(handle, index))
        self._check_id(handle, index, header)
        handle.last = (index, header)
        return payload[image_start:]

    def _check_id(self, handle: _OpenRecordIO, index: int, header: IRHeader) -> None:
        """A record reached under a key whose id is another key's: the index points elsewhere (see the module
        docstring)."""
        key = int(handle.keys[index])
        if self.ids_are_keys and header.id != key:
            raise FormatError(
                f"{self._where(handle, index)}: the record there has id {header.id}, not its key {key}: the index"
                f" {printable(self.idx_path or self.rec_path)} points this key at another record (offsets swapped?);"
                " delete the index to read the .rec without it, and check it with `fastloader verify`"
            )

    def header(self, index: int) -> IRHeader:
        """The record's :class:`~fastloader.formats.recordio.IRHeader`, read without its image."""
        index = check_index(index, self._length)
        handle = self._local.get()
        if handle.last is not None and handle.last[0] == index:
            return handle.last[1]
        offset, where = int(handle.offsets[index]), self._where(handle, index)
        head = read_head(handle.fd, offset, handle.size, self.rec_path, IR_HEADER_SIZE)
        flag = int.from_bytes(head[:4], "little") if len(head) >= IR_HEADER_SIZE else 0
        if flag:  # the labels follow the fixed header
            head = read_head(handle.fd, offset, handle.size, self.rec_path, IR_HEADER_SIZE + 4 * flag)
        header, _ = unpack_header(head, where)
        self._check_id(handle, index, header)
        handle.last = (index, header)
        return header

    def label(self, index: int) -> int:
        """The record's class; -1 for a multi-label record outside the InsightFace layout."""
        target = self.target(index)
        return -1 if isinstance(target, np.ndarray) else target

    def field_kinds(self) -> dict[str, str]:
        """``{"labels": "array"}`` when the file holds multi-label records, else ``{}`` (see the module docstring)."""
        if self._kinds is None:
            picks = np.unique(np.linspace(0, self._length - 1, min(self._length, _PROBES)).round().astype(np.int64))
            multi = any(self.header(int(i)).flag > 0 for i in picks)
            self._kinds = {LABELS_FIELD: "array"} if multi else {}
        return dict(self._kinds)

    def read_field(self, index: int, name: str) -> np.ndarray:
        """The float32 labels of a multi-label record (field ``labels``); MissingField for the others."""
        if name != LABELS_FIELD:
            raise MissingField(f"{self.key(index)}: no field {name!r} (a RecordIO record has only {LABELS_FIELD!r})")
        if self.header(index).flag == 0:
            raise MissingField(f"{self.key(index)}: no field {name!r} (a single-label record)")
        return self.labels_of(index)

    def labels_of(self, index: int) -> np.ndarray:
        """All labels of the record as float32: the ``flag`` labels of a multi-label record, else one."""
        header = self.header(index)
        return np.array(header.labels if header.flag else (header.label,), dtype=np.float32)

    def target(self, index: int) -> int | np.ndarray:
        """What :class:`RecordIODataset` returns as the label: an int for a single-label record (and
        in the InsightFace layout, the first label), else the float32 labels."""
        header = self.header(index)
        if header.flag == 0:
            return integer_label(header.label, self.key(index))
        if self.layout == INSIGHTFACE:
            return integer_label(header.labels[0], self.key(index))
        return np.array(header.labels, dtype=np.float32)

    def key(self, index: int) -> str:
        index = check_index(index, self._length)
        return f"{self.rec_path}#{int(self._local.get().keys[index])}"


class RecordIODataset(ImageDataset[Any]):
    """``(transform(image), target_transform(label))`` for each record of an MXNet ``.rec`` file.

    ``label`` is an int, or a float32 array for a multi-label record (see
    :meth:`RecordIOSource.target`). ``decode`` turns encoded bytes into an image (default: RGB
    ``PIL.Image``), so torchvision transforms work unchanged. ``fields``: samples with more than a
    label (``fields=("image", "labels")``: the multi-label vector; see ``fastloader.fields``).
    """

    def __init__(
        self,
        rec_path: str | os.PathLike[str],
        idx_path: str | os.PathLike[str] | None = None,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        *,
        decode: Callable[[bytes, str], Any] = decode_pil,
        fields: Sequence[Spec] | Mapping[str, Spec] | None = None,
    ) -> None:
        super().__init__(RecordIOSource(rec_path, idx_path), transform, target_transform, decode, fields=fields)
