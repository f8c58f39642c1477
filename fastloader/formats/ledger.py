"""The delivery ledger's file (``DataLoaderX(ledger=...)``): what each rank's training loop received, in order.

One file per rank, append-only, little-endian::

    header  := b"FLLEDGR\\0" u16 version(=2; 1 is read too) u32 rank u32 world_size
    block   := u32 SYNC(0x4C424C46) u32 length u32 crc32c(length's 4 bytes + payload) payload[length]
    payload := record*
    record  := b"E" i64 epoch i64 start            an iteration of ``epoch`` begins at position ``start``
                                                   (0: from the beginning; n: a resume after n deliveries)
             | b"K" i64 id u16 n utf8[n]           the key of ``id`` (the dataset's, as its errors name it)
             | b"S" i64 epoch u32 count u8 flags   deliveries, in the order the training loop received them:
                 i64 ids[count]                      the sample's index (the sampler's), or its batch's position
                 u32 crc[count]   (flags & 1)        the CRC32C of each sample's encoded bytes as read
                 u8 present[count] (flags & 2)       which of them were read (a cache hit reads none)
                                  (flags & 4)        ids are batch positions (an IterableDataset's)
                 u32 n  i64 asked[n]  i32 slot[n]    (flags & 8, version 2) samples asked for but not delivered
                                                     as such (an error policy): ``ids[slot]`` was delivered in
                                                     place of ``asked`` ("replace"), or nothing ("skip": slot
                                                     -1 - k, where k samples of the batch were delivered before)

The loader writes one block per batch with one ``os.write`` on a file opened ``O_APPEND``: 12 bytes a sample
and a few more a batch, and a process killed at any moment (SIGKILL) leaves every batch it recorded but the
one being written. A block that fails its checksum (a torn tail, or bytes another writer mixed in) is skipped
up to the next block that passes: :func:`read_records` says which bytes it skipped, never guessing at them.
Ids have keys only where the dataset names its samples (fastloader's datasets): a ``K`` record precedes
the first delivery of an id in each process that writes the file (of an asked one too); others are named by
their id. Version 2 added the asked samples (flags & 8); a version 1 file reads as one without them.
"""

from __future__ import annotations

import dataclasses
import struct

import crc32c
import numpy as np

from fastloader.errors import FormatError

MAGIC = b"FLLEDGR\0"
VERSION = 2
READS = (1, 2)  # the versions this fastloader reads
SYNC = 0x4C424C46
_HEADER = struct.Struct("<8sHII")
_BLOCK = struct.Struct("<III")
_LENGTH = struct.Struct("<I")
_EPOCH = struct.Struct("<qq")
_KEY = struct.Struct("<qH")
_SAMPLES = struct.Struct("<qIB")
HAS_CRC, HAS_PRESENT, POSITIONS, HAS_ASKED = 1, 2, 4, 8

HEADER_SIZE = _HEADER.size
_SYNC_BYTES = _LENGTH.pack(SYNC)


@dataclasses.dataclass(frozen=True)
class Header:
    rank: int
    world_size: int


@dataclasses.dataclass(frozen=True)
class EpochBegins:
    epoch: int
    start: int  # deliveries of the epoch made before this iteration (a resume); 0: from its beginning


@dataclasses.dataclass(frozen=True)
class Key:
    id: int
    key: str


@dataclasses.dataclass(frozen=True)
class Samples:
    epoch: int
    ids: np.ndarray  # int64
    crcs: np.ndarray | None  # uint32; None: no digests
    present: np.ndarray | None  # bool; None: every crc is present
    positions: bool  # ids are batch positions (an IterableDataset's batches)
    asked: np.ndarray | None = None  # int64: samples asked for, not delivered as such; None: every one was
    slots: np.ndarray | None = None  # int32: where each asked one's substitute is in ids (-1 - k: none, skipped at k)


Record = EpochBegins | Key | Samples


@dataclasses.dataclass(frozen=True)
class Skipped:
    offset: int
    size: int  # bytes that were no valid block (at the end of the file: a write a crash cut short)


def header(rank: int, world_size: int) -> bytes:
    return _HEADER.pack(MAGIC, VERSION, rank, world_size)


def read_header(data: bytes, name: str) -> Header:
    if len(data) < HEADER_SIZE or data[:8] != MAGIC:
        raise FormatError(f"{name}: not a fastloader ledger (no {MAGIC[:7].decode()} header)")
    _, version, rank, world_size = _HEADER.unpack_from(data)
    if version not in READS:
        raise FormatError(f"{name}: ledger version {version}; this fastloader reads versions {READS[0]} to {READS[-1]}")
    return Header(rank, world_size)


def block(payload: bytes) -> bytes:
    length = _LENGTH.pack(len(payload))
    return _BLOCK.pack(SYNC, len(payload), crc32c.crc32c(payload, crc32c.crc32c(length))) + payload


def epoch_record(epoch: int, start: int) -> bytes:
    return b"E" + _EPOCH.pack(epoch, start)


def key_record(id_: int, key: str) -> bytes:
    encoded = key.encode("utf-8", "surrogateescape")[:0xFFFF]
    return b"K" + _KEY.pack(id_, len(encoded)) + encoded


def samples_record(
    epoch: int,
    ids: np.ndarray,
    crcs: np.ndarray | None,
    present: np.ndarray | None,
    positions: bool = False,
    asked: tuple[np.ndarray, np.ndarray] | None = None,
) -> bytes:
    flags = (HAS_CRC if crcs is not None else 0) | (HAS_PRESENT if present is not None else 0)
    flags |= (POSITIONS if positions else 0) | (HAS_ASKED if asked is not None else 0)
    parts = [b"S", _SAMPLES.pack(epoch, len(ids), flags), ids.astype("<i8", copy=False).tobytes()]
    if crcs is not None:
        parts.append(crcs.astype("<u4", copy=False).tobytes())
    if present is not None:
        parts.append(present.astype(np.uint8).tobytes())
    if asked is not None:
        samples, slots = asked
        parts += [_LENGTH.pack(len(samples)), samples.astype("<i8").tobytes(), slots.astype("<i4").tobytes()]
    return b"".join(parts)


def read_records(data: bytes, name: str) -> tuple[Header, list[Record], list[Skipped]]:
    """Every record of a ledger file's bytes, in order, and the byte ranges that held no valid block."""
    head = read_header(data, name)
    records: list[Record] = []
    skipped: list[Skipped] = []
    offset, end = HEADER_SIZE, len(data)
    while offset < end:
        payload = _block_at(data, offset)
        if payload is None:
            resync = _next_block(data, offset + 1)
            skipped.append(Skipped(offset, resync - offset))
            offset = resync
            continue
        records.extend(_parse(payload, name, offset))
        offset += _BLOCK.size + len(payload)
    return head, records, skipped


def _block_at(data: bytes, offset: int) -> bytes | None:
    if offset + _BLOCK.size > len(data):
        return None
    sync, length, crc = _BLOCK.unpack_from(data, offset)
    start = offset + _BLOCK.size
    if sync != SYNC or start + length > len(data):
        return None
    payload = data[start : start + length]
    if crc32c.crc32c(payload, crc32c.crc32c(data[offset + 4 : offset + 8])) != crc:
        return None
    return payload


def _next_block(data: bytes, offset: int) -> int:
    """The offset of the next valid block at or after ``offset``, else the end of the data."""
    while True:
        found = data.find(_SYNC_BYTES, offset)
        if found < 0:
            return len(data)
        if _block_at(data, found) is not None:
            return found
        offset = found + 1


def _parse(payload: bytes, name: str, at: int) -> list[Record]:
    out: list[Record] = []
    view, pos = memoryview(payload), 0
    try:
        while pos < len(payload):
            tag, pos = payload[pos : pos + 1], pos + 1
            if tag == b"E":
                out.append(EpochBegins(*_EPOCH.unpack_from(payload, pos)))
                pos += _EPOCH.size
            elif tag == b"K":
                id_, size = _KEY.unpack_from(payload, pos)
                pos += _KEY.size
                out.append(Key(id_, bytes(view[pos : pos + size]).decode("utf-8", "surrogateescape")))
                pos += size
            elif tag == b"S":
                epoch, count, flags = _SAMPLES.unpack_from(payload, pos)
                pos += _SAMPLES.size
                ids = np.frombuffer(payload, "<i8", count, pos).astype(np.int64)
                pos += 8 * count
                crcs = present = None
                if flags & HAS_CRC:
                    crcs, pos = np.frombuffer(payload, "<u4", count, pos).astype(np.uint32), pos + 4 * count
                if flags & HAS_PRESENT:
                    present, pos = np.frombuffer(payload, np.uint8, count, pos).astype(bool), pos + count
                asked = slots = None
                if flags & HAS_ASKED:
                    (n,), pos = _LENGTH.unpack_from(payload, pos), pos + _LENGTH.size
                    asked, pos = np.frombuffer(payload, "<i8", n, pos).astype(np.int64), pos + 8 * n
                    slots, pos = np.frombuffer(payload, "<i4", n, pos).astype(np.int32), pos + 4 * n
                out.append(Samples(epoch, ids, crcs, present, bool(flags & POSITIONS), asked, slots))
            else:
                raise FormatError(f"{name}: unknown ledger record {tag!r} in the block at byte {at}")
    except (struct.error, ValueError) as error:
        if isinstance(error, FormatError):
            raise
        raise FormatError(f"{name}: a ledger record overruns its block at byte {at}") from None
    return out
