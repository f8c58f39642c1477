"""The header walk of a tar shard: every file member's name, data offset and size, read by hand.

We never extract and never trust a header further than the file. Members with an absolute path or
a ``..`` component, links, devices and FIFOs are reported with the reason they are refused (the
index ignores them, with a warning naming them), and a truncated file, a bad header checksum or a
size past the end of the file is a :class:`~fastloader.errors.FormatError` naming the shard and the
member, never a hang or a huge allocation. Headers are read by hand rather than with ``tarfile``
because ``tarfile`` ends iteration silently at a corrupt or truncated header and reads pax / GNU
long-name payloads of any claimed size into memory.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping
from typing import NamedTuple

from fastloader.errors import FormatError, printable

_BLOCK = 512
_MAX_HEADER_PAYLOAD = 1 << 20  # pax records and GNU long names hold names, never image data
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
            warnings.warn(printable(f"{shard}: no end-of-archive marker; the file may be truncated"), stacklevel=2)
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
