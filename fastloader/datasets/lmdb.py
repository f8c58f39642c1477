"""Read a fastloader LMDB (written by ``fastloader pack``): ``LMDBDataset("train.lmdb", transform=...)``.

Each process opens the environment itself, lazily, on its first read (:class:`ProcessLocal`): an
LMDB environment must never cross a fork. Readers of one pack in a process share one environment
(``shared_handle``: py-lmdb refuses to open the same files twice in a process). It is opened
``readonly=True, lock=False`` (a finished pack is immutable, so readers need no lock file and work
on read-only storage), ``readahead=False`` (random access to a file larger than RAM: read-ahead
would fill the page cache with neighbours nobody asked for) and ``meminit=False``.

Transactions: every ``read`` runs in its own short read transaction. LMDB transactions must not be
shared between threads, a per-read ``env.begin()`` costs under a microsecond (against milliseconds
to decode the image), and holding none between reads keeps the reader safe in thread pools.
The labels are the exception: one read transaction per process stays open for the process's
life, so that ``label(i)`` indexes an int64 array mapped straight from the file, shared by every
worker through the page cache (no per-worker copy at 10M samples). Pinning pages costs nothing
here because nothing writes a finished pack.

A pack with fields (``fastloader.fields``) lists them in its metadata; ``LMDBSource`` is then a
``FieldSource`` whose ``read_field(i, name)`` decodes that one field of record ``i``, from the
record ``read(i)`` just fetched when it is the same item. A pack without fields reads exactly as
before fields existed: nothing is kept, nothing more is parsed.

The layout (record header, fields, reserved records, versioning) is described in
``fastloader.formats.lmdb_records``. A path given as a directory is opened as a standard LMDB
environment (``data.mdb`` inside); a path to a file as a single-file LMDB (``subdir=False``).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import lmdb
import numpy as np

from fastloader.datasets.base import ImageDataset
from fastloader.datasets.handles import ProcessLocal
from fastloader.errors import FormatError, MissingField
from fastloader.fields.specs import Spec
from fastloader.formats import lmdb_records as records
from fastloader.formats.field_values import decode_value
from fastloader.image.pil import decode_pil

# With lock=False LMDB keeps no reader table, so this only matters to a caller that opens the
# same files with locking; it is set high so that many loader workers never exhaust it.
_MAX_READERS = 1024


def _data_file(path: str) -> str:
    """The data file of the LMDB at ``path``: ``data.mdb`` in a directory, else ``path`` itself."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such LMDB")
    if not os.path.isdir(path):
        return path
    if not os.path.exists(os.path.join(path, "data.mdb")):
        raise FormatError(f"{path}: not an LMDB (a directory without data.mdb)")
    return os.path.join(path, "data.mdb")


def open_readonly(path: str) -> lmdb.Environment:
    """Open the LMDB at ``path`` (a directory, or a single data file) read-only and without locks."""
    subdir = _data_file(path) != path
    try:
        return lmdb.open(
            path,
            subdir=subdir,
            readonly=True,
            lock=False,
            readahead=False,
            meminit=False,
            max_readers=_MAX_READERS,
        )
    except lmdb.Error as error:
        raise FormatError(f"{path}: not a readable LMDB ({error})") from error


def load_meta(txn: lmdb.Transaction, path: str) -> records.LMDBMeta:
    """The final metadata of the pack at ``path``; FormatError saying why when there is none."""
    raw = txn.get(records.META_KEY)
    if raw is not None:
        return records.LMDBMeta.from_json(raw, path)
    progress = txn.get(records.PROGRESS_KEY)
    if progress is not None:
        records.PackProgress.from_json(progress, path)  # a pack by a newer version says so
        raise FormatError(f"{path}: incomplete pack: run the same `fastloader pack` command again to resume")
    raise FormatError(f"{path}: not a fastloader LMDB (no metadata record): was it written by another tool?")


def source_key(txn: lmdb.Transaction, number: int) -> str | None:
    """The source key (path, member name) record ``number`` was packed from, None when unknown."""
    cursor = txn.cursor()
    exact = records.chunk_key(records.KEY_CHUNK_PREFIX, number)
    # The chunk holding `number` is the last chunk starting at or before it.
    if cursor.set_range(exact):
        if bytes(cursor.key()) != exact and not cursor.prev():
            return None
    elif not cursor.last():
        return None
    key = bytes(cursor.key())
    if not key.startswith(records.KEY_CHUNK_PREFIX):
        return None
    keys = records.decode_keys(cursor.value())
    offset = number - records.chunk_start(records.KEY_CHUNK_PREFIX, key)
    return keys[offset] if 0 <= offset < len(keys) else None


@dataclass
class _Handle:
    """One process's view of a pack: the environment, its metadata and the labels mapped from it."""

    env: lmdb.Environment
    labels_txn: lmdb.Transaction  # kept open: ``labels`` points into its snapshot of the map
    labels: np.ndarray
    meta: records.LMDBMeta
    pid: int

    def close(self) -> None:
        self.labels_txn.abort()
        self.env.close()


def _open_handle(path: str) -> _Handle:
    env = open_readonly(path)
    try:
        txn = env.begin(buffers=True)
        meta = load_meta(txn, path)
        raw = txn.get(records.LABELS_KEY)
        if raw is None:
            raise FormatError(f"{path}: the labels record is missing")
        labels = records.decode_labels(raw, path)
        if len(labels) != meta.count:
            raise FormatError(f"{path}: {len(labels)} labels for {meta.count} records")
    except BaseException:
        env.close()
        raise
    return _Handle(env, txn, labels, meta, os.getpid())


# py-lmdb refuses to open the same files twice in one process (LMDB's fcntl locks are per process),
# and its record of open files is copied into a forked child along with the parent's handles. So
# every reader in a process shares one handle per pack, and a child first closes the copies it
# inherited (closing a lock-free read-only copy unmaps only the child's pages) before opening its own.
_handles: dict[tuple[int, int], _Handle] = {}  # by (st_dev, st_ino) of the data file
_handles_lock = threading.Lock()


def shared_handle(path: str) -> _Handle:
    """This process's handle on the finished pack at ``path``, opened on first use."""
    stat = os.stat(_data_file(path))
    with _handles_lock:
        pid = os.getpid()
        for identity, inherited in list(_handles.items()):
            if inherited.pid != pid:
                inherited.close()
                del _handles[identity]
        identity = (stat.st_dev, stat.st_ino)
        if identity not in _handles:
            _handles[identity] = _open_handle(path)
        return _handles[identity]


def _identity(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(_data_file(path))
    except (OSError, FormatError):
        return None
    return stat.st_dev, stat.st_ino


def has_shared_handle(path: str) -> bool:
    """Whether this process holds the shared handle on the LMDB at ``path`` (False: not an LMDB)."""
    identity = _identity(path)
    with _handles_lock:
        return identity is not None and identity in _handles


def release_shared_handle(path: str) -> None:
    """Close this process's shared handle on the LMDB at ``path``, if any: for a reader that opened it only to
    read it once (``fastloader digest``), so that a writer of the same path can open it in this process after.
    A dataset still reading it would open it again on its next read."""
    identity = _identity(path)
    with _handles_lock:
        handle = _handles.pop(identity, None) if identity is not None else None
    if handle is not None:
        handle.close()


def _source_handle(path: str, meta: records.LMDBMeta) -> _Handle:
    handle = shared_handle(path)
    if handle.meta != meta:
        raise FormatError(f"{path}: the pack was replaced since this dataset opened it")
    return handle


class LMDBSource:
    """The images of a fastloader LMDB, as a :class:`~fastloader.datasets.base.Source`, and their
    fields as a :class:`~fastloader.fields.source.FieldSource` (a pack with fields).

    ``verify_checksums=True`` checks every record's CRC32C on read (a few % of CPU; ``fastloader
    verify`` checks them all at once instead). ``classes`` holds the class names the pack recorded,
    or None when its source had none.

    In a pack with fields, ``read(i)`` keeps the bytes after item ``i``'s image (its fields, a copy)
    and ``read_field(i, name)`` reads them from there: the image and then its fields cost one
    ``txn.get``. A pack without fields keeps nothing.
    """

    def __init__(self, path: str | os.PathLike[str], *, verify_checksums: bool = False) -> None:
        self.path = os.fspath(path)
        self.verify_checksums = verify_checksums
        self.meta = shared_handle(self.path).meta
        self.classes: list[str] | None = None if self.meta.classes is None else list(self.meta.classes)
        self._count = self.meta.count
        self._local = ProcessLocal(functools.partial(_source_handle, self.path, self.meta))
        self._numbers = {name: number for number, (name, _) in enumerate(self.meta.fields)}
        # (index, fields section) of the last record read in this process. One immutable tuple,
        # replaced whole: safe to share between threads, and right in a forked child (a finished
        # pack never changes).
        self._last: tuple[int, bytes] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_last": None}

    def __len__(self) -> int:
        return self._count

    def _check(self, index: int) -> int:
        if not 0 <= index < self._count:
            raise IndexError(f"{self.path}: record {index} out of range for {self._count} records")
        return index

    def read(self, index: int) -> bytes:
        index = self._check(index)
        with self._local.get().env.begin(buffers=True) as txn:
            value = txn.get(records.record_key(index))
            if value is None:
                raise FormatError(f"{self.key(index)}: record missing")
            if not self._numbers:  # the hot path: a pack of images and labels
                return records.decode_record(value, self.key(index), self.verify_checksums)[1]
            header = self._header(value, index)
            self._last = (index, bytes(records.fields_section(value, header)))
            return bytes(memoryview(value)[records.HEADER.size : records.HEADER.size + header.length])

    def content_identity(self, index: int) -> bytes | None:
        """The record's header (its label, length and the CRC32C of its bytes): what the decoded cache checks
        before serving the item's pixels, read without copying the image. None for a missing record (the read
        names it)."""
        index = self._check(index)
        with self._local.get().env.begin(buffers=True) as txn:
            value = txn.get(records.record_key(index))
            return None if value is None else bytes(value[: records.HEADER.size])

    def _header(self, value: memoryview, index: int) -> records.RecordHeader:
        header = records.parse_header(value, self.key(index))
        if self.verify_checksums and records.record_checksum(value) != header.checksum:
            raise FormatError(f"{self.key(index)}: checksum mismatch: the record is corrupted")
        return header

    def field_kinds(self) -> dict[str, str]:
        """The fields the pack's records may carry (``{}`` for a pack of images and labels)."""
        return dict(self.meta.fields)

    def read_field(self, index: int, name: str) -> Any:
        """The value of item ``index``'s field ``name``; MissingField when the record has none."""
        index = self._check(index)
        number = self._numbers.get(name)
        if number is None:
            known = ", ".join(self._numbers) or "none"
            raise MissingField(f"{self.key(index)}: no field {name!r} (the pack's fields: {known})")
        last = self._last
        if last is not None and last[0] == index:
            section = last[1]
        else:
            with self._local.get().env.begin(buffers=True) as txn:
                value = txn.get(records.record_key(index))
                if value is None:
                    raise FormatError(f"{self.key(index)}: record missing")
                section = bytes(records.fields_section(value, self._header(value, index)))
            self._last = (index, section)
        data = records.parse_fields(section, self.key(index)).get(number)
        if data is None:
            raise MissingField(f"{self.key(index)}: no field {name!r}")
        return decode_value(self.meta.fields[number][1], data, f"{self.key(index)}: field {name!r}")

    def label(self, index: int) -> int:
        return int(self._local.get().labels[self._check(index)])

    def key(self, index: int) -> str:
        return f"{self.path}[{index}]"

    def labels(self) -> np.ndarray:
        """Every label, as an int64 array (a copy: safe to keep after the source is gone)."""
        return np.array(self._local.get().labels)

    def source_key(self, index: int) -> str | None:
        """The key (path, member name) record ``index`` was packed from."""
        with self._local.get().env.begin(buffers=True) as txn:
            return source_key(txn, self._check(index))


class LMDBDataset(ImageDataset[Any]):
    """``(transform(image), target_transform(label))`` for every image of a fastloader LMDB.

    A drop-in for ``torchvision.datasets.ImageFolder`` over a packed folder: RGB ``PIL.Image``
    by default, ``classes`` and ``class_to_idx`` as the folder had them.

    ``fields``: samples with more than a label, from a pack with fields (``fields=("image",
    "caption", "label")``: tuple items; a mapping: dict items; see ``fastloader.fields``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        decode: Callable[[bytes, str], Any] = decode_pil,
        *,
        verify_checksums: bool = False,
        fields: Sequence[Spec] | Mapping[str, Spec] | None = None,
    ) -> None:
        source = LMDBSource(path, verify_checksums=verify_checksums)
        super().__init__(source, transform, target_transform, decode, fields=fields)
        self.path = source.path
