"""The pack output that writes WebDataset-compatible tar shards (``fastloader pack --format tar``).

Layout of a destination directory::

    shard-000000.tar              members 000000000.jpg, 000000000.cls, 000000000.caption.txt, 000000001.png, ...
    shard-000000.tar.fl-idx       its index (offsets, labels, the source key of every sample, the digest
                                  of every member and the shard's SHA-256: fastloader.formats.tar_content)
    ...
    fastloader-tar.progress.json  while packing: completed shards, source position, skipped items
    fastloader-tar.json           written by finish(), last: the commit point that makes it readable

Sample keys are dot-free, zero-padded output sample numbers, so any WebDataset reader groups
``{key}.{ext}`` with ``{key}.cls``; the source key of each sample is kept in the shard's index.
Each field a sample carries (``fastloader.fields``) is one more member, ``{key}.{extension}``, holding
the canonical bytes of its value (``encode_value``); the manifest maps each field's original name to
its kind and member extension (see :mod:`fastloader.formats.tar_manifest` for how the extension is
chosen), so reading the pack gives back the exact names and kinds.

Shards are the data files of :mod:`fastloader.pack.shard_sink`, which says how they become durable
(a resumed run redoes at most one shard, and a failed commit poisons the sink); the open shard's
temporary is ``.{name}.partial``, and a shard is indexed (``{name}.fl-idx``, with the source key of each
sample) after its rename and before it is recorded: a shard renamed but not recorded, with or without
its index, is deleted (index first) by the next run.
"""

from __future__ import annotations

import dataclasses
import io
import os
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from fastloader.errors import FormatError
from fastloader.formats.field_values import check_value, encode_value
from fastloader.formats.index_file import pack_strings
from fastloader.formats.tar_content import member_digest
from fastloader.formats.tar_index_digest import index_digest
from fastloader.formats.tar_manifest import TarPackState, field_members
from fastloader.formats.tar_shards import IMAGE_EXTS, build_shard_index, default_index_path
from fastloader.pack.shard_sink import ShardedSink

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
        self.digests: list[int] = []  # each member's (tar_content.member_digest), in tar order
        self.content: tuple[int, str] | None = None  # its size and SHA-256, once indexed
        self.index_sha256: str | None = None  # the digest of its index's arrays, once indexed

    def add_member(self, name: str, data: bytes, mtime: int) -> None:
        self.digests.append(member_digest(name, data))
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


@dataclass(frozen=True)
class _Sample:
    """A checked sample: its source key and its members' (extension, bytes), image first, as written."""

    key: str
    members: list[tuple[str, bytes]]


class TarShardSink(ShardedSink[TarPackState, _OpenShard, _Sample]):
    """Write packed samples into tar shards of ``shard_size`` samples under ``dst_dir`` (see module doc).

    Implements :class:`fastloader.pack.sink.Sink`. Opening a destination that holds a different pack
    (another ``fingerprint``, ``prefix`` or ``fields``, another format) raises
    :class:`~fastloader.errors.FormatError`. ``add`` raises ValueError, writing nothing, for bytes
    that are not a known image format or a field value that is not of its kind; the engine may then
    ``add_skipped`` the same position. ``fields`` (name -> kind) are the fields samples may carry;
    two whose member extensions would be the same (see the module docstring) are a ValueError.

    ``first_sample`` numbers the first sample's members (default 0) and ``created`` fixes the pack's
    creation time, every member's mtime (default: now): a Ray pack (``fastloader.pack.ray_shard``)
    writes each shard with a sink of its own, numbered from the shard's first source position, and a
    retried task writes the same bytes.
    """

    SUFFIX = ".tar"
    TEMPORARY_SUFFIXES = (".tmp", _PARTIAL_SUFFIX)

    def __init__(
        self,
        dst_dir: str | os.PathLike[str],
        fingerprint: dict[str, Any],
        *,
        shard_size: int = 10000,
        prefix: str = "shard",
        fields: Mapping[str, str] | None = None,
        first_sample: int = 0,
        created: int | None = None,
    ) -> None:
        if not prefix or "/" in prefix or prefix.startswith("."):
            raise ValueError(f"prefix must be a plain, non-hidden file name prefix, got {prefix!r}")
        try:
            self._fields = field_members(fields or {})
        except ValueError as error:
            raise ValueError(f"{dst_dir}: {error}") from None
        fresh = TarPackState(fingerprint=fingerprint, prefix=prefix, fields=self._fields)
        if created is not None:
            fresh = dataclasses.replace(fresh, created=created)
        self._first_sample = first_sample
        super().__init__(dst_dir, fresh, prefix=prefix, shard_size=shard_size)

    def _delete_unrecorded(self, path: Path) -> None:
        default_index_path(path).unlink(missing_ok=True)  # the index first: never an index without its shard
        path.unlink()

    def _encode(self, key: str, label: int, data: bytes, fields: Mapping[str, Any]) -> _Sample:
        ext = image_extension(data)
        if ext is None:
            raise ValueError(f"{key}: not a known image format (first bytes {data[:8]!r}); nothing written")
        try:
            pack_strings([key])  # the index holds the source key
        except UnicodeEncodeError as error:
            raise ValueError(f"{key!r}: a key UTF-8 cannot hold ({error}); nothing written") from None
        members = [(ext, bytes(data))]
        if label != _NO_LABEL:
            members.append(("cls", str(int(label)).encode()))
        return _Sample(key, [*members, *self._field_members(key, fields)])

    def _append(self, sample: _Sample) -> int:
        if self._file is None:
            self._file = _OpenShard(self.dst_dir, self._next_name(), self._first_sample + self._state.count)
        shard = self._file
        name = f"{shard.first_sample + len(shard.source_keys):09d}"
        for extension, value in sample.members:
            shard.add_member(f"{name}.{extension}", value, self._state.created)
        shard.source_keys.append(sample.key)
        return len(shard.source_keys)

    def _field_members(self, key: str, fields: Mapping[str, Any]) -> list[tuple[str, bytes]]:
        """(member extension, canonical bytes) of each field value, in the order of the sink's fields."""
        unknown = sorted(set(fields) - set(self._fields))
        if unknown:
            raise ValueError(f"{key}: fields {unknown} were not declared when the sink was opened; nothing written")
        members = []
        for name, member in self._fields.items():
            if name in fields:
                value = check_value(member.kind, fields[name], f"{key}: field {name!r}")  # FormatError: a ValueError
                try:
                    members.append((member.extension, encode_value(member.kind, value)))
                except UnicodeEncodeError as error:  # text or JSON holding lone surrogates: valid str, not UTF-8
                    raise ValueError(f"{key}: field {name!r}: {error}") from None
        return members

    def _commit(self, shard: _OpenShard) -> int:
        """fsync the shard, rename it into place, index it."""
        shard.close_file()
        final = self.dst_dir / shard.name
        os.replace(shard.temp, final)
        key_blob, key_offsets = pack_strings(shard.source_keys)
        index = build_shard_index(
            str(final),
            default_index_path(final),
            IMAGE_EXTS,
            {
                "source_key_blob": key_blob,
                "source_key_offsets": key_offsets,
                "member_digest": np.array(shard.digests, dtype=np.uint64),
            },
            content_hash=True,
        )
        if index.meta["samples"] != len(shard.source_keys):
            raise FormatError(f"{final}: indexed {index.meta['samples']} samples, wrote {len(shard.source_keys)}")
        shard.content = int(index.meta["shard_size"]), str(index.meta["content_sha256"])
        shard.index_sha256 = index_digest(index.arrays, index.meta)
        return len(shard.source_keys)

    def _content(self, file: _OpenShard) -> tuple[int, str]:
        if file.content is None:
            raise RuntimeError(f"{file.name}: not indexed")
        return file.content  # hashed when indexed: the bytes are not read a third time

    def _index_digest(self, file: _OpenShard) -> str | None:
        return file.index_sha256

    def _discard(self, shard: _OpenShard) -> None:
        shard.discard()
