"""MXNet RecordIO byte layout: records, split records, IRHeader, .idx, and malformed files."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import numpy as np
import pytest

from fastloader.errors import FormatError
from fastloader.formats.recordio import (
    IR_HEADER_SIZE,
    IRHeader,
    RecordIOWriter,
    multi_label,
    pack,
    read_head,
    read_idx_file,
    read_record,
    scan_offsets,
    single_label,
    unpack,
)

MAGIC = struct.pack("<I", 0xCED7230A)  # little-endian bytes 0a 23 d7 ce


def part(cflag: int, data: bytes) -> bytes:
    """One record part as dmlc-core recordio.h lays it out, written independently of the module."""
    return MAGIC + struct.pack("<I", cflag << 29 | len(data)) + data + b"\0" * (-len(data) % 4)


def write_rec(tmp_path: Path, payloads: list[bytes], name: str = "data") -> tuple[str, str]:
    rec, idx = str(tmp_path / f"{name}.rec"), str(tmp_path / f"{name}.idx")
    with RecordIOWriter(rec, idx) as writer:
        for key, payload in enumerate(payloads):
            writer.write(key, payload)
    return rec, idx


def test_writer_lays_out_records_and_idx_as_dmlc_core(tmp_path: Path) -> None:
    rec, idx = write_rec(tmp_path, [b"abcde", b"", b"wxyz"])
    expected = part(0, b"abcde") + part(0, b"") + part(0, b"wxyz")
    assert Path(rec).read_bytes() == expected
    assert Path(idx).read_text() == "0\t0\n1\t16\n2\t24\n"  # 8 + 5 + 3 padding, then 8 + 0
    assert len(expected) % 4 == 0


def test_payload_with_aligned_magic_is_split_and_rejoined(tmp_path: Path) -> None:
    # Magic at aligned positions 0, 8 and 12 (back to back), and at unaligned position 21 (no split).
    payload = MAGIC + b"1234" + MAGIC + MAGIC + b"5" + MAGIC + b"678" + b"tail!"
    assert payload.find(MAGIC, 13) == 17  # unaligned: 17 % 4 == 1
    rec, _ = write_rec(tmp_path, [payload, b"next"])
    expected = part(1, b"") + part(2, b"1234") + part(2, b"") + part(3, b"5" + MAGIC + b"678tail!") + part(0, b"next")
    assert Path(rec).read_bytes() == expected
    data = Path(rec).read_bytes()
    assert read_record(data, 0, len(data), rec) == payload
    assert scan_offsets(data, len(data), rec).tolist() == [0, len(expected) - len(part(0, b"next"))]


def random_payload(rng: random.Random) -> bytes:
    data = bytearray(rng.randbytes(rng.randrange(0, 300)))
    for _ in range(rng.randrange(0, 3)):  # plant the magic word, aligned or not
        at = rng.randrange(0, len(data) + 1)
        data[at:at] = MAGIC
    return bytes(data)


def test_round_trip_random_order_byte_exact(tmp_path: Path) -> None:
    rng = random.Random(7)
    payloads = [random_payload(rng) for _ in range(300)]
    rec, idx = write_rec(tmp_path, payloads)
    keys, offsets = read_idx_file(idx)
    assert keys.tolist() == list(range(300))
    assert offsets.tolist() == scan_offsets(Path(rec).read_bytes(), os.path.getsize(rec), rec).tolist()
    size = os.path.getsize(rec)
    spans = np.diff(np.append(offsets, size))
    order = list(range(300))
    rng.shuffle(order)
    fd = os.open(rec, os.O_RDONLY)
    try:
        for i in order:
            assert read_record(fd, int(offsets[i]), size, rec) == payloads[i]
            assert read_record(fd, int(offsets[i]), size, rec, span=int(spans[i])) == payloads[i]
            assert read_head(fd, int(offsets[i]), size, rec, 10) == payloads[i][:10]
    finally:
        os.close(fd)


def test_irheader_pack_unpack_single_and_multi_label() -> None:
    image = b"\xff\xd8 not really a jpeg"
    payload = pack(single_label(7, id=2**40 + 3, id2=5), image)
    assert payload[:IR_HEADER_SIZE] == struct.pack("<IfQQ", 0, 7.0, 2**40 + 3, 5)
    assert unpack(payload) == (IRHeader(0, 7.0, 2**40 + 3, 5), image)

    labels = [0.5, 3.0, -1.25]
    payload = pack(multi_label(labels, id=9), image)
    assert payload[:IR_HEADER_SIZE] == struct.pack("<IfQQ", 3, 0.0, 9, 0)
    assert payload[IR_HEADER_SIZE : IR_HEADER_SIZE + 12] == np.array(labels, dtype="<f4").tobytes()
    header, rest = unpack(payload)
    assert (header.flag, header.labels, header.id, rest) == (3, (0.5, 3.0, -1.25), 9, image)
    with pytest.raises(ValueError, match="flag"):
        IRHeader(2, 0.0, 1, 0, (1.0,))


def test_unpack_rejects_short_records_and_impossible_label_counts() -> None:
    with pytest.raises(FormatError, match="shorter than an IRHeader"):
        unpack(b"\0" * 10, "x.rec: record 4")
    with pytest.raises(FormatError, match="x.rec: record 4: IRHeader announces 4294967295 labels"):
        unpack(struct.pack("<IfQQ", 2**32 - 1, 0.0, 0, 0) + b"\0" * 8, "x.rec: record 4")


def test_read_idx_file_parses_lines_and_rejects_garbage(tmp_path: Path) -> None:
    idx = tmp_path / "a.idx"
    idx.write_text("3\t0\n1\t48\n2\t96\n")
    keys, offsets = read_idx_file(str(idx))
    assert keys.tolist() == [3, 1, 2] and offsets.tolist() == [0, 48, 96]
    assert keys.dtype == np.int64 and offsets.dtype == np.int64
    idx.write_text("")
    assert read_idx_file(str(idx))[0].tolist() == []
    idx.write_text("0\t0\nabc\t12\n")
    with pytest.raises(FormatError, match="a.idx"):
        read_idx_file(str(idx))


# -- malformed files ------------------------------------------------------------------------------


def test_bad_magic_names_file_and_offset(tmp_path: Path) -> None:
    data = part(0, b"abcdefgh") + part(0, b"ijkl")
    with pytest.raises(FormatError, match=r"bad\.rec: bad RecordIO magic 0x\w+ at offset 4"):
        read_record(data, 4, len(data), "bad.rec")
    broken = b"XXXX" + data[4:]
    (tmp_path / "bad.rec").write_bytes(broken)
    with pytest.raises(FormatError, match="bad.rec: bad RecordIO magic .* at offset 0"):
        scan_offsets(broken, len(broken), str(tmp_path / "bad.rec"))


def test_truncated_tail_is_reported(tmp_path: Path) -> None:
    rec, _ = write_rec(tmp_path, [b"a" * 40, b"b" * 40])
    full = Path(rec).read_bytes()
    for cut in (len(full) - 4, len(full) - 30, len(full) - 45):  # late and early in the last data, in its header
        data = full[:cut]
        with pytest.raises(FormatError, match=r"data\.rec: .*(truncated|stray)"):
            scan_offsets(data, len(data), rec)
    with pytest.raises(FormatError, match="outside the file"):
        read_record(full[:50], 48, 50, rec)


def test_split_record_errors() -> None:
    middle = part(2, b"1234") + part(3, b"56")
    with pytest.raises(FormatError, match="offset 0 is inside a split record"):
        read_record(middle, 0, len(middle), "s.rec")
    restart = part(1, b"1234") + part(0, b"56")
    with pytest.raises(FormatError, match="split record broken at offset 12"):
        read_record(restart, 0, len(restart), "s.rec")
    cut = part(1, b"1234") + part(2, b"5678")
    with pytest.raises(FormatError, match="cut off"):
        read_record(cut, 0, len(cut), "s.rec")
    with pytest.raises(FormatError, match="cut off"):
        scan_offsets(cut, len(cut), "s.rec")
    bad_flag = MAGIC + struct.pack("<I", 5 << 29 | 4) + b"abcd"
    with pytest.raises(FormatError, match="invalid continuation flag 5 at offset 0"):
        read_record(bad_flag, 0, len(bad_flag), "s.rec")


def test_writer_leaves_nothing_behind_on_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), RecordIOWriter(tmp_path / "x.rec", tmp_path / "x.idx") as writer:
        writer.write(0, b"abc")
        raise RuntimeError("interrupted")
    assert sorted(os.listdir(tmp_path)) == []
