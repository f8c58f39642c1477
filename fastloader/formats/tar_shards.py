"""Tar shards in the WebDataset layout: walk the headers once, keep an index, read samples by offset.

A shard is a plain (uncompressed) POSIX tar. Consecutive members sharing a *key* form one sample;
the key is the member path up to the first dot of its base name (``a/b/x.seg.jpg`` has key
``a/b/x`` and extension ``seg.jpg``, lowercased). A sample's image is its first member whose
extension is in ``image_exts`` (in that order of preference); its label is the integer text of its
``.cls`` / ``.cls2`` / ``.class`` / ``.label`` member, -1 when it has none. Every other member of the
sample (a caption ``.txt``, a ``.json``, a mask ``.seg.png``, a second image, anything) is kept in the
index too: those are the sample's *fields* (``fastloader.fields``), read by extension.

We never extract and never trust a header further than the file: member paths only become keys,
data is read with ``os.pread`` at the offset recorded in the index. So members with an absolute path
or a ``..`` component, links, devices and FIFOs are ignored (with a warning naming them), and a
truncated file, a bad header checksum or a size past the end of the file is a
:class:`~fastloader.errors.FormatError` naming the shard and the member, never a hang or a
huge allocation. Headers are read by hand rather than with ``tarfile`` because ``tarfile`` ends
iteration silently at a corrupt or truncated header and reads pax / GNU long-name payloads of any
claimed size into memory.

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
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fastloader.errors import FormatError
from fastloader.formats.index_file import IndexFile, cached_index, pack_strings, read_index, write_index
from fastloader.formats.tar_content import Expected, check_expected, fd_sha256, file_sha256
from fastloader.formats.tar_index_check import check_shard_index
from fastloader.storage import open_regular, sidecar_path

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "ppm", "pgm", "pbm", "pnm", "gif", "tif", "tiff")
LABEL_EXTS = ("cls", "cls2", "class", "label")
INDEX_KIND = "tar-shard"
INDEX_VERSION = 2
INDEX_SUFFIX = ".fl-idx"

_BLOCK = 512
_MAX_HEADER_PAYLOAD = 1 << 20  # pax records and GNU long names hold names, never image data
_MAX_LABEL_BYTES = 64
_MAX_EXAMPLES = 10  # ignored members named in the index meta and the warning
_SPECIAL_TYPES = {
    b"1": "a hard link",
    b"2": "a symbolic link",
    b"3": "a character device",
    b"4": "a block device",
    b"6": "a FIFO",
}


class Member(NamedTuple):
    """One tar member as the header walk sees it; ``problem`` is why it is ignored ("" if readable)."""

    name: str
    offset: int  # of its data
    size: int
    problem: str


def _number(field: bytes) -> int:
    """A numeric header field: octal text, or GNU base-256 when the top bit of the first byte is set."""
    if field and field[0] & 0x80:
        if field[0] == 0xFF:
            raise ValueError("negative base-256 number")
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    text = field.replace(b"\x00", b" ").strip()
    return int(text, 8) if text else 0


def _check_checksum(block: bytes) -> bool:
    stored = _number(block[148:156])
    unsigned = sum(block) - sum(block[148:156]) + 8 * ord(" ")
    if stored == unsigned:
        return True
    # Some old writers summed signed chars; accept that too, as GNU tar does.
    high = sum(1 for byte in block[:148] + block[156:] if byte > 127)
    return stored == unsigned - 256 * high


def _parse_pax(payload: bytes) -> dict[str, str]:
    """pax extended header records: ``"<length> <key>=<value>\\n"``, the length counting itself."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(payload) and payload[pos] != 0:
        space = payload.index(b" ", pos)
        length = int(payload[pos:space])
        record = payload[space + 1 : pos + length]
        if length <= 0 or pos + length > len(payload) or not record.endswith(b"\n") or b"=" not in record:
            raise ValueError(f"bad pax record at byte {pos}")
        key, value = record[:-1].split(b"=", 1)
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def _clean_name(name: str) -> tuple[str, str]:
    """The member name without a leading ``./``, and why it is refused ("" when it is fine)."""
    while name.startswith("./"):
        name = name[2:]
    if name.startswith("/"):
        return name, "an absolute path"
    if ".." in name.split("/"):
        return name, "a '..' path component"
    return name, ""


def walk_members(fd: int, shard: str) -> Iterator[Member]:
    """Every file member of the tar open as ``fd`` (directories and extended headers consumed)."""
    file_size = os.fstat(fd).st_size
    if file_size == 0:
        raise FormatError(f"{shard}: empty file (0 bytes), not a tar archive")
    offset = 0
    pending: dict[str, str] = {}  # pax / GNU long-name values for the next header
    while True:
        if offset >= file_size:
            # Readers accept this, but a copy cut exactly between two members looks the same.
            warnings.warn(f"{shard}: no end-of-archive marker; the file may be truncated", stacklevel=2)
            break
        block = os.pread(fd, _BLOCK, offset)
        if offset == 0 and block[:2] == b"\x1f\x8b":
            raise FormatError(f"{shard}: gzip-compressed; tar shards must be uncompressed for random access")
        if not block.rstrip(b"\x00"):
            break  # the end-of-archive zero blocks
        if len(block) < _BLOCK:
            raise FormatError(f"{shard}: truncated tar header at byte {offset} (file ends at {file_size})")
        typeflag = block[156:157]
        extended = typeflag in (b"x", b"L", b"g", b"K")
        try:
            if not _check_checksum(block):
                raise ValueError("bad header checksum")
            # A pax "size" overrides the header's for the member it describes (members over 8 GiB).
            size = int(pending["size"]) if "size" in pending and not extended else _number(block[124:136])
        except ValueError as error:
            raise FormatError(f"{shard}: corrupt tar header at byte {offset} ({error}); not a tar or damaged") from None
        name = _header_name(block, {} if extended else pending)
        data_offset = offset + _BLOCK
        if data_offset + size > file_size:
            raise FormatError(
                f"{shard}: member {name!r} claims {size} bytes at byte {data_offset}, past the end of the "
                f"file ({file_size} bytes): truncated"
            )
        offset = data_offset + (size + _BLOCK - 1) // _BLOCK * _BLOCK
        if extended:
            payload = _header_payload(fd, shard, name, data_offset, size)
            if typeflag == b"x":
                pending.update(_pax_records(shard, name, payload))
            elif typeflag == b"L":
                pending["path"] = payload.split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")
            continue  # a global pax header or a GNU long link name says nothing we use
        member = _member(shard, name, typeflag, data_offset, size, pending)
        pending = {}
        if member is not None:
            yield member
    if pending:
        raise FormatError(f"{shard}: truncated: ends after an extended header, before its member")


def _member(shard: str, name: str, typeflag: bytes, offset: int, size: int, pax: Mapping[str, str]) -> Member | None:
    """The member a header describes (None for a directory), with why it is refused if it is."""
    if typeflag == b"S":
        raise FormatError(f"{shard}: member {name!r} is a GNU sparse file, which is not supported")
    if typeflag == b"5" or (typeflag in (b"0", b"\x00") and name.endswith("/")):
        return None
    name, problem = _clean_name(name)
    if not problem and typeflag not in (b"0", b"\x00", b"7"):
        problem = _SPECIAL_TYPES.get(typeflag, f"of unsupported member type {typeflag!r}")
    if not problem and any(key.startswith("GNU.sparse.") for key in pax):
        problem = "a sparse file"
    return Member(name, offset, size, problem)


def _header_name(block: bytes, pending: Mapping[str, str]) -> str:
    if "path" in pending:
        return pending["path"]
    name = block[:100].split(b"\x00", 1)[0]
    # The POSIX ustar prefix field; in the GNU format those bytes hold other fields.
    if block[257:263] == b"ustar\x00" and block[345] != 0:
        name = block[345:500].split(b"\x00", 1)[0] + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def _header_payload(fd: int, shard: str, name: str, offset: int, size: int) -> bytes:
    if size > _MAX_HEADER_PAYLOAD:
        raise FormatError(f"{shard}: extended header {name!r} claims {size} bytes; refusing (corrupt?)")
    return os.pread(fd, size, offset)


def _pax_records(shard: str, name: str, payload: bytes) -> dict[str, str]:
    try:
        records = _parse_pax(payload)
        if "size" in records and int(records["size"]) < 0:
            raise ValueError("negative size")
    except ValueError as error:
        raise FormatError(f"{shard}: corrupt pax header {name!r} ({error})") from None
    return records


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


def build_shard_index(
    shard: str,
    index_path: str | os.PathLike[str],
    image_exts: Sequence[str] = IMAGE_EXTS,
    extra_arrays: Mapping[str, np.ndarray] | None = None,
    content_hash: bool = False,
) -> IndexFile:
    """Scan ``shard`` and write its index to ``index_path`` (``extra_arrays`` stored alongside; with
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
        **(extra_arrays or {}),
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
    write_index(index_path, INDEX_KIND, INDEX_VERSION, meta, arrays)
    if rows.ignored_count:
        warnings.warn(
            f"{shard}: ignored {rows.ignored_count} unsafe or non-regular member(s), e.g. {', '.join(rows.ignored)}",
            stacklevel=2,
        )
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
        warnings.warn(f"rebuilding a shard index whose values do not hold: {error}", stacklevel=2)
        return None
    return index


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
    ):
        return build_shard_index(shard, path, image_exts, content_hash=True)
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
