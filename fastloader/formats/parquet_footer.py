"""The sizes a Parquet file's footer and page headers announce, read without pyarrow.

Before a column chunk is decoded, ``fastloader.datasets.parquet`` checks what it will decode to
(``total_uncompressed_size``: every page of the chunk, its dictionary page counted once) and what its
dictionary page's own header says it decompresses to. pyarrow could give the first, but asking it for a
column chunk's metadata aborts the process (an uncaught C++ exception) on some damaged footers; so the
footer's Thrift (compact protocol, the Parquet specification's ``FileMetaData``) is read here, with
every length checked against the bytes there are: a damaged footer is a FormatError, never a crash.

Only the fields needed are kept: per row group, per column chunk, its path in the schema, value count,
uncompressed size and the offset of its first page (``dictionary_page_offset``, else
``data_page_offset``: some writers put the dictionary page there without saying so).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastloader.errors import FormatError

MAGIC = b"PAR1"
DICTIONARY_PAGE = 2  # PageType.DICTIONARY_PAGE
# Encodings whose values point back at others (a dictionary's, the previous value's prefix), so that a
# row can decode to as much as its whole chunk: PLAIN_DICTIONARY, DELTA_BYTE_ARRAY, RLE_DICTIONARY.
EXPANDING = frozenset({2, 7, 8})
PAGE_HEADER_BYTES = 64  # a page header's first two fields fit in far fewer
_MAX_DEPTH = 64  # nesting of structs and lists in a footer (the schema is flat: FileMetaData is 4 deep)


@dataclass(frozen=True)
class ChunkSizes:
    """What the footer says of one column chunk."""

    path: tuple[str, ...]  # the leaf's path in the schema (a top-level column's leaves start with its name)
    num_values: int
    uncompressed: int  # total_uncompressed_size: every page, the dictionary page once
    first_page: int  # where its first page's header starts
    expands: bool  # an encoding where one row may decode to as much as the whole chunk (see EXPANDING)


class _Compact:
    """A reader of Thrift's compact protocol over ``data``; a FormatError when the bytes run out or lie."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            raise ValueError("truncated")
        self.at += 1
        return self.data[self.at - 1]

    def varint(self) -> int:
        value = shift = 0
        while True:
            byte = self.byte()
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 70:
                raise ValueError("a varint longer than 10 bytes")

    def zigzag(self) -> int:
        value = self.varint()
        return (value >> 1) ^ -(value & 1)

    def size(self) -> int:
        count = self.varint()
        if count > len(self.data) - self.at:  # every element takes a byte at least
            raise ValueError(f"a length of {count} with {len(self.data) - self.at} bytes left")
        return count

    def value(self, kind: int, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise ValueError(f"nested more than {_MAX_DEPTH} deep")
        if kind in (1, 2):  # a struct field's bool is its type
            return kind == 1
        if kind == 3:
            return self.byte()
        if kind in (4, 5, 6):
            return self.zigzag()
        if kind == 7:
            self.at += 8
            if self.at > len(self.data):
                raise ValueError("truncated")
            return None
        if kind == 8:
            count = self.size()
            self.at += count
            return self.data[self.at - count : self.at]
        if kind in (9, 10):
            header = self.byte()
            count, element = header >> 4, header & 0x0F
            count = self.size() if count == 15 else count
            if element in (1, 2):  # a list's bools are a byte each
                return [self.byte() == 1 for _ in range(count)]
            return [self.value(element, depth + 1) for _ in range(count)]
        if kind == 11:
            count = self.size()
            if count == 0:
                return {}
            types = self.byte()
            return {self.value(types >> 4, depth + 1): self.value(types & 0x0F, depth + 1) for _ in range(count)}
        if kind == 12:
            return self.struct(depth + 1)
        raise ValueError(f"unknown field type {kind}")

    def struct(self, depth: int = 0, until: int | None = None) -> dict[int, Any]:
        """The fields of a struct by id (those up to ``until`` only, the rest left unread)."""
        fields: dict[int, Any] = {}
        last = 0
        while True:
            header = self.byte()
            if header == 0:
                return fields
            delta, kind = header >> 4, header & 0x0F
            last = last + delta if delta else self.zigzag()
            fields[last] = self.value(kind, depth)
            if until is not None and last >= until:
                return fields


def _int(fields: dict[int, Any], key: int) -> int:
    value = fields.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"field {key} is {value!r}, not a count or offset")
    return value


def read_chunk_sizes(read_at: Callable[[int, int], bytes], size: int, path: str) -> list[list[ChunkSizes]]:
    """Per row group, the sizes of its column chunks, from the footer of the file at ``path`` (``size``
    bytes, ``read_at(offset, count)`` its bytes): a FormatError naming it when the footer does not parse."""
    tail = read_at(size - 8, 8) if size >= 12 else b""
    if tail[-4:] != MAGIC:
        raise FormatError(f"{path}: not a readable Parquet file (no {MAGIC!r} at its end: encrypted or damaged)")
    length = int.from_bytes(tail[:4], "little")
    if length > size - 12:
        raise FormatError(f"{path}: not a readable Parquet file (a footer of {length:,} bytes in a shorter file)")
    try:
        metadata = _Compact(read_at(size - 8 - length, length)).struct()
        groups = []
        for group in metadata.get(4) or []:
            chunks = []
            for chunk in group.get(1) or []:
                meta = chunk.get(3)
                if not isinstance(meta, dict):
                    raise ValueError("a column chunk without its metadata")
                names = meta.get(3)
                if not isinstance(names, list) or not all(isinstance(n, bytes) for n in names):
                    raise ValueError("a column chunk without its path in the schema")
                first = _int(meta, 11) if 11 in meta else _int(meta, 9)
                leaf = tuple(n.decode("utf-8", "surrogateescape") for n in names)
                expands = not EXPANDING.isdisjoint(meta.get(2) or ())
                chunks.append(ChunkSizes(leaf, _int(meta, 5), _int(meta, 6), first, expands))
            groups.append(chunks)
    except (ValueError, AttributeError, TypeError) as error:
        raise FormatError(f"{path}: not a readable Parquet file (its footer does not parse: {error})") from None
    return groups


def dictionary_page_size(header: bytes) -> int | None:
    """The uncompressed size a dictionary page's header announces, from the bytes at a chunk's first
    page (None when that page is not a dictionary page, or its header does not parse: the reader says why)."""
    try:
        fields = _Compact(header).struct(until=2)
    except ValueError:
        return None
    if fields.get(1) != DICTIONARY_PAGE:
        return None
    size = fields.get(2)
    return size if isinstance(size, int) and not isinstance(size, bool) else None
