"""What the pack outputs that write a directory of data files (tar shards, Parquet files) share: durability.

A destination holds numbered data files, ``{prefix}-000000{suffix}``, ``{prefix}-000001{suffix}``,
..., and the pack's state (:mod:`fastloader.formats.pack_state`): its progress file while packing,
its manifest once finished. A destination that holds another pack (another fingerprint, another
format, an LMDB) or data files no pack recorded is refused, never mixed with.

An item is checked and encoded whole before any of it is written (``add`` raises ValueError, having
written nothing, for an item the format cannot hold). Durability comes in whole files: a file is
written under a hidden temporary name, fsynced, renamed into place, checked (the tar sink indexes it,
the Parquet sink reads its footer back), the directory fsynced, and only then recorded in the
progress file (atomically replaced) with its size and the SHA-256 of its bytes. The recorded position
never runs past the last recorded file. A run killed at any moment leaves at most one unrecorded file
(temporary, or renamed with or without its index), which the next run deletes and rewrites from the
recorded source position: 0 samples lost, 0 duplicated.

A write that fails at any step (a full disk, an I/O error) *poisons* the sink: the open file is
discarded and nothing more is recorded (``add``, ``checkpoint`` and ``finish`` raise RuntimeError
naming the first failure; ``close`` only closes), so the progress file keeps describing the last
durable state, and the same command run again finishes the pack. A failure after the item was
checked is never a ValueError, which the engine would take for a rejected item.

``checkpoint()`` makes skipped items durable but never closes a file early (files keep their size),
so unlike the rest of the :class:`~fastloader.pack.sink.Sink` contract, data added since the last
full file is not durable after it: a resumed run redoes up to one file of work. ``finish()`` closes
the last, possibly short, file and then writes the manifest: the commit point.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from fastloader.errors import FormatError
from fastloader.formats.bad_samples import BadSample
from fastloader.formats.pack_state import ShardRecord, StateT
from fastloader.formats.parquet_pack import ParquetPackState
from fastloader.formats.tar_content import file_sha256
from fastloader.formats.tar_manifest import TarPackState
from fastloader.pack.sink import normalize_fingerprint
from fastloader.storage import atomic_write_bytes

# What marks a destination as another format's pack.
_PACK_FILES = {
    name: state.WHAT
    for state in (TarPackState, ParquetPackState)
    for name in (state.MANIFEST_NAME, state.PROGRESS_NAME)
}
_PACK_FILES["data.mdb"] = "LMDB"


class OpenFile(Protocol):
    @property
    def name(self) -> str:
        """Its file name once in place, beside the manifest."""
        ...


FileT = TypeVar("FileT", bound=OpenFile)
ItemT = TypeVar("ItemT")


def data_files(directory: Path, prefix: str, suffix: str) -> list[Path]:
    """The data files of a pack's name pattern in ``directory`` (``{prefix}-NNNNNN{suffix}``), by name."""
    pattern = re.compile(rf"{re.escape(prefix)}-\d+{re.escape(suffix)}")
    return sorted(path for path in directory.iterdir() if pattern.fullmatch(path.name))


class ShardedSink(ABC, Generic[StateT, FileT, ItemT]):
    """The :class:`~fastloader.pack.sink.Sink` bookkeeping of a directory of data files (see the module doc).

    A format's sink builds the state a new pack starts from (``fresh``) and implements four hooks:
    ``_encode`` checks and encodes an item whole, writing nothing (ValueError when it is bad);
    ``_append`` appends an encoded item to the open file (``self._file``, opened under the name
    ``_next_name()`` when None) and returns the samples that file holds; ``_commit`` makes the open
    file durable under its name, checks it and returns its samples; ``_discard`` deletes its
    temporary. Any exception from the last three poisons the sink (see the module doc).
    """

    SUFFIX: ClassVar[str]  # of the data file names
    TEMPORARY_SUFFIXES: ClassVar[tuple[str, ...]] = (".tmp",)  # of what AtomicFile and atomic_write leave

    def __init__(self, dst_dir: str | os.PathLike[str], fresh: StateT, *, prefix: str, shard_size: int) -> None:
        if not isinstance(shard_size, int) or shard_size < 1:
            raise ValueError(f"shard_size must be a positive integer, got {shard_size!r}")
        fresh = dataclasses.replace(fresh, fingerprint=normalize_fingerprint(fresh.fingerprint))
        self.dst_dir = Path(dst_dir)
        self.shard_size = shard_size
        self.prefix = prefix
        if self.dst_dir.exists() and not self.dst_dir.is_dir():
            raise FormatError(f"{self.dst_dir}: exists and is not a directory")
        self.dst_dir.mkdir(parents=True, exist_ok=True)
        self._state = self._open_state(fresh)
        self._pending_skipped: list[BadSample] = []
        self._next_position = self._state.position  # the lowest position add / add_skipped accept
        self._file: FileT | None = None
        self._closed = False
        self._failure: BaseException | None = None  # the write that poisoned the sink
        if not self._state.complete:
            self._discard_unrecorded()

    def _open_state(self, fresh: StateT) -> StateT:
        """The state the destination records, else ``fresh`` when it holds nothing of another pack."""
        for name in (fresh.MANIFEST_NAME, fresh.PROGRESS_NAME):
            if (self.dst_dir / name).exists():
                state = type(fresh).read(self.dst_dir / name)
                if state.identity() != fresh.identity():
                    described = ", ".join(f"{key} {value!r}" for key, value in state.identity().items())
                    raise FormatError(
                        f"{self.dst_dir}: holds a different pack ({described}); pack into a new directory or "
                        "delete this one"
                    )
                return state
        for name, what in _PACK_FILES.items():
            if (self.dst_dir / name).exists():
                raise FormatError(f"{self.dst_dir}: holds a {what} pack; pack {fresh.WHAT} into a new directory")
        if self._data_files():
            raise FormatError(
                f"{self.dst_dir}: holds {self.prefix}-*{self.SUFFIX} files that no fastloader pack recorded; "
                "refusing to overwrite them (pack into an empty directory)"
            )
        return fresh

    def _data_files(self) -> list[Path]:
        return data_files(self.dst_dir, self.prefix, self.SUFFIX)

    def _next_name(self) -> str:
        return f"{self.prefix}-{len(self._state.shards):06d}{self.SUFFIX}"

    def _discard_unrecorded(self) -> None:
        """Delete what a killed or failed run left beyond the recorded state: temporaries, unrecorded files."""
        recorded = {shard.name for shard in self._state.shards}
        for path in self._data_files():
            if path.name not in recorded:
                self._delete_unrecorded(path)
        # Temporaries of a killed run: the open file, and atomic writes of the state (or of an index).
        hidden = (f".{self.prefix}-", f".{self._state.MANIFEST_NAME}.", f".{self._state.PROGRESS_NAME}.")
        for path in self.dst_dir.iterdir():
            if path.name.startswith(hidden) and path.name.endswith(self.TEMPORARY_SUFFIXES):
                path.unlink()
        for name in recorded:
            if not (self.dst_dir / name).is_file():
                raise FormatError(f"{self.dst_dir}: file {name} is recorded as complete but missing")

    def _delete_unrecorded(self, path: Path) -> None:
        path.unlink()

    # -- the hooks of a format ---------------------------------------------------------------------

    @abstractmethod
    def _encode(self, key: str, label: int, data: bytes, fields: Mapping[str, Any]) -> ItemT: ...

    @abstractmethod
    def _append(self, item: ItemT) -> int: ...

    @abstractmethod
    def _commit(self, file: FileT) -> int: ...

    @abstractmethod
    def _discard(self, file: FileT) -> None: ...

    # -- the Sink protocol ------------------------------------------------------------------------

    def resume_position(self) -> int:
        return self._state.position

    def add(self, position: int, key: str, label: int, data: bytes, fields: Mapping[str, Any] | None = None) -> None:
        self._check_position(position)
        item = self._encode(key, label, data, fields or {})  # ValueError: a bad item, nothing written
        with self._writing(f"writing {key!r}"):
            samples = self._append(item)
            if samples >= self.shard_size:
                self._close_file(position + 1)
        self._next_position = position + 1

    def add_skipped(self, position: int, key: str, reason: str) -> None:
        self._check_position(position)
        self._pending_skipped.append(BadSample(position, key, reason))
        self._next_position = position + 1

    def skipped(self) -> list[BadSample]:
        return [*self._state.skipped, *self._pending_skipped]

    def checkpoint(self) -> None:
        """Record skipped items when no file is open; an open file stays open (see the module doc)."""
        self._check_open()
        if self._file is None and self._next_position > self._state.position:
            with self._writing("recording progress"):
                self._record(self._state.shards, self._next_position)

    def finish(self, classes: list[str] | None, meta: dict[str, Any]) -> None:
        self._check_open()
        with self._writing("finishing the pack"):
            if self._file is not None:
                self._close_file(self._next_position)  # the last, possibly short, file
            state = dataclasses.replace(
                self._state,
                position=self._next_position,
                skipped=(*self._state.skipped, *self._pending_skipped),
                complete=True,
                classes=None if classes is None else list(classes),
                meta=dict(meta),
            )
            atomic_write_bytes(self.dst_dir / state.MANIFEST_NAME, state.to_json())  # the commit point
            self._state, self._pending_skipped = state, []
        (self.dst_dir / self._state.PROGRESS_NAME).unlink(missing_ok=True)
        self._closed = True

    def close(self) -> None:
        """Close without finishing; a healthy sink first records skipped items (``checkpoint``)."""
        if self._closed:
            return
        try:
            if self._file is not None:
                file, self._file = self._file, None
                self._discard(file)  # not durable: the next run rewrites it
            elif self._failure is None and not self._state.complete:
                self.checkpoint()
        finally:
            self._closed = True

    # -- internals --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self.dst_dir}: this {self._state.WHAT} sink is closed")
        if self._failure is not None:
            raise RuntimeError(
                f"{self.dst_dir}: an earlier write failed ({_describe(self._failure)}); this sink can only be "
                "closed: run the same pack again to resume from its last durable file"
            )

    def _check_position(self, position: int) -> None:
        self._check_open()
        if self._state.complete:
            raise ValueError(f"{self.dst_dir}: the pack is already finished; nothing more can be added")
        if position < self._next_position:
            raise ValueError(
                f"{self.dst_dir}: source position {position} is not after the previous one "
                f"({self._next_position - 1}); positions must strictly increase from resume_position()"
            )

    @contextlib.contextmanager
    def _writing(self, what: str) -> Iterator[None]:
        """Poison the sink when the write in this block fails, whatever the step (see the module doc)."""
        try:
            yield
        except BaseException as error:
            self._failure = self._failure or error
            if isinstance(error, ValueError):  # not a rejected item: the engine must not skip it and go on
                raise RuntimeError(
                    f"{self.dst_dir}: {what} failed ({_describe(error)}); what was durable is kept: run the same "
                    "pack again to resume"
                ) from error
            raise

    def _close_file(self, end_position: int) -> None:
        """Make the open file durable and checked (``_commit``), then record it as ending at ``end_position``."""
        file, self._file = self._file, None
        if file is None:
            raise RuntimeError("no file is open")
        try:
            samples = self._commit(file)
            _fsync_directory(self.dst_dir)  # the rename is durable before the progress file names the file
        except BaseException:
            self._discard(file)  # a file already renamed into place stays unrecorded: the next run deletes it
            raise
        size, sha256 = self._content(file)
        record = ShardRecord(file.name, samples, end_position, size, sha256, self._index_digest(file))
        self._record((*self._state.shards, record), end_position)

    def _content(self, file: FileT) -> tuple[int, str]:
        """The size and SHA-256 of a committed file's bytes, as the manifest records them (read back once)."""
        path = self.dst_dir / file.name
        return path.stat().st_size, file_sha256(path)

    def _index_digest(self, file: FileT) -> str | None:
        """The digest of a committed file's index, for formats that index their files (tar)."""
        return None

    def _record(self, shards: tuple[ShardRecord, ...], position: int) -> None:
        """Replace the progress file: ``shards``, and every skipped item below ``position``, are now durable."""
        state = dataclasses.replace(
            self._state, shards=shards, position=position, skipped=(*self._state.skipped, *self._pending_skipped)
        )
        atomic_write_bytes(self.dst_dir / state.PROGRESS_NAME, state.to_json())
        self._state, self._pending_skipped = state, []  # only once it is written: a failed write records nothing


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _fsync_directory(directory: Path) -> None:
    """Persist a rename: without it a power cut can bring back the old directory entry."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
