"""The pack output that writes WebDataset-compatible tar shards (``fastloader pack --format tar``).

Layout of a destination directory::

    shard-000000.tar              members 000000000.jpg, 000000000.cls, 000000000.caption.txt, 000000001.png, ...
    shard-000000.tar.fl-idx       its index (offsets, labels, and the source key of every sample)
    ...
    fastloader-tar.progress.json  while packing: completed shards, source position, skipped items
    fastloader-tar.json           written by finish(), last: the commit point that makes it readable

Sample keys are dot-free, zero-padded output sample numbers, so any WebDataset reader groups
``{key}.{ext}`` with ``{key}.cls``; the source key of each sample is kept in the shard's index.
Each field a sample carries (``fastloader.fields``) is one more member, ``{key}.{extension}``, holding
the canonical bytes of its value (``encode_value``); the manifest maps each field's original name to
its kind and member extension (see :mod:`fastloader.formats.tar_manifest` for how the extension is
chosen), so reading the pack gives back the exact names and kinds.

Durability comes in whole shards: a shard is written to a hidden temporary name, fsynced, renamed,
indexed, and only then recorded in the progress file (atomically replaced). A run killed at any
moment leaves at most one unrecorded shard (temporary or renamed), which the next run deletes and
rewrites from the recorded source position: 0 samples lost, 0 duplicated. ``checkpoint()`` makes
skipped items durable but never closes a shard early (shards keep their size), so unlike the rest
of the :class:`~fastloader.pack_sink.Sink` contract, data added since the last full shard is not
durable after it: a resumed run redoes up to one shard of work.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from fastloader.errors import FormatError
from fastloader.fields.values import check_value, encode_value
from fastloader.formats.bad_samples import BadSample
from fastloader.formats.index_file import pack_strings
from fastloader.formats.tar_manifest import (
    MANIFEST_NAME,
    PACK_FORMAT,
    PACK_VERSION,
    PROGRESS_NAME,
    ShardRecord,
    TarPackState,
    field_members,
)
from fastloader.formats.tar_shards import IMAGE_EXTS, build_shard_index, default_index_path
from fastloader.storage import atomic_write_bytes

_PARTIAL_SUFFIX = ".partial"
_NO_LABEL = -1


def image_extension(data: bytes) -> str | None:
    """The file extension of an encoded image's real format (from its magic bytes), None if unknown."""
    if data.startswith(b"\xff\xd8\xff"):
        return "jpg"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    if data[:2] == b"BM":
        return "bmp"
    if len(data) > 2 and data[:1] == b"P" and data[1:2] in b"123456" and data[2:3].isspace():
        return {b"1": "pbm", b"4": "pbm", b"2": "pgm", b"5": "pgm"}.get(data[1:2], "ppm")
    return None


def normalize_fingerprint(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """``fingerprint`` as it reads back from JSON (tuples become lists), so that comparisons are fair."""
    try:
        normalized: dict[str, Any] = json.loads(json.dumps(fingerprint, sort_keys=True))
    except (TypeError, ValueError) as error:
        raise ValueError(f"fingerprint must be a JSON-serialisable dict ({error})") from None
    return normalized


class _OpenShard:
    """The shard being written, under its temporary name."""

    def __init__(self, directory: Path, name: str, first_sample: int) -> None:
        self.name = name
        self.first_sample = first_sample  # the output number of its first sample (the tar key)
        self.temp = directory / f".{name}{_PARTIAL_SUFFIX}"
        self.file: BinaryIO = open(self.temp, "wb")  # closed by close_file() or discard()
        # pax only where a name needs it (a long field extension): other headers are plain ustar.
        self.tar = tarfile.open(fileobj=self.file, mode="w", format=tarfile.PAX_FORMAT)
        self.source_keys: list[str] = []  # one shard's worth, dropped when it closes

    def add_member(self, name: str, data: bytes, mtime: int) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), mtime, 0o644
        self.tar.addfile(info, io.BytesIO(data))

    def close_file(self) -> None:
        self.tar.close()  # writes the end-of-archive blocks
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()

    def discard(self) -> None:
        try:
            self.file.close()  # may fail to flush (a full disk): the file goes anyway
        except OSError:
            pass
        self.temp.unlink(missing_ok=True)


class TarShardSink:
    """Write packed samples into tar shards of ``shard_size`` samples under ``dst_dir`` (see module doc).

    Implements :class:`fastloader.pack_sink.Sink`. Opening a destination that holds a pack with a
    different ``fingerprint`` (or ``prefix``) raises :class:`~fastloader.errors.FormatError`.
    ``add`` raises ValueError, writing nothing, for bytes that are not a known image format or a
    field value that is not of its kind; the engine may then ``add_skipped`` the same position.
    ``fields`` (name -> kind) are the fields samples may carry; two whose member extensions would
    be the same (see the module docstring) are a ValueError.
    """

    def __init__(
        self,
        dst_dir: str | os.PathLike[str],
        fingerprint: dict[str, Any],
        *,
        shard_size: int = 10000,
        prefix: str = "shard",
        fields: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(shard_size, int) or shard_size < 1:
            raise ValueError(f"shard_size must be a positive integer, got {shard_size!r}")
        if not prefix or "/" in prefix or prefix.startswith("."):
            raise ValueError(f"prefix must be a plain, non-hidden file name prefix, got {prefix!r}")
        self.dst_dir = Path(dst_dir)
        self.shard_size = shard_size
        try:
            self._fields = field_members(fields or {})
        except ValueError as error:
            raise ValueError(f"{dst_dir}: {error}") from None
        self.dst_dir.mkdir(parents=True, exist_ok=True)
        self._state = self._open_state(normalize_fingerprint(fingerprint), prefix)
        self._pending_skipped: list[BadSample] = []
        self._next_position = self._state.position  # the lowest position add / add_skipped accept
        self._shard: _OpenShard | None = None
        self._closed = False
        if not self._state.complete:
            self._discard_unrecorded()

    def _open_state(self, fingerprint: dict[str, Any], prefix: str) -> TarPackState:
        for name in (MANIFEST_NAME, PROGRESS_NAME):
            if (self.dst_dir / name).exists():
                state = TarPackState.read(self.dst_dir / name)
                if state.fingerprint != fingerprint or state.prefix != prefix or state.fields != self._fields:
                    raise FormatError(
                        f"{self.dst_dir}: holds a different pack (fingerprint {state.fingerprint}, prefix "
                        f"{state.prefix!r}, fields {sorted(state.fields)}); pack into a new directory or delete "
                        "this one"
                    )
                # A pack begun by an older fastloader (no fields) continues as the current version.
                return dataclasses.replace(state, format=PACK_FORMAT, version=PACK_VERSION)
        if any(self._shard_files(prefix)):
            raise FormatError(
                f"{self.dst_dir}: holds {prefix}-*.tar shards that no fastloader pack recorded; "
                "refusing to overwrite them (pack into an empty directory)"
            )
        return TarPackState(fingerprint=fingerprint, prefix=prefix, created=int(time.time()), fields=self._fields)

    def _shard_files(self, prefix: str) -> list[Path]:
        pattern = re.compile(rf"{re.escape(prefix)}-\d+\.tar")
        return [path for path in self.dst_dir.iterdir() if pattern.fullmatch(path.name)]

    def _discard_unrecorded(self) -> None:
        """Delete what a killed run left beyond the recorded state: a temporary or an unrecorded shard."""
        prefix = self._state.prefix
        recorded = {shard.name for shard in self._state.shards}
        for path in self._shard_files(prefix):
            if path.name not in recorded:
                path.unlink()
                default_index_path(path).unlink(missing_ok=True)
        # Temporaries of a killed run: the open shard, and atomic_write's of an index or the progress file.
        for path in [*self.dst_dir.glob(f".{prefix}-*"), *self.dst_dir.glob(".fastloader-tar*")]:
            if path.name.endswith((_PARTIAL_SUFFIX, ".tmp")):
                path.unlink()
        for name in recorded:
            if not (self.dst_dir / name).is_file():
                raise FormatError(f"{self.dst_dir}: shard {name} is recorded as complete but missing")

    # -- the Sink protocol ------------------------------------------------------------------------

    def resume_position(self) -> int:
        return self._state.position

    def add(self, position: int, key: str, label: int, data: bytes, fields: Mapping[str, Any] | None = None) -> None:
        self._check_position(position)
        ext = image_extension(data)
        if ext is None:
            raise ValueError(f"{key}: not a known image format (first bytes {data[:8]!r}); nothing written")
        members = self._field_members(key, fields or {})  # all encoded before anything is written
        if self._shard is None:
            name = f"{self._state.prefix}-{len(self._state.shards):06d}.tar"
            self._shard = _OpenShard(self.dst_dir, name, self._state.count)
        sample = f"{self._shard.first_sample + len(self._shard.source_keys):09d}"
        self._shard.add_member(f"{sample}.{ext}", data, self._state.created)
        if label != _NO_LABEL:
            self._shard.add_member(f"{sample}.cls", str(int(label)).encode(), self._state.created)
        for extension, value in members:
            self._shard.add_member(f"{sample}.{extension}", value, self._state.created)
        self._shard.source_keys.append(key)
        self._next_position = position + 1
        if len(self._shard.source_keys) >= self.shard_size:
            self._close_shard()

    def add_skipped(self, position: int, key: str, reason: str) -> None:
        self._check_position(position)
        self._pending_skipped.append(BadSample(position, key, reason))
        self._next_position = position + 1

    def skipped(self) -> list[BadSample]:
        return [*self._state.skipped, *self._pending_skipped]

    def checkpoint(self) -> None:
        """Record skipped items when no shard is open; an open shard stays open (see module doc)."""
        self._check_open()
        if self._shard is None and self._next_position > self._state.position:
            self._record(self._state.shards)

    def finish(self, classes: list[str] | None, meta: dict[str, Any]) -> None:
        self._check_open()
        if self._shard is not None:
            self._close_shard()  # the last, possibly short, shard
        self._state = dataclasses.replace(
            self._state,
            position=self._next_position,
            skipped=(*self._state.skipped, *self._pending_skipped),
            complete=True,
            classes=None if classes is None else list(classes),
            meta=dict(meta),
        )
        self._pending_skipped = []
        atomic_write_bytes(self.dst_dir / MANIFEST_NAME, self._state.to_json())  # the commit point
        (self.dst_dir / PROGRESS_NAME).unlink(missing_ok=True)
        self._closed = True

    def close(self) -> None:
        if self._closed:
            return
        if self._shard is not None:
            self._shard.discard()  # not durable: the next run rewrites it
            self._shard = None
        elif not self._state.complete:
            self.checkpoint()
        self._closed = True

    # -- internals --------------------------------------------------------------------------------

    def _field_members(self, key: str, fields: Mapping[str, Any]) -> list[tuple[str, bytes]]:
        """(member extension, canonical bytes) of each field value, in the order of the sink's fields."""
        unknown = sorted(set(fields) - set(self._fields))
        if unknown:
            raise ValueError(f"{key}: fields {unknown} were not declared when the sink was opened; nothing written")
        members = []
        for name, member in self._fields.items():
            if name in fields:
                value = check_value(member.kind, fields[name], f"{key}: field {name!r}")  # FormatError: a ValueError
                members.append((member.extension, encode_value(member.kind, value)))
        return members

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self.dst_dir}: this tar sink is closed")

    def _check_position(self, position: int) -> None:
        self._check_open()
        if self._state.complete:
            raise ValueError(f"{self.dst_dir}: the pack is already finished; nothing more can be added")
        if position < self._next_position:
            raise ValueError(
                f"{self.dst_dir}: source position {position} is not after the previous one "
                f"({self._next_position - 1}); positions must strictly increase from resume_position()"
            )

    def _close_shard(self) -> None:
        """Make the open shard durable: fsync, rename into place, index it, then record it."""
        if self._shard is None:
            raise RuntimeError("no shard is open")
        shard, self._shard = self._shard, None
        shard.close_file()
        final = self.dst_dir / shard.name
        os.replace(shard.temp, final)
        _fsync_directory(self.dst_dir)
        key_blob, key_offsets = pack_strings(shard.source_keys)
        index = build_shard_index(
            str(final),
            default_index_path(final),
            IMAGE_EXTS,
            {"source_key_blob": key_blob, "source_key_offsets": key_offsets},
        )
        if index.meta["samples"] != len(shard.source_keys):
            raise FormatError(f"{final}: indexed {index.meta['samples']} samples, wrote {len(shard.source_keys)}")
        record = ShardRecord(shard.name, len(shard.source_keys), self._next_position)
        self._record((*self._state.shards, record))

    def _record(self, shards: tuple[ShardRecord, ...]) -> None:
        """Replace the progress file: ``shards`` and every skipped item so far are now durable."""
        self._state = dataclasses.replace(
            self._state,
            shards=shards,
            position=self._next_position,
            skipped=(*self._state.skipped, *self._pending_skipped),
        )
        self._pending_skipped = []
        atomic_write_bytes(self.dst_dir / PROGRESS_NAME, self._state.to_json())


def _fsync_directory(directory: Path) -> None:
    """Persist a rename: without it a power cut can bring back the old directory entry."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
