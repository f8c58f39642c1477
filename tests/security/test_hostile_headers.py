"""Sizes a file announces, never trusted to size an allocation or a read: a Parquet dictionary that decodes
to more than ``max_decode_bytes`` (refused before decoding), lying length fields in RecordIO, TFRecord and tar
headers (a clean FormatError naming the file), JSON nested 100,000 deep and a ``.npy`` header claiming
10**13 values (named, not a crash); and tar members that leave the shard (``..``, absolute, links, devices)."""

from __future__ import annotations

import io
import os
import struct
import tarfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from fastloader.datasets.lmdb import LMDBSource
from fastloader.errors import FormatError
from fastloader.formats import recordio, tfrecord
from fastloader.formats.tar_shards import (
    build_shard_index,
)
from fastloader.pack import pack
from fastloader.pack.verify import verify
from tests.datasets.test_parquet import read_captions, write_bomb
from tests.formats.test_recordio import MAGIC
from tests.formats.test_tar_shards import _index_error, add_special, encode, keys_of
from tests.formats.test_tfrecord import write
from tests.pack.test_verify import VectorsAndRecords, rewrite_record


def test_a_chunk_larger_than_the_limit_is_refused_before_decoding_and_for_every_row(tmp_path: Path) -> None:
    """The same file under a limit below its one value: every row is refused, naming the file, row group,
    column and size, and nothing is decoded (not one page: the pool never holds a whole value)."""
    value = 4 << 20
    path = write_bomb(tmp_path / "bomb.parquet", "dictionary", rows=1024, text="c" * value)
    outcomes, peak, info = read_captions(path, 1 << 20)
    declared = pq.read_metadata(path).row_group(0).column(1).total_uncompressed_size
    assert len(outcomes) == 1024 and all(isinstance(outcome, str) for outcome in outcomes)
    assert outcomes[0] == (
        f"{path}#0: field 'caption': cannot read column 'caption' of row group 0 in {path}: it decodes to more than"
        f" max_decode_bytes=1,048,576 bytes (its footer says {declared:,};"
        " refused before decoding): a file made to exhaust memory, or a row group too large for this limit"
        " (max_decode_bytes= raises it)"
    )
    assert peak < value // 4, peak
    assert info == {"column_reads": 0, "cached_row_groups": 0, "open_files": 1, "refused_column_chunks": 1}


def test_a_dictionary_page_whose_header_says_more_than_the_footer_is_refused_before_decoding(tmp_path: Path) -> None:
    """A footer is the writer's word: one that announces a small chunk while its dictionary page's own
    header announces the value's 4 MB is refused on the header's word, before the page is decompressed."""
    value = 4 << 20
    path = write_bomb(tmp_path / "bomb.parquet", "dictionary", rows=16, text="c" * value)
    chunk = pq.read_metadata(path).row_group(0).column(1)
    data = bytearray(path.read_bytes())
    footer_start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    # total_uncompressed_size is a zigzag varint in the footer's Thrift: replaced by one of the same length.
    old = _varint(chunk.total_uncompressed_size * 2)
    at = data.index(old, footer_start)
    data[at : at + len(old)] = _varint(2 * 1000, len(old))
    path.write_bytes(bytes(data))
    assert pq.read_metadata(path).row_group(0).column(1).total_uncompressed_size == 1000
    outcomes, peak, _ = read_captions(path, 1 << 20)
    assert f"its dictionary page's header says {value + 4:,}; refused before decoding" in outcomes[0], outcomes[0]
    assert peak < value // 4, peak


def _varint(number: int, length: int = 0) -> bytes:
    """``number`` as a varint, padded with continuation bytes to ``length`` bytes."""
    out = bytearray()
    while True:
        out.append(number & 0x7F | 0x80)
        number >>= 7
        if not number and len(out) >= length:
            out[-1] &= 0x7F
            return bytes(out)


def test_unsafe_and_special_members_are_ignored_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "evil.tar"
    good = encode()
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("../evil.jpg", "/abs/evil.jpg", "a/../../evil2.jpg", "good.jpg"):
            info = tarfile.TarInfo(name)
            info.size = len(good)
            tar.addfile(info, io.BytesIO(good))
        add_special(tar, "link.jpg", tarfile.SYMTYPE, "/etc/passwd")
        add_special(tar, "hard.jpg", tarfile.LNKTYPE, "good.jpg")
        add_special(tar, "dev.jpg", tarfile.CHRTYPE)
        add_special(tar, "fifo.jpg", tarfile.FIFOTYPE)
    with pytest.warns(UserWarning, match=r"evil.tar: ignored 7 .*\.\./evil\.jpg \(a '\.\.' path component\)"):
        index = build_shard_index(str(path), tmp_path / "evil.idx")
    assert keys_of(dict(index.arrays)) == ["good"]
    examples = " ".join(index.meta["ignored_examples"])
    for reason in ("an absolute path", "a symbolic link", "a hard link", "a character device", "a FIFO"):
        assert reason in examples


def test_length_past_end_of_file_is_caught_before_reading(tmp_path: Path) -> None:
    # A 29-bit length of ~512 MiB in a 24-byte file: an error, not a huge read or allocation.
    data = MAGIC + struct.pack("<I", (1 << 29) - 1) + b"0123456789abcdef"
    path = tmp_path / "huge.rec"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        for read in (
            lambda: recordio.read_record(fd, 0, len(data), str(path)),
            lambda: recordio.read_head(fd, 0, len(data), str(path), 24),
            lambda: recordio.scan_offsets(fd, len(data), str(path)),
        ):
            with pytest.raises(FormatError, match=r"huge\.rec: record part at offset 0 declares 536870911 bytes"):
                read()
    finally:
        os.close(fd)


def test_truncated_tail_and_length_past_end(tmp_path: Path) -> None:
    path = tmp_path / "e.tfrecord"
    write(path, [b"abc", b"defgh"])
    full = path.read_bytes()
    for cut, message in ((len(full) - 1, "declares 5 bytes but the file ends"), (19 + 5, "stray bytes at offset 19")):
        path.write_bytes(full[:cut])
        with pytest.raises(FormatError, match=rf"e\.tfrecord: .*{message}"):
            tfrecord.load_index(path)
    huge = struct.pack("<Q", 2**60)
    path.write_bytes(huge + struct.pack("<I", tfrecord.masked_crc32c(huge)) + b"tiny")
    with pytest.raises(FormatError, match="offset 0 declares 1152921504606846976 bytes"):
        tfrecord.load_index(path)
    with open(path, "rb") as file, pytest.raises(FormatError, match="runs past the end"):
        tfrecord.read_record(file.fileno(), 0, 2**60, 16, str(path))


def test_a_huge_npy_claim_and_json_nested_100000_deep_are_named_not_crashed(tmp_path: Path) -> None:
    pack(VectorsAndRecords(4), tmp_path / "v.lmdb", workers=0, progress=False)
    assert verify(tmp_path / "v.lmdb").ok
    deep = b"[" * 100_000 + b"]" * 100_000
    copy = rewrite_record(tmp_path / "v.lmdb", tmp_path, 2, [(0, deep), (1, lying_npy(10**13))])
    report = verify(copy)
    assert report.bad_records == (2, 2) and len(report.problems) == 2
    assert report.problems[0].startswith(f"{copy}[2] (items/002): field 'meta': JSON nested deeper than 128 levels")
    assert report.problems[1].startswith(f"{copy}[2] (items/002): field 'vector': not a valid array value")
    assert "announces 80000000000000 bytes of data" in report.problems[1]
    source = LMDBSource(copy)
    with pytest.raises(FormatError, match=r"\[2\]: field 'vector': not a valid array value"):
        source.read_field(2, "vector")
    with pytest.raises(FormatError, match=r"\[2\]: field 'meta': JSON nested deeper than 128"):
        source.read_field(2, "meta")


def lying_npy(elements: int) -> bytes:
    """A float64 ``.npy`` whose header claims ``elements`` values, followed by 16 bytes."""
    header = b"{'descr': '<f8', 'fortran_order': False, 'shape': (%d,), }" % elements
    header += b" " * (63 - len(header) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + b"\x00" * 16


def test_oversized_extended_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pax.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("a.jpg")
        info.pax_headers = {"comment": "x" * (2 << 20)}
        tar.addfile(info, io.BytesIO(b""))
    assert "claims" in _index_error(path) and "refusing" in _index_error(path)
