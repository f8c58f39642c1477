"""What the pack outputs that write a directory of data files (tar shards, Parquet files) share: durability.

A destination holds numbered data files, ``{prefix}-000000{suffix}``, ``{prefix}-000001{suffix}``,
..., and the pack's state (:mod:`fastloader.formats.pack_state`): its progress file while packing,
its manifest once finished. A destination that holds another pack (another fingerprint, another
format, an LMDB) or data files no pack recorded is refused, never mixed with.

Durability comes in whole files: a file is written under a hidden temporary name, fsynced, renamed
into place, checked (the tar sink indexes it, the Parquet sink reads its footer back), and only then
recorded in the progress file (atomically replaced, after an fsync of the directory). A run killed at
any moment leaves at most one unrecorded file (temporary or renamed), which the next run deletes and
rewrites from the recorded source position: 0 samples lost, 0 duplicated. ``checkpoint()`` makes
skipped items durable but never closes a file early (files keep their size), so unlike the rest of
the :class:`~fastloader.pack.sink.Sink` contract, data added since the last full file is not durable
after it: a resumed run redoes up to one file of work. ``finish()`` closes the last, possibly short,
file and then writes the manifest: the commit point.
"""

from __future__ import annotations

import dataclasses
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from fastloader.errors import FormatError
from fastloader.formats.bad_samples import BadSample
from fastloader.formats.pack_state import ShardRecord, StateT
from fastloader.formats.parquet_pack import ParquetPackState
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


class ShardedSink(ABC, Generic[StateT, FileT]):
    """The :class:`~fastloader.pack.sink.Sink` bookkeeping of a directory of data files (see the module doc).

    A format's sink builds the state a new pack starts from (``fresh``) and implements three hooks:
    ``_write`` checks an item (ValueError, writing nothing, when it is bad), then appends it to the
    open file (``self._file``, opened under the name ``_next_name()`` when None) and returns the
    samples that file holds; ``_commit`` makes the open file durable under its name, checks it and
    returns its samples; ``_discard`` deletes it.
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
        pattern = re.compile(rf"{re.escape(self.prefix)}-\d+{re.escape(self.SUFFIX)}")
        return [path for path in self.dst_dir.iterdir() if pattern.fullmatch(path.name)]

    def _next_name(self) -> str:
        return f"{self.prefix}-{len(self._state.shards):06d}{self.SUFFIX}"

    def _discard_unrecorded(self) -> None:
        """Delete what a killed run left beyond the recorded state: a temporary or an unrecorded file."""
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
    def _write(self, key: str, label: int, data: bytes, fields: Mapping[str, Any]) -> int: ...

    @abstractmethod
    def _commit(self, file: FileT) -> int: ...

    @abstractmethod
    def _discard(self, file: FileT) -> None: ...

    # -- the Sink protocol ------------------------------------------------------------------------

    def resume_position(self) -> int:
        return self._state.position

    def add(self, position: int, key: str, label: int, data: bytes, fields: Mapping[str, Any] | None = None) -> None:
        self._check_position(position)
        samples = self._write(key, label, data, fields or {})
        self._next_position = position + 1
        if samples >= self.shard_size:
            self._close_file()

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
            self._record(self._state.shards)

    def finish(self, classes: list[str] | None, meta: dict[str, Any]) -> None:
        self._check_open()
        if self._file is not None:
            self._close_file()  # the last, possibly short, file
        self._state = dataclasses.replace(
            self._state,
            position=self._next_position,
            skipped=(*self._state.skipped, *self._pending_skipped),
            complete=True,
            classes=None if classes is None else list(classes),
            meta=dict(meta),
        )
        self._pending_skipped = []
        atomic_write_bytes(self.dst_dir / self._state.MANIFEST_NAME, self._state.to_json())  # the commit point
        (self.dst_dir / self._state.PROGRESS_NAME).unlink(missing_ok=True)
        self._closed = True

    def close(self) -> None:
        if self._closed:
            return
        if self._file is not None:
            self._discard(self._file)  # not durable: the next run rewrites it
            self._file = None
        elif not self._state.complete:
            self.checkpoint()
        self._closed = True

    # -- internals --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self.dst_dir}: this {self._state.WHAT} sink is closed")

    def _check_position(self, position: int) -> None:
        self._check_open()
        if self._state.complete:
            raise ValueError(f"{self.dst_dir}: the pack is already finished; nothing more can be added")
        if position < self._next_position:
            raise ValueError(
                f"{self.dst_dir}: source position {position} is not after the previous one "
                f"({self._next_position - 1}); positions must strictly increase from resume_position()"
            )

    def _close_file(self) -> None:
        """Make the open file durable and checked (``_commit``), then record it."""
        file, self._file = self._file, None
        if file is None:
            raise RuntimeError("no file is open")
        try:
            samples = self._commit(file)
        except BaseException:
            self._discard(file)
            raise
        _fsync_directory(self.dst_dir)  # the rename is durable before the progress file names the file
        self._record((*self._state.shards, ShardRecord(file.name, samples, self._next_position)))

    def _record(self, shards: tuple[ShardRecord, ...]) -> None:
        """Replace the progress file: ``shards`` and every skipped item so far are now durable."""
        self._state = dataclasses.replace(
            self._state,
            shards=shards,
            position=self._next_position,
            skipped=(*self._state.skipped, *self._pending_skipped),
        )
        self._pending_skipped = []
        atomic_write_bytes(self.dst_dir / self._state.PROGRESS_NAME, self._state.to_json())


def _fsync_directory(directory: Path) -> None:
    """Persist a rename: without it a power cut can bring back the old directory entry."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
