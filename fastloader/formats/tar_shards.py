"""Tar shards in the WebDataset layout: walk the headers once, keep an index, read samples by offset.

A shard is a plain (uncompressed) POSIX tar. Consecutive members sharing a *key* form one sample;
the key is the member path up to the first dot of its base name (``a/b/x.seg.jpg`` has key
``a/b/x`` and extension ``seg.jpg``, lowercased). A sample's image is its first member whose
extension is in ``image_exts`` (in that order of preference); its label is the integer text of its
``.cls`` / ``.cls2`` / ``.class`` / ``.label`` member, -1 when it has none. Every other member of the
sample (a caption ``.txt``, a ``.json``, a mask ``.seg.png``, a second image, anything) is kept in the
index too: those are the sample's *fields* (``fastloader.fields``), read by extension.

We never extract and never trust a header further than the file (the header walk:
:mod:`fastloader.formats.tar_members`): member paths only become keys, data is read with
``os.pread`` at the offset recorded in the index. Members with an absolute path or a ``..``
component, links, devices and FIFOs are ignored (with a warning naming them).

The index of a shard (one :mod:`fastloader.formats.index_file`, ``<shard>.fl-idx`` beside it or in the cache
dir) is built once under a file lock and rebuilt when the shard's size or mtime changes. Its arrays,
one row per sample with an image, in shard order:

* ``key_blob`` / ``key_offsets``: the sample keys (``pack_strings``);
* ``data_offset``, ``data_size`` (int64): the image member's data; ``ext`` (uint8): its extension, a
  code into ``meta["exts"]``; ``label`` (int64, -1 for none);
* the other members, CSR: ``member_starts`` (int64, samples + 1 entries): sample ``i``'s members are
  rows ``member_starts[i] .. member_starts[i + 1] - 1`` of ``member_ext`` (int32, a code into
  ``meta["member_exts"]``), ``member_offset`` and ``member_size`` (int64), in tar order;
* for shards written by ``fastloader pack``, ``source_key_blob`` / ``source_key_offsets``, and (since
  tar packs of version 3) ``member_digest`` and the meta's ``content_sha256``: see
  :mod:`fastloader.formats.tar_content`, which also says what a reader given the manifest's
  ``expected`` size and hash checks when (an index that does not describe them is never rebuilt
  over: it keeps the digests ``verify`` names the changed members by).

Version 1 indexes had no member arrays. One written by ``fastloader pack`` (it has source keys)
indexes a shard that holds nothing but images and labels, so it is upgraded in place (no rescan:
for remote shards that would mean fetching every shard); any other is rebuilt.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastloader.errors import FormatError, printable
from fastloader.formats.index_file import IndexFile, cached_index, pack_strings, read_index, write_index
from fastloader.formats.tar_content import Expected, check_expected, fd_sha256, file_sha256
from fastloader.formats.tar_index_check import check_shard_index
from fastloader.formats.tar_index_digest import index_digest
from fastloader.formats.tar_members import Member, walk_members
from fastloader.storage import open_regular, sidecar_path

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "ppm", "pgm", "pbm", "pnm", "gif", "tif", "tiff")
LABEL_EXTS = ("cls", "cls2", "class", "label")
INDEX_KIND = "tar-shard"
INDEX_VERSION = 2
INDEX_SUFFIX = ".fl-idx"

_MAX_LABEL_BYTES = 64
_MAX_EXAMPLES = 10  # ignored members named in the index meta and the warning


def split_key(name: str) -> tuple[str, str] | None:
    """WebDataset's (key, extension) of a member name; None when the base name has no extension."""
    directory, slash, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not dot or not stem:
        return None
    return directory + slash + stem, ext.lower()


class _ShardRows:
    """The index rows of one shard while it is scanned (transient: dropped once written)."""

    def __init__(self, fd: int, shard: str, image_exts: Sequence[str]) -> None:
        self.fd, self.shard, self.image_exts = fd, shard, tuple(image_exts)
        self.keys: list[str] = []
        self.offsets: list[int] = []
        self.sizes: list[int] = []
        self.exts: list[int] = []
        self.labels: list[int] = []
        self.ext_table: list[str] = []
        self.member_starts: list[int] = [0]
        self.member_exts: list[int] = []
        self.member_offsets: list[int] = []
        self.member_sizes: list[int] = []
        self.member_ext_table: dict[str, int] = {}  # extension -> its code, in order of first appearance
        self.no_image = 0
        self.ignored: list[str] = []
        self.ignored_count = 0

    def scan(self) -> None:
        key: str | None = None
        group: dict[str, Member] = {}
        for member in walk_members(self.fd, self.shard):
            if member.problem:
                self.ignored_count += 1
                if len(self.ignored) < _MAX_EXAMPLES:
                    self.ignored.append(f"{member.name} ({member.problem})")
                continue
            parts = split_key(member.name)
            if parts is None:
                continue  # no extension: part of no sample, as in WebDataset
            if parts[0] != key:
                self._add_sample(key, group)
                key, group = parts[0], {}
            if parts[1] in group:
                raise FormatError(f"{self.shard}: member {member.name!r} appears twice in sample {key!r}")
            group[parts[1]] = member
        self._add_sample(key, group)

    def _add_sample(self, key: str | None, group: Mapping[str, Member]) -> None:
        if key is None:
            return
        image_ext = next((ext for ext in self.image_exts if ext in group), None)
        if image_ext is None:
            self.no_image += 1
            return
        label_ext = next((ext for ext in LABEL_EXTS if ext in group), None)
        if image_ext not in self.ext_table:
            self.ext_table.append(image_ext)
        self.keys.append(key)
        self.offsets.append(group[image_ext].offset)
        self.sizes.append(group[image_ext].size)
        self.exts.append(self.ext_table.index(image_ext))
        self.labels.append(-1 if label_ext is None else self._read_label(group[label_ext]))
        for ext, member in group.items():
            if ext not in (image_ext, label_ext):
                self.member_exts.append(self.member_ext_table.setdefault(ext, len(self.member_ext_table)))
                self.member_offsets.append(member.offset)
                self.member_sizes.append(member.size)
        self.member_starts.append(len(self.member_offsets))

    def _read_label(self, member: Member) -> int:
        text = os.pread(self.fd, min(member.size, _MAX_LABEL_BYTES + 1), member.offset)
        try:
            if len(text) > _MAX_LABEL_BYTES:
                raise ValueError("too long")
            label = int(text.decode("ascii").strip())
            if not -(2**63) <= label < 2**63:
                raise ValueError("out of int64 range")
        except (ValueError, UnicodeDecodeError):
            raise FormatError(
                f"{self.shard}: member {member.name!r}: label {text[:_MAX_LABEL_BYTES]!r} is not an integer"
            ) from None
        return label


def default_index_path(shard: str | os.PathLike[str]) -> Path:
    """Where the index of ``shard`` lives unless told otherwise."""
    return sidecar_path(shard, INDEX_SUFFIX)


def scan_shard(
    shard: str, image_exts: Sequence[str] = IMAGE_EXTS, content_hash: bool = False
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and meta of the index of ``shard``, from a walk of its members (nothing written; with
    ``content_hash``, the SHA-256 of every byte of the shard in the meta's ``content_sha256``)."""
    fd = open_regular(shard)  # a FIFO named *.tar: an error naming it, never a hang
    try:
        stat = os.fstat(fd)
        rows = _ShardRows(fd, shard, image_exts)
        rows.scan()
        sha256 = fd_sha256(fd) if content_hash else None
    finally:
        os.close(fd)
    key_blob, key_offsets = pack_strings(rows.keys)
    arrays = {
        "key_blob": key_blob,
        "key_offsets": key_offsets,
        "data_offset": np.asarray(rows.offsets, dtype=np.int64),
        "data_size": np.asarray(rows.sizes, dtype=np.int64),
        "ext": np.asarray(rows.exts, dtype=np.uint8),
        "label": np.asarray(rows.labels, dtype=np.int64),
        "member_starts": np.asarray(rows.member_starts, dtype=np.int64),
        "member_ext": np.asarray(rows.member_exts, dtype=np.int32),
        "member_offset": np.asarray(rows.member_offsets, dtype=np.int64),
        "member_size": np.asarray(rows.member_sizes, dtype=np.int64),
    }
    meta = {
        "shard_size": stat.st_size,
        "shard_mtime_ns": stat.st_mtime_ns,
        "image_exts": list(image_exts),
        "exts": rows.ext_table,
        "member_exts": list(rows.member_ext_table),
        "samples": len(rows.keys),
        "no_image": rows.no_image,
        "ignored": rows.ignored_count,
        "ignored_examples": rows.ignored,
        **({"content_sha256": sha256} if sha256 is not None else {}),
    }
    if rows.ignored_count:
        # Member names are the shard's to choose: escaped, or an ESC in one would drive the terminal.
        warnings.warn(
            printable(
                f"{shard}: ignored {rows.ignored_count} unsafe or non-regular member(s), e.g. {', '.join(rows.ignored)}"
            ),
            stacklevel=3,
        )
    return arrays, meta


def build_shard_index(
    shard: str,
    index_path: str | os.PathLike[str],
    image_exts: Sequence[str] = IMAGE_EXTS,
    extra_arrays: Mapping[str, np.ndarray] | None = None,
    content_hash: bool = False,
) -> IndexFile:
    """Scan ``shard`` (:func:`scan_shard`) and write its index to ``index_path`` (``extra_arrays`` stored
    alongside)."""
    arrays, meta = scan_shard(shard, image_exts, content_hash)
    write_index(index_path, INDEX_KIND, INDEX_VERSION, meta, {**arrays, **(extra_arrays or {})})
    return read_index(index_path, INDEX_KIND, INDEX_VERSION)


def upgrade_index(index_path: str | os.PathLike[str], fits: Callable[[Mapping[str, Any]], bool]) -> IndexFile | None:
    """The version 1 index at ``index_path`` rewritten as the current version, when it can be without a
    rescan (see the module docstring) and ``fits(meta)`` (the shard it indexes is unchanged); else None."""
    try:
        old = read_index(index_path, INDEX_KIND, 1)
    except (FileNotFoundError, FormatError):
        return None
    if "source_key_blob" not in old.arrays or not fits(old.meta):
        return None  # a plain shard's: its other members were never indexed
    samples = old.meta.get("samples")
    if not isinstance(samples, int) or "data_offset" not in old.arrays or samples != len(old.arrays["data_offset"]):
        return None  # its count does not match its arrays: rebuilt from the shard instead
    arrays = {name: np.asarray(array) for name, array in old.arrays.items()}
    arrays["member_starts"] = np.zeros(samples + 1, dtype=np.int64)
    arrays["member_ext"] = np.zeros(0, dtype=np.int32)
    arrays["member_offset"] = arrays["member_size"] = np.zeros(0, dtype=np.int64)
    write_index(index_path, INDEX_KIND, INDEX_VERSION, {**old.meta, "member_exts": []}, arrays)
    return read_index(index_path, INDEX_KIND, INDEX_VERSION)


def _fits(shard: str, image_exts: Sequence[str]) -> Callable[[Mapping[str, Any]], bool]:
    """Whether an index's meta describes ``shard`` as it is now, scanned for ``image_exts``."""

    def fits(meta: Mapping[str, Any]) -> bool:
        stat = os.stat(shard)
        return (
            meta.get("shard_size") == stat.st_size
            and meta.get("shard_mtime_ns") == stat.st_mtime_ns
            and meta.get("image_exts") == list(image_exts)
        )

    return fits


def _try_read(
    shard: str, index_path: Path, image_exts: Sequence[str], expected: Expected | None = None
) -> IndexFile | None:
    try:
        index = read_index(index_path, INDEX_KIND, INDEX_VERSION)
    except (FileNotFoundError, FormatError):
        return None
    if not _fits(shard, image_exts)(index.meta):
        return None
    if expected is not None:
        if "content_sha256" not in index.meta:
            return None  # indexed without its hash (as plain shards): hashed when rebuilt
        check_expected(shard, index.meta, expected)
    try:
        check_shard_index(index)
    except FormatError as error:
        warnings.warn(printable(f"rebuilding a shard index whose values do not hold: {error}"), stacklevel=2)
        return None
    if expected is not None and not _vouched(index, image_exts, expected):
        warnings.warn(
            printable(f"{index.path}: rebuilding a shard index whose arrays are not those the pack's manifest records"),
            stacklevel=2,
        )
        return None
    return index


def _vouched(index: IndexFile, image_exts: Sequence[str], expected: Expected) -> bool:
    """Whether the index's arrays are those the manifest's digest describes (when it records one: tar packs of
    version 4). The pack indexed its shards for :data:`IMAGE_EXTS`: an index for other extensions is never
    the pack's, and is built here from the shard's bytes, checked against the manifest first."""
    if expected.index_sha256 is None or list(image_exts) != list(IMAGE_EXTS):
        return True
    return index_digest(index.arrays, index.meta) == expected.index_sha256


def _restamped(shard: str, path: Path, image_exts: Sequence[str], expected: Expected) -> IndexFile:
    """The index of a pack's shard whose size or mtime changed: FormatError (the index kept as it is) unless
    its bytes are still those the manifest records; then the pack's index, its mtime updated, when it
    indexes those bytes (a copy without its mtime: its source keys and member digests still hold), else
    a new index with the shard's hash."""
    stat = os.stat(shard)
    check_expected(shard, {"shard_size": stat.st_size, "content_sha256": file_sha256(shard)}, expected)
    try:
        old = read_index(path, INDEX_KIND, INDEX_VERSION)
    except (FileNotFoundError, FormatError):
        old = None
    if (
        old is None
        or old.meta.get("content_sha256") != expected.sha256
        or old.meta.get("image_exts") != list(image_exts)
        or not _vouched(old, image_exts, expected)
    ):
        built = build_shard_index(shard, path, image_exts, content_hash=True)
        if not _vouched(built, image_exts, expected):  # the shard is the one recorded: its digest is what lies
            raise FormatError(
                f"{shard}: the index of the shard's bytes is not the one the pack's manifest records "
                "(index_sha256 edited?); run `fastloader verify` on the pack, and pack it again"
            )
        return built
    arrays = {name: np.asarray(array) for name, array in old.arrays.items()}
    write_index(path, INDEX_KIND, INDEX_VERSION, {**old.meta, "shard_mtime_ns": stat.st_mtime_ns}, arrays)
    return read_index(path, INDEX_KIND, INDEX_VERSION)


def load_shard_index(
    shard: str,
    index_path: str | os.PathLike[str] | None = None,
    image_exts: Sequence[str] = IMAGE_EXTS,
    expected: Expected | None = None,
) -> IndexFile:
    """The index of ``shard``: read when current, else upgraded or built (once: other processes wait on the lock).

    ``expected``: the size and hash a pack's manifest records for the shard; a shard that is not
    that one is a FormatError naming it (see :mod:`fastloader.formats.tar_content`)."""
    path = Path(index_path) if index_path is not None else default_index_path(shard)

    def build() -> IndexFile:
        if expected is not None:
            return _restamped(shard, path, image_exts, expected)
        upgraded = upgrade_index(path, _fits(shard, image_exts))
        return upgraded if upgraded is not None else build_shard_index(shard, path, image_exts)

    return cached_index(path, lambda: _try_read(shard, path, image_exts, expected), build)
