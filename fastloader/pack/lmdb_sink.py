"""The pack output that writes a fastloader LMDB (``fastloader pack --format lmdb``, the default).

Implements :class:`fastloader.pack.sink.Sink` (layout in ``fastloader.formats.lmdb_records``).

Fields: a sink opened with ``fields`` (name -> kind, from the engine) numbers them in that order,
lists them so in the metadata, and writes each item's fields after its image (version 2 records,
format version 2); without fields it writes exactly the version 1 pack of images and labels.

Durability and resume: items are buffered and written in one write transaction per batch
(``commit_every`` images or ``commit_bytes`` of record data, whichever comes first). The same
transaction writes the batch's records, its label and source-key chunks, its skipped items and
the progress record (next source position, record count). LMDB commits a transaction entirely or
not at all, so a pack killed at any moment (SIGKILL, power loss after ``fsync``) reopens with a
progress record that describes exactly the records present: the next run continues from its
``next_position``, with 0 samples lost and 0 duplicated. ``add`` checks and encodes an item whole
before accepting it (ValueError, nothing accepted, for one the pack cannot hold). A transaction that
fails (a full disk, the map unable to grow) poisons the sink: nothing more is written, ``add`` and
``checkpoint`` raise RuntimeError, ``close`` only closes, and the same command run again resumes from
the last commit.

The map grows by itself: the environment starts at ``map_size`` (1 GiB; on Linux the file grows
only as pages are written) and on ``lmdb.MapFullError`` the transaction is aborted, the map
doubled with ``env.set_mapsize`` and the whole batch written again.

A finished pack is never written again (its readers hold no locks, so a writer could reuse pages
they read): running the same command again finds it complete and only reports it.

One writer at a time: the sink holds an exclusive ``flock`` on the environment's ``lock.mdb``
(LMDB itself locks that file with ``fcntl`` byte ranges, which ``flock`` does not interact with on
Linux), so a second ``fastloader pack`` into the same destination fails at once, naming it.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Mapping
from typing import IO, Any

import lmdb
import numpy as np

from fastloader.errors import FormatError
from fastloader.formats import lmdb_records as records
from fastloader.formats.bad_samples import BadSample
from fastloader.formats.field_values import check_kind, encode_value
from fastloader.pack.sink import normalize_fingerprint
from fastloader.version import __version__

DEFAULT_MAP_SIZE = 1 << 30
DEFAULT_COMMIT_EVERY = 256
DEFAULT_COMMIT_BYTES = 64 << 20


def _differences(old: dict[str, Any], new: dict[str, Any]) -> str:
    names = sorted(name for name in set(old) | set(new) if old.get(name) != new.get(name))
    return ", ".join(names) or "nothing"


def _check_destination(path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise FormatError(f"{path}: exists and is not a directory (an LMDB pack is written as a directory)")
    os.makedirs(path, exist_ok=True)
    if not os.path.exists(os.path.join(path, "data.mdb")):
        others = sorted(set(os.listdir(path)) - {"lock.mdb"})
        if others:
            raise FormatError(f"{path}: exists, holds no LMDB and is not empty ({others[0]}, ...): choose another")


def _lock_exclusive(path: str) -> IO[bytes]:
    lock = open(os.path.join(path, "lock.mdb"), "rb")  # held until the sink closes
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise RuntimeError(f"{path}: another fastloader pack is writing into it") from None
    return lock


class LMDBSink:
    """Write packed images into a fastloader LMDB at ``dst`` (a directory; see the module docstring)."""

    def __init__(
        self,
        dst: str | os.PathLike[str],
        fingerprint: dict[str, Any],
        *,
        map_size: int = DEFAULT_MAP_SIZE,
        commit_every: int = DEFAULT_COMMIT_EVERY,
        commit_bytes: int = DEFAULT_COMMIT_BYTES,
        fields: Mapping[str, str] | None = None,
    ) -> None:
        if commit_every < 1 or commit_bytes < 1 or map_size < 1:
            raise ValueError("map_size, commit_every and commit_bytes must be positive")
        self.path = os.fspath(dst)
        self.fingerprint = normalize_fingerprint(fingerprint)
        # The pack's schema: field number i is the i-th of ``fields`` (their order is the engine's).
        self.fields: tuple[tuple[str, str], ...] = tuple(
            (name, check_kind(kind, name)) for name, kind in (fields or {}).items()
        )
        self._numbers = {name: number for number, (name, _) in enumerate(self.fields)}
        self.version = records.format_version(self.fields)
        self.commit_every, self.commit_bytes = commit_every, commit_bytes
        _check_destination(self.path)
        # max_spare_txns=0: set_mapsize must not run while any transaction, even a cached one, lives.
        # meminit stays on: with it off, LMDB writes stale heap bytes into unused page space, and the
        # packed file would carry this process's memory to whoever reads the dataset.
        try:
            self._env = lmdb.open(self.path, map_size=map_size, readahead=False, max_spare_txns=0)
        except lmdb.Error as error:  # e.g. "already open in this process": a dataset here still reads it
            raise FormatError(f"{self.path}: cannot open the LMDB for writing: {error}") from error
        lock: IO[bytes] | None = None
        try:
            lock = _lock_exclusive(self.path)
            self._env.reader_check()  # free reader slots left by killed processes
            self._progress = self._load_progress()
        except BaseException:
            self._env.close()
            if lock is not None:
                lock.close()
            raise
        self._lock = lock
        self._next_position = self._progress.next_position
        self._records: list[tuple[bytes, bytes]] = []
        self._labels: list[int] = []
        self._keys: list[str] = []
        self._pending_skipped: list[BadSample] = []
        self._pending_bytes = 0
        self._closed = False
        self._failure: BaseException | None = None  # the write that poisoned the sink

    def _load_progress(self) -> records.PackProgress:
        with self._env.begin() as txn:
            raw = txn.get(records.PROGRESS_KEY)
            entries = txn.stat()["entries"]
            self._finished = txn.get(records.META_KEY) is not None
        if raw is None:
            if entries:
                raise FormatError(f"{self.path}: an LMDB not written by `fastloader pack`: choose another destination")
            return records.PackProgress(self.fingerprint, 0, 0, version=self.version)
        progress = records.PackProgress.from_json(raw, self.path)
        if progress.fingerprint != self.fingerprint:
            raise FormatError(
                f"{self.path}: holds a different pack (not the same "
                f"{_differences(progress.fingerprint, self.fingerprint)} as this command): remove it or choose another"
            )
        return progress

    def resume_position(self) -> int:
        return self._progress.next_position

    def _check_healthy(self) -> None:
        if self._failure is not None:
            raise RuntimeError(
                f"{self.path}: an earlier write failed ({type(self._failure).__name__}: {self._failure}); this sink "
                "can only be closed: run the same pack again to resume from its last commit"
            )

    def _accept(self, position: int) -> None:
        self._check_healthy()
        if self._finished:
            raise ValueError(f"{self.path}: the pack is finished; it is never written again")
        if position < self._next_position:
            raise ValueError(f"{self.path}: position {position} handed over after {self._next_position - 1}")
        self._next_position = position + 1

    def _encode_fields(self, key: str, fields: Mapping[str, Any] | None) -> list[tuple[int, bytes]] | None:
        """The item's fields as (field number, canonical bytes), by number; None in a pack without fields."""
        if not self.fields:
            if fields:
                raise ValueError(f"{key}: fields {sorted(fields)} given to a pack without fields")
            return None
        encoded = []
        for name, value in (fields or {}).items():
            number = self._numbers.get(name)
            if number is None:
                raise ValueError(f"{key}: field {name!r} is not one of the pack's fields ({', '.join(self._numbers)})")
            try:
                encoded.append((number, encode_value(self.fields[number][1], value)))
            except (TypeError, ValueError) as error:  # e.g. text holding lone surrogates: not UTF-8
                raise ValueError(f"{key}: field {name!r}: {error}") from error
        return sorted(encoded)

    def add(self, position: int, key: str, label: int, data: bytes, fields: Mapping[str, Any] | None = None) -> None:
        # May raise ValueError (an image or field too large, a field not in the schema): then nothing was accepted.
        value = records.encode_record(label, data, self._encode_fields(key, fields))
        try:
            records.encode_keys([key])  # what checkpoint() writes: a key it cannot encode would fail every commit
        except UnicodeEncodeError as error:
            raise ValueError(f"{key!r}: a key UTF-8 cannot hold ({error})") from None
        self._accept(position)
        number = self._progress.count + len(self._records)
        self._records.append((records.record_key(number), value))
        self._labels.append(label)
        self._keys.append(key)
        self._pending_bytes += len(value)
        if len(self._records) >= self.commit_every or self._pending_bytes >= self.commit_bytes:
            self.checkpoint()

    def add_skipped(self, position: int, key: str, reason: str) -> None:
        self._accept(position)
        self._pending_skipped.append(BadSample(position, key, reason))
        if len(self._pending_skipped) >= self.commit_every:
            self.checkpoint()

    def skipped(self) -> list[BadSample]:
        found = []
        with self._env.begin() as txn:
            cursor = txn.cursor()
            if cursor.set_range(records.SKIPPED_PREFIX):
                for key, value in cursor:
                    if not bytes(key).startswith(records.SKIPPED_PREFIX):
                        break
                    doc = json.loads(value)
                    position = records.chunk_start(records.SKIPPED_PREFIX, bytes(key))
                    found.append(BadSample(position, doc["key"], doc["reason"]))
        return found + self._pending_skipped

    def _write(self, fill: Callable[[lmdb.Transaction], None]) -> None:
        """Run ``fill`` in a write transaction and commit it, doubling the map until it fits.

        Any failure poisons the sink: what is committed stays as it is, nothing more is written (a
        commit that failed may still have landed; either way the progress record in it is right).
        """
        self._check_healthy()
        try:
            while True:
                txn = self._env.begin(write=True)
                try:
                    fill(txn)
                    txn.commit()
                    return
                except lmdb.MapFullError:
                    txn.abort()
                except BaseException:
                    txn.abort()
                    raise
                self._env.set_mapsize(self._env.info()["map_size"] * 2)
        except BaseException as error:
            self._failure = error
            if isinstance(error, ValueError):  # not a rejected item: the engine must not skip it and go on
                raise RuntimeError(f"{self.path}: a write transaction failed ({error})") from error
            raise

    def checkpoint(self) -> None:
        self._check_healthy()
        if self._next_position == self._progress.next_position:
            return
        start = self._progress.count
        progress = records.PackProgress(
            self.fingerprint, self._next_position, start + len(self._records), version=self.version
        )

        def fill(txn: lmdb.Transaction) -> None:
            for key, value in self._records:
                txn.put(key, value)
            if self._records:
                txn.put(records.chunk_key(records.LABEL_CHUNK_PREFIX, start), records.encode_labels(self._labels))
                txn.put(records.chunk_key(records.KEY_CHUNK_PREFIX, start), records.encode_keys(self._keys))
            for item in self._pending_skipped:
                doc = {"key": item.key, "reason": item.reason}
                txn.put(records.skipped_key(item.position), json.dumps(doc).encode())
            txn.put(records.PROGRESS_KEY, progress.to_json())

        self._write(fill)
        self._progress = progress
        self._records, self._labels, self._keys, self._pending_skipped = [], [], [], []
        self._pending_bytes = 0

    def _all_labels(self, txn: lmdb.Transaction) -> np.ndarray:
        """The label chunks of every committed transaction, joined in record order."""
        chunks, total = [], 0
        cursor = txn.cursor()
        if cursor.set_range(records.LABEL_CHUNK_PREFIX):
            for key, value in cursor:
                if not bytes(key).startswith(records.LABEL_CHUNK_PREFIX):
                    break
                if records.chunk_start(records.LABEL_CHUNK_PREFIX, bytes(key)) != total:
                    raise FormatError(f"{self.path}: label chunks do not cover records {total}.. contiguously")
                chunks.append(records.decode_labels(value, self.path))
                total += len(chunks[-1])
        if total != self._progress.count:
            raise FormatError(f"{self.path}: {total} labels recorded for {self._progress.count} records")
        return np.concatenate(chunks) if chunks else np.empty(0, dtype=records.LABEL_DTYPE)

    def finish(self, classes: list[str] | None, meta: dict[str, Any]) -> None:
        """Write the labels and the metadata (the commit point), then close."""
        if self._finished:  # readers open it without locks: a finished pack is never written again
            self.close()
            return
        self.checkpoint()
        num_skipped = len(self.skipped())

        def fill(txn: lmdb.Transaction) -> None:
            txn.put(records.LABELS_KEY, records.encode_labels(self._all_labels(txn)))
            final = records.LMDBMeta(
                count=self._progress.count,
                classes=None if classes is None else tuple(classes),
                fingerprint=self.fingerprint,
                num_skipped=num_skipped,
                created_by=f"fastloader {__version__}",
                pack=dict(meta),
                fields=self.fields,
                version=self.version,
            )
            txn.put(records.META_KEY, final.to_json())

        self._write(fill)
        self.close()

    def close(self) -> None:
        """Close without finishing: what was checkpointed stays; what was not is redone on resume."""
        if not self._closed:
            self._closed = True
            self._env.close()
            self._lock.close()
