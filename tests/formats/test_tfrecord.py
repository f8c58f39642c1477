"""TFRecord framing (length + masked CRC32C), its sidecar index, and tf.train.Example wire format."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import crc32c
import pytest

from fastloader.errors import FormatError
from fastloader.formats.protobuf import (
    Feature,
    bytes_feature,
    encode_example,
    float_feature,
    int64_feature,
    parse_example,
)
from fastloader.formats.tfrecord import (
    TFRecordWriter,
    default_index_path,
    load_index,
    masked_crc32c,
    read_record,
    scan_records,
)


def reference_mask(data: bytes) -> int:
    """TensorFlow's mask, computed here independently: rotate right by 15, add a constant, mod 2**32."""
    crc = crc32c.crc32c(data)
    rotated = ((crc >> 15) | (crc << 17)) % 2**32
    return (rotated + 0xA282EAD8) % 2**32


def write(path: Path, records: list[bytes]) -> None:
    with TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)


def test_masked_crc32c() -> None:
    assert crc32c.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert masked_crc32c(b"") == 0xA282EAD8
    for data in (b"123456789", b"\x00" * 8, os.urandom(100)):
        assert masked_crc32c(data) == reference_mask(data)


def test_writer_frames_records_as_documented(tmp_path: Path) -> None:
    path = tmp_path / "a.tfrecord"
    write(path, [b"hello", b""])
    expected = b""
    for data in (b"hello", b""):
        length = struct.pack("<Q", len(data))
        expected += length + struct.pack("<I", reference_mask(length)) + data + struct.pack("<I", reference_mask(data))
    assert path.read_bytes() == expected


def test_scan_and_read_back_random_order_byte_exact(tmp_path: Path) -> None:
    rng = random.Random(3)
    records = [rng.randbytes(rng.randrange(0, 2000)) for _ in range(200)]
    path = tmp_path / "r.tfrecord"
    write(path, records)
    size = os.path.getsize(path)
    index = load_index(path)
    offsets, lengths = index.arrays["offsets"], index.arrays["lengths"]
    assert lengths.tolist() == [len(r) for r in records]
    assert offsets[0] == 0 and int(offsets[-1] + lengths[-1] + 16) == size
    order = list(range(len(records)))
    rng.shuffle(order)
    fd = os.open(path, os.O_RDONLY)
    try:
        for i in order:
            assert bytes(read_record(fd, int(offsets[i]), int(lengths[i]), size, str(path))) == records[i]
    finally:
        os.close(fd)


def test_index_is_built_once_and_rebuilt_when_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "b.tfrecord"
    write(path, [b"x" * 10] * 3)
    index_path = Path(default_index_path(path))
    assert index_path == tmp_path / "b.tfrecord.flindex"
    assert not index_path.exists()
    assert len(load_index(path).arrays["offsets"]) == 3
    built = index_path.stat()
    assert len(load_index(path).arrays["offsets"]) == 3
    assert index_path.stat().st_ino == built.st_ino  # reused, not rewritten (a rewrite is a new file)
    write(path, [b"y" * 5] * 4)
    assert len(load_index(path).arrays["offsets"]) == 4
    elsewhere = tmp_path / "idx" / "b.index"
    assert load_index(path, elsewhere).arrays["lengths"].tolist() == [5] * 4
    assert elsewhere.exists()


# -- malformed files ------------------------------------------------------------------------------


def corrupt(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_flipped_length_crc_byte(tmp_path: Path) -> None:
    path = tmp_path / "c.tfrecord"
    write(path, [b"abc", b"defg"])
    corrupt(path, 19 + 9)  # the second record (at 19) length CRC
    with pytest.raises(FormatError, match=r"c\.tfrecord: length CRC mismatch at offset 19"):
        load_index(path)


def test_flipped_data_or_data_crc_byte(tmp_path: Path) -> None:
    path = tmp_path / "d.tfrecord"
    for flip in (19 + 12, 19 + 12 + 4):  # in the second record's data, in its data CRC
        write(path, [b"abc", b"defg"])
        corrupt(path, flip)
        size = os.path.getsize(path)
        with open(path, "rb") as file:
            offsets, lengths = scan_records(file.fileno(), size, str(path))  # the scan reads headers only
            assert bytes(read_record(file.fileno(), 0, 3, size, str(path))) == b"abc"
            with pytest.raises(FormatError, match=r"d\.tfrecord: data CRC mismatch in the record at offset 19"):
                read_record(file.fileno(), int(offsets[1]), int(lengths[1]), size, str(path))


def test_foreign_files_are_rejected(tmp_path: Path) -> None:
    import gzip

    path = tmp_path / "f.tfrecord"
    write(path, [b"payload"])
    gz = tmp_path / "f.tfrecord.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    with pytest.raises(FormatError, match=r"f\.tfrecord\.gz: length CRC mismatch at offset 0 .*compressed"):
        load_index(gz)
    text = tmp_path / "notes.txt"
    text.write_text("just some text, not records at all\n")
    with pytest.raises(FormatError, match="notes.txt"):
        load_index(text)


def test_writer_leaves_nothing_behind_on_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), TFRecordWriter(tmp_path / "g.tfrecord") as writer:
        writer.write(b"abc")
        raise RuntimeError("interrupted")
    assert os.listdir(tmp_path) == []


# -- tf.train.Example -----------------------------------------------------------------------------


def test_example_round_trip() -> None:
    features = {
        "image/encoded": bytes_feature(b"\xff\xd8\xff" + bytes(range(256))),
        "image/class/label": int64_feature(412),
        "ints": int64_feature(0, -1, 2**63 - 1, -(2**63), 300),
        "floats": float_feature(0.5, -2.25, 2.0**100),
        "many": bytes_feature(b"a", b"", b"c"),
        "nothing": int64_feature(),
    }
    assert parse_example(encode_example(features)) == features
    assert parse_example(encode_example(features), ["ints", "absent"]) == {"ints": features["ints"]}


def ld(field: int, payload: bytes) -> bytes:
    """A length-delimited field with a one-byte length (test payloads are short)."""
    assert len(payload) < 128
    return bytes([field << 3 | 2, len(payload)]) + payload


def example_with(name: bytes, feature: bytes, extra: bytes = b"") -> bytes:
    return ld(1, ld(1, ld(1, name) + ld(2, feature)) + extra)


def test_unpacked_repeated_values_and_negative_varints() -> None:
    minus_two = b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01"  # int64 -2: two's complement, 10 bytes
    int64_list = b"\x08\x01" + b"\x08" + minus_two  # field 1 varint, unpacked
    float_list = b"\x0d" + struct.pack("<f", 1.5) + b"\x0d" + struct.pack("<f", -4.0)  # field 1 fixed32
    data = example_with(b"i", ld(3, int64_list)) + example_with(b"f", ld(2, float_list))
    assert parse_example(data) == {"i": Feature("int64", (1, -2)), "f": Feature("float", (1.5, -4.0))}


def test_unknown_fields_skipped_and_last_map_entry_wins() -> None:
    unknown = b"\x78\x05" + b"\x81\x01" + b"12345678" + b"\x85\x01" + b"1234"  # varint, fixed64, fixed32 fields
    data = example_with(b"label", ld(3, ld(1, b"\x07")), extra=unknown) + example_with(b"label", ld(3, ld(1, b"\x09")))
    assert parse_example(data) == {"label": Feature("int64", (9,))}


@pytest.mark.parametrize(
    "data",
    [
        b"hello world, this is not a protobuf",
        b"\x0a\x05abc",  # length past the end
        b"\x08\xff\xff\xff",  # truncated varint
        b"\x08" + b"\xff" * 11,  # varint longer than 10 bytes
        b"\x0b\x0c",  # group wire types
        b"\x00\x00",  # field number 0
        b"\x08\x01",  # Example.features is a varint, not a message
        example_with(b"f", ld(2, ld(1, b"abc"))),  # packed floats of 3 bytes
    ],
)
def test_malformed_examples_raise_format_error(data: bytes) -> None:
    with pytest.raises(FormatError):
        parse_example(data)
