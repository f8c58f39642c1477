"""The fastloader LMDB layout: record header, checksum, reserved records and versioned metadata."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from fastloader.errors import FormatError
from fastloader.formats import lmdb_records as records

JPEG = b"\xff\xd8\xff\xe0" + bytes(range(200))


def test_record_round_trip_keeps_label_and_bytes() -> None:
    value = records.encode_record(-7, JPEG)
    assert len(value) == records.HEADER.size + len(JPEG) == 24 + len(JPEG)
    assert records.decode_record(value, "k", verify_checksum=True) == (-7, JPEG)
    header = records.parse_header(value, "k")
    assert (header.version, header.format_code, header.label, header.length) == (1, 1, -7, len(JPEG))
    assert header.checksum == records.record_checksum(value)


@pytest.mark.parametrize("offset", [8, 12, 24, 100, -1])  # label bytes and image bytes are both covered
def test_checksum_catches_a_flipped_byte_in_label_or_image(offset: int) -> None:
    value = bytearray(records.encode_record(3, JPEG))
    value[offset] ^= 0x01
    with pytest.raises(FormatError, match="db\\[5\\]: checksum mismatch"):
        records.decode_record(bytes(value), "db[5]", verify_checksum=True)
    records.decode_record(bytes(value), "db[5]")  # not checked unless asked: reads stay fast


def test_header_problems_name_the_record() -> None:
    value = records.encode_record(1, JPEG)
    with pytest.raises(FormatError, match="db\\[2\\]: not a fastloader record"):
        records.parse_header(b"XYZ" + value[3:], "db[2]")
    with pytest.raises(FormatError, match="db\\[2\\]: record version 9 is newer"):
        records.parse_header(value[:3] + b"\x09" + value[4:], "db[2]")
    with pytest.raises(FormatError, match="holds 199 image bytes, its header says 204"):
        records.parse_header(value[:-5], "db[2]")
    with pytest.raises(FormatError, match="shorter than its 24-byte header"):
        records.parse_header(value[:10], "db[2]")


def test_keys_sort_in_record_order_and_never_collide_with_reserved_keys() -> None:
    keys = [records.record_key(n) for n in (0, 1, 255, 256, 70_000, 10**10)]
    assert keys == sorted(keys) and all(records.is_record_key(k) for k in keys)
    assert [records.record_number(k) for k in keys] == [0, 1, 255, 256, 70_000, 10**10]
    reserved = [records.META_KEY, records.PROGRESS_KEY, records.LABELS_KEY, records.skipped_key(3)]
    reserved += [records.chunk_key(records.LABEL_CHUNK_PREFIX, 0), records.chunk_key(records.KEY_CHUNK_PREFIX, 0)]
    assert not any(records.is_record_key(k) for k in reserved)
    assert records.chunk_start(records.KEY_CHUNK_PREFIX, records.chunk_key(records.KEY_CHUNK_PREFIX, 513)) == 513


def test_image_formats_are_sniffed() -> None:
    assert records.image_format_code(JPEG) == records.FORMAT_CODES["JPEG"]
    assert records.image_format_code(b"\x89PNG\r\n\x1a\n....") == records.FORMAT_CODES["PNG"]
    assert records.image_format_code(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == records.FORMAT_CODES["WEBP"]
    assert records.image_format_code(b"hello") == 0


def test_label_and_key_chunks_round_trip() -> None:
    labels = records.decode_labels(records.encode_labels([0, 5, -1, 2**40]), "db")
    assert labels.dtype == np.dtype("<i8") and labels.tolist() == [0, 5, -1, 2**40]
    with pytest.raises(FormatError, match="not a whole number of int64"):
        records.decode_labels(b"1234567", "db")
    keys = ["a/b.jpg", "ünïcode.png", "shard-0.tar:000001", "odd\x00name"]
    assert records.decode_keys(records.encode_keys(keys)) == keys[:3] + ["odd\\x00name"]


def test_metadata_round_trips_as_json_never_pickle() -> None:
    meta = records.LMDBMeta(10, ("cat", "dog"), {"source": {"count": 11}}, 1, "fastloader 0.1.0", {"source": "x"})
    raw = meta.to_json()
    assert json.loads(raw)["format"] == "fastloader-lmdb" and json.loads(raw)["version"] == 1
    assert records.LMDBMeta.from_json(raw, "db") == meta
    progress = records.PackProgress({"a": [1, 2]}, next_position=12, count=11)
    assert records.PackProgress.from_json(progress.to_json(), "db") == progress


def test_newer_or_foreign_metadata_is_refused_naming_the_path() -> None:
    doc = json.loads(records.LMDBMeta(1, None, {}, 0, "x").to_json())
    with pytest.raises(FormatError, match="train.lmdb: written by a newer fastloader \\(format version 3"):
        records.LMDBMeta.from_json(json.dumps({**doc, "version": 3}).encode(), "train.lmdb")
    with pytest.raises(FormatError, match="train.lmdb: not a fastloader LMDB"):
        records.LMDBMeta.from_json(json.dumps({**doc, "format": "caffe"}).encode(), "train.lmdb")
    with pytest.raises(FormatError, match="train.lmdb: unreadable metadata record"):
        records.LMDBMeta.from_json(b"\x80\x04pickle", "train.lmdb")
    with pytest.raises(FormatError, match="train.lmdb: incomplete metadata record"):
        records.LMDBMeta.from_json(json.dumps({"format": "fastloader-lmdb", "version": 1}).encode(), "train.lmdb")


def test_a_version_2_record_holds_the_fields_after_the_image_byte_for_byte() -> None:
    fields = [(0, b"caption"), (2, b""), (7, bytes(range(256)))]
    value = records.encode_record(4, JPEG, fields)
    header = records.parse_header(value, "k")
    assert (header.version, header.label, header.length) == (2, 4, len(JPEG))
    assert records.decode_record(value, "k", verify_checksum=True) == (4, JPEG)
    table = struct.pack("<7I", 3, 0, 2, 7, 7, 0, 256)
    assert value[records.HEADER.size :] == JPEG + table + b"caption" + bytes(range(256))
    section = records.fields_section(value, header)
    assert {number: bytes(data) for number, data in records.parse_fields(section, "k").items()} == dict(fields)
    empty = records.encode_record(4, JPEG, [])  # a pack with fields, an item without any: count 0
    assert empty[-4:] == b"\x00" * 4 and records.parse_fields(records.fields_section(empty, header), "k") == {}
    plain = records.encode_record(4, JPEG)  # no fields: the version 1 record, exactly as before fields
    assert plain[3] == 1 and plain[records.HEADER.size :] == JPEG
    assert records.parse_fields(records.fields_section(plain, records.parse_header(plain, "k")), "k") == {}


@pytest.mark.parametrize("offset", [-1, -260, -270, -283])  # both fields, a length in the table, the count
def test_the_checksum_covers_the_fields(offset: int) -> None:
    value = bytearray(records.encode_record(4, JPEG, [(0, b"caption"), (1, bytes(256))]))
    value[offset] ^= 0x01
    with pytest.raises(FormatError, match="db\\[1\\]: checksum mismatch"):
        records.decode_record(bytes(value), "db[1]", verify_checksum=True)


def test_field_tables_that_do_not_describe_the_bytes_are_named() -> None:
    with pytest.raises(ValueError, match="increasing"):
        records.encode_record(0, JPEG, [(1, b"a"), (0, b"b")])
    with pytest.raises(ValueError, match="increasing"):
        records.encode_record(0, JPEG, [(1, b"a"), (1, b"b")])
    good = struct.pack("<3I", 1, 5, 3) + b"abc"
    assert {n: bytes(d) for n, d in records.parse_fields(good, "k").items()} == {5: b"abc"}
    cases = {
        good[:2]: "db\\[3\\]: a field table of 2 bytes is truncated",
        struct.pack("<I", 10**9) + bytes(8): "db\\[3\\]: a table of 1000000000 fields does not fit",
        good + b"x": "announces 3 bytes of fields, the record holds 4",
        good[:-1]: "announces 3 bytes of fields, the record holds 2",
        struct.pack("<5I", 2, 3, 3, 0, 0): "field numbers \\[3, 3\\] are not strictly increasing",
    }
    for section, message in cases.items():
        with pytest.raises(FormatError, match=message):
            records.parse_fields(section, "db[3]")
    short = records.encode_record(0, JPEG, [])[:-1]
    with pytest.raises(FormatError, match="cannot hold its 204 image bytes and a field table"):
        records.parse_header(short, "db[3]")


def test_a_reader_of_version_1_records_refuses_a_version_2_record(monkeypatch: pytest.MonkeyPatch) -> None:
    value = records.encode_record(0, JPEG, [(0, b"x")])
    monkeypatch.setattr(records, "RECORD_VERSION", 1)  # what an older fastloader knows
    with pytest.raises(FormatError, match="db\\[0\\]: record version 2 is newer than this fastloader reads"):
        records.parse_header(value, "db[0]")
    records.parse_header(records.encode_record(0, JPEG), "db[0]")


def test_metadata_with_fields_is_format_version_2_and_plain_metadata_stays_version_1() -> None:
    schema = (("caption", "text"), ("mask", "image"), ("boxes", "array"))
    assert records.format_version(schema) == 2 and records.format_version(()) == records.format_version({}) == 1
    meta = records.LMDBMeta(3, None, {}, 0, "fastloader", fields=schema, version=2)
    doc = json.loads(meta.to_json())
    assert doc["version"] == 2 and doc["fields"] == [["caption", "text"], ["mask", "image"], ["boxes", "array"]]
    assert records.LMDBMeta.from_json(meta.to_json(), "db") == meta
    plain = json.loads(records.LMDBMeta(3, None, {}, 0, "fastloader").to_json())
    assert plain["version"] == 1 and "fields" not in plain  # byte for byte the metadata older fastloaders read
    with pytest.raises(ValueError, match="a pack with fields is format version 2, not 1"):
        records.LMDBMeta(3, None, {}, 0, "x", fields=schema)
    with pytest.raises(FormatError, match="db: incomplete metadata record .*kind must be one of"):
        records.LMDBMeta.from_json(json.dumps({**doc, "fields": [["a", "pickle"]]}).encode(), "db")
    with pytest.raises(FormatError, match="db: incomplete metadata record .*field names repeat"):
        records.LMDBMeta.from_json(json.dumps({**doc, "fields": [["a", "text"], ["a", "int"]]}).encode(), "db")


def test_a_reader_of_format_version_1_refuses_a_pack_with_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    meta = records.LMDBMeta(3, None, {}, 0, "fastloader", fields=(("caption", "text"),), version=2)
    monkeypatch.setattr(records, "FORMAT_VERSION", 1)  # what an older fastloader knows
    with pytest.raises(FormatError, match="train.lmdb: written by a newer fastloader \\(format version 2; this one "):
        records.LMDBMeta.from_json(meta.to_json(), "train.lmdb")
    records.LMDBMeta.from_json(records.LMDBMeta(3, None, {}, 0, "x").to_json(), "train.lmdb")  # plain: still read
