"""Fields through ``fastloader pack`` into a fastloader LMDB and back: every kind, from every source
format that carries fields, exactly; old packs still read; newer ones refused; missing fields named."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
from PIL import Image

from fastloader.datasets.folder import FileListSource
from fastloader.datasets.lmdb import LMDBSource, shared_handle
from fastloader.datasets.recordio import RecordIOSource
from fastloader.datasets.tfrecord import TFRecordSource
from fastloader.errors import FormatError, MissingField
from fastloader.fields.source import field_kinds, read_fields
from fastloader.formats import lmdb_records as records
from fastloader.formats.protobuf import bytes_feature, encode_example, float_feature, int64_feature
from fastloader.formats.recordio import RecordIOWriter, multi_label, single_label
from fastloader.formats.recordio import pack as pack_record
from fastloader.formats.tfrecord import TFRecordWriter
from fastloader.pack.engine import pack
from fastloader.pack.verify import verify
from tests.field_items import FieldItems, assert_same_value
from tests.images import image_bytes, packed_items, write_image_folder


def mask_png(index: int) -> bytes:
    pixels = (np.arange(12 * 9).reshape(9, 12) * (index + 1) % 5).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "L").save(out, format="PNG")
    return out.getvalue()


KINDS = {
    "mask": "image",
    "raw": "bytes",
    "caption": "text",
    "meta": "json",
    "count": "int",
    "score": "float",
    "boxes": "array",
    "seg": "array",
    "flags": "array",
    "half": "array",
    "big_endian": "array",
    "empty": "array",
    "scalar": "array",
}


def values_of(index: int) -> dict[str, Any]:
    """Item ``index``'s fields: every kind, odd values of each, and some fields missing."""
    rng = np.random.default_rng(index)
    values: dict[str, Any] = {
        "mask": mask_png(index),
        "raw": [b"", b"\x00\xff\x00 binary\n", rng.bytes(3000)][index % 3],
        "caption": ["", "ünïcode ✓ 🐱\nline two\r\n\ttab", "plain", "\x00 nul inside"][index % 4],
        "meta": [{"a": [1, 2.5, None, True], "ü": {"nested": "🐱"}}, [], "just a string", 12, None][index % 5],
        "count": [0, -1, 2**63 - 1, -(2**63), 123456789][index % 5],
        "score": [0.1, -0.0, math.inf, -math.inf, 5e-324, 1 / 3, math.nan][index % 7],
        "boxes": rng.random((index % 4, 4), dtype=np.float32),
        "seg": rng.integers(0, 255, (3, 5, 2), dtype=np.uint8),
        "flags": rng.random(7) > 0.5,
        "half": rng.random(5).astype(np.float16),
        "big_endian": np.arange(index, index + 6, dtype=">i4").reshape(2, 3),
        "empty": np.zeros((0, 4)),
        "scalar": np.array(index * 1000, dtype=np.int64),
    }
    if index % 3 == 1:
        del values["caption"], values["boxes"]  # an item lacks these: MissingField
    if index == 4:
        values = {}  # an item without any field
    return values


class AllKinds(FieldItems):
    """Real images whose items carry :func:`values_of`: odd values of every kind (module level: readers pickle it)."""

    classes = ["a", "b"]
    kinds = KINDS

    def values(self, index: int) -> dict[str, Any]:
        return values_of(index)

    def label(self, index: int) -> int:
        return index % 2

    def key(self, index: int) -> str:
        return f"item-{index}"


def assert_same_fields(packed: Any, source: Any) -> None:
    kinds = field_kinds(source)
    assert field_kinds(packed) == kinds
    for index in range(len(source)):
        got, expected = read_fields(packed, index), read_fields(source, index)
        assert sorted(got) == sorted(expected), index
        for name, value in expected.items():
            assert_same_value(got[name], value, f"item {index}, field {name}")


@pytest.fixture(scope="module")
def all_kinds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("fields") / "all.lmdb"
    summary = pack(AllKinds(), dst, workers=0, progress=False, commit_every=5)
    assert summary.skipped == () and summary.packed == 12
    return dst


def test_every_kind_of_field_round_trips_exactly(all_kinds: Path) -> None:
    source, packed = AllKinds(), LMDBSource(all_kinds)
    assert packed.field_kinds() == dict(sorted(KINDS.items()))  # field numbers: the engine's (sorted) order
    assert_same_fields(packed, source)
    assert [packed.read(i) for i in range(12)] == [image_bytes(i) for i in range(12)]
    assert packed.labels().tolist() == [i % 2 for i in range(12)] and packed.classes == ["a", "b"]
    assert math.isnan(packed.read_field(6, "score")) and packed.read_field(1, "score") == 0.0
    assert str(packed.read_field(1, "score")) == "-0.0"
    assert verify(all_kinds).ok


def test_readers_in_processes_pack_the_same_file(all_kinds: Path, tmp_path: Path) -> None:
    pack(AllKinds(), tmp_path / "parallel.lmdb", workers=2, progress=False, commit_every=5)
    assert (tmp_path / "parallel.lmdb" / "data.mdb").read_bytes() == (all_kinds / "data.mdb").read_bytes()


def test_the_pack_is_format_version_2_with_its_schema_and_version_2_records(all_kinds: Path) -> None:
    with shared_handle(str(all_kinds)).env.begin() as txn:
        meta = json.loads(txn.get(records.META_KEY))
        first = txn.get(records.record_key(0))
        progress = json.loads(txn.get(records.PROGRESS_KEY))
    assert meta["version"] == progress["version"] == 2
    assert meta["fields"] == [[name, KINDS[name]] for name in sorted(KINDS)]
    assert first[3] == 2 and records.decode_record(first, "r", verify_checksum=True) == (0, image_bytes(0))


def test_a_missing_field_names_the_record_and_the_field(all_kinds: Path) -> None:
    packed = LMDBSource(all_kinds)
    with pytest.raises(MissingField, match=rf"{all_kinds}\[1\]: no field 'caption'$"):
        packed.read_field(1, "caption")
    with pytest.raises(MissingField, match=rf"{all_kinds}\[4\]: no field 'mask'$"):
        packed.read_field(4, "mask")
    with pytest.raises(MissingField, match=rf"{all_kinds}\[0\]: no field 'nope' \(the pack's fields: big_endian,"):
        packed.read_field(0, "nope")
    assert read_fields(packed, 4) == {}


def test_the_image_then_its_fields_cost_one_get(all_kinds: Path) -> None:
    packed = LMDBSource(all_kinds)
    opened = []
    get = packed._local.get
    packed._local.get = lambda: opened.append(1) or get()  # type: ignore[method-assign]
    assert packed.read(7) == image_bytes(7)
    assert packed.read_field(7, "mask") == mask_png(7) and packed.read_field(7, "count") == values_of(7)["count"]
    assert len(opened) == 1, "read_field after read: from the record read"
    assert packed.read_field(8, "raw") == values_of(8)["raw"] and packed.read_field(8, "meta") == values_of(8)["meta"]
    assert len(opened) == 2, "the fields of another item: one get for all of them"


def test_checksums_on_read_cover_the_fields(all_kinds: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.lmdb"
    copy.mkdir()
    (copy / "data.mdb").write_bytes(flip(all_kinds, mask_png(9)[-30:], 10))
    assert LMDBSource(copy).read(9) == image_bytes(9)  # the image is intact
    with pytest.raises(FormatError, match=r"copy\.lmdb\[9\]: checksum mismatch"):
        LMDBSource(copy, verify_checksums=True).read_field(9, "caption")


def flip(pack_path: Path, needle: bytes, offset: int) -> bytes:
    blob = bytearray((pack_path / "data.mdb").read_bytes())
    at = blob.find(needle)
    assert at >= 0 and blob.find(needle, at + 1) == -1, "the needle must identify one place in the file"
    blob[at + offset] ^= 0xFF
    return bytes(blob)


def test_an_lmdb_with_fields_repacks_into_one_with_the_same_fields(all_kinds: Path, tmp_path: Path) -> None:
    pack(all_kinds, tmp_path / "again.lmdb", workers=0, progress=False)
    again = LMDBSource(tmp_path / "again.lmdb")
    assert_same_fields(again, LMDBSource(all_kinds))
    assert again.source_key(3) == f"{all_kinds}[3]"


def test_a_pack_without_fields_is_the_version_1_pack_every_fastloader_reads(tmp_path: Path) -> None:
    items = write_image_folder(tmp_path / "images", count=9)
    dst = tmp_path / "plain.lmdb"
    pack(tmp_path / "images", dst, workers=0, progress=False)
    with lmdb.open(str(dst), readonly=True, lock=False) as env, env.begin() as txn:
        meta = json.loads(txn.get(records.META_KEY))
        values = [txn.get(records.record_key(i)) for i in range(9)]
    assert meta["version"] == 1 and "fields" not in meta
    assert all(value[3] == 1 and value[records.HEADER.size :] == data for value, (_, _, data) in zip(values, items))
    source = LMDBSource(dst)
    assert source.field_kinds() == {} and packed_items(dst) == items
    with pytest.raises(MissingField, match=r"plain\.lmdb\[0\]: no field 'caption' \(the pack's fields: none\)"):
        source.read_field(0, "caption")


def test_a_reader_that_knows_only_version_1_refuses_a_pack_with_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dst = tmp_path / "new.lmdb"
    pack(AllKinds(3), dst, workers=0, progress=False)
    monkeypatch.setattr(records, "FORMAT_VERSION", 1)  # what fastloader read before fields existed
    with pytest.raises(FormatError, match=r"new\.lmdb: written by a newer fastloader \(format version 2; this one"):
        LMDBSource(dst)
    with pytest.raises(FormatError, match=r"new\.lmdb: written by a newer fastloader"):
        verify(dst)


def test_a_field_that_does_not_decode_is_skipped_when_packed_naming_the_item(tmp_path: Path) -> None:
    class BadField(AllKinds):
        def read_field(self, index: int, name: str) -> Any:
            bad = {(2, "count"): "not an int", (3, "caption"): "caf\udce9"}  # a lone surrogate: no UTF-8 for it
            return bad.get((index, name)) or super().read_field(index, name)

    summary = pack(BadField(4), tmp_path / "bad.lmdb", workers=0, progress=False)
    assert [(s.key, s.reason) for s in summary.skipped] == [
        ("item-2", "unreadable: FormatError: item-2: field 'count': a str is not a valid int value"),
        (
            "item-3",
            "rejected: ValueError: item-3: field 'caption': 'utf-8' codec can't encode character '\\udce9' "
            "in position 3: surrogates not allowed",
        ),
    ]
    assert len(LMDBSource(tmp_path / "bad.lmdb")) == 2 and verify(tmp_path / "bad.lmdb").ok


@pytest.mark.parametrize("through", ["tar", "parquet"])
def test_fields_survive_lmdb_to_another_format_and_back(through: str, tmp_path: Path) -> None:
    pack(FieldItems(), tmp_path / "first.lmdb", workers=0, progress=False)
    assert_same_fields(LMDBSource(tmp_path / "first.lmdb"), FieldItems())
    pack(tmp_path / "first.lmdb", tmp_path / through, format=through, shard_size=5, workers=0, progress=False)
    assert verify(tmp_path / through).ok
    pack(tmp_path / through, tmp_path / "back.lmdb", src_format=through, workers=0, progress=False)
    back = LMDBSource(tmp_path / "back.lmdb")
    assert_same_fields(back, FieldItems())
    assert [back.read(i) for i in range(12)] == [image_bytes(i) for i in range(12)]
    assert back.labels().tolist() == [i % 3 for i in range(12)]


# -- from the formats that carry fields -----------------------------------------------------------


def test_tfrecord_features_pack_into_fields(tmp_path: Path) -> None:
    path = tmp_path / "train.tfrecord"
    with TFRecordWriter(path) as writer:
        for i in range(6):
            features = {
                "image/encoded": bytes_feature(image_bytes(i)),
                "image/class/label": int64_feature(i),
                "image/filename": bytes_feature(f"ü{i}.jpg".encode()),
                "image/object/bbox/xmin": float_feature(*[0.1 * j + i for j in range(i % 3)]),
                "image/object/class/label": int64_feature(-(2**63), i, 2**63 - 1),
                "image/segmentation": bytes_feature(mask_png(i)),
            }
            if i == 3:
                del features["image/filename"]
            writer.write(encode_example(features))
    source = TFRecordSource(path)
    assert source.field_kinds() == {
        "image/filename": "bytes",
        "image/object/bbox/xmin": "array",
        "image/object/class/label": "array",
        "image/segmentation": "bytes",
    }
    pack(path, tmp_path / "tf.lmdb", workers=0, progress=False)
    packed = LMDBSource(tmp_path / "tf.lmdb")
    assert_same_fields(packed, source)
    assert packed.read_field(4, "image/object/bbox/xmin").dtype == np.float32
    assert packed.read_field(5, "image/object/class/label").tolist() == [-(2**63), 5, 2**63 - 1]
    assert [packed.label(i) for i in range(6)] == list(range(6)) and packed.read(2) == image_bytes(2)
    with pytest.raises(MissingField, match=r"tf\.lmdb\[3\]: no field 'image/filename'"):
        packed.read_field(3, "image/filename")


def test_file_list_columns_pack_into_text_fields(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "images", count=4)
    captions = ["a cat, sitting", "", "ünïcode ✓ 🐱", ' "quoted"\nand two lines ']
    rows = [
        f'class_{i % 3}/{i:04d}.jpg,{i % 3},"{c.replace(chr(34), chr(34) * 2)}",s{i}' for i, c in enumerate(captions)
    ]
    listing = tmp_path / "images" / "list.csv"
    listing.write_text("path,label,caption,source\n" + "\n".join(rows) + "\n", encoding="utf-8")
    source = FileListSource(listing)
    assert [source.read_field(i, "caption") for i in range(4)] == captions
    pack(listing, tmp_path / "list.lmdb", workers=0, progress=False)
    packed = LMDBSource(tmp_path / "list.lmdb")
    assert packed.field_kinds() == {"caption": "text", "source": "text"}
    assert [packed.read_field(i, "caption") for i in range(4)] == captions
    assert [packed.read_field(i, "source") for i in range(4)] == ["s0", "s1", "s2", "s3"]
    assert_same_fields(packed, source)


def test_multi_label_recordio_packs_with_its_exact_labels(tmp_path: Path) -> None:
    labels = [np.array([i, 0.1, -1e-30, 3.4e38][: 2 + i % 3], dtype=np.float32) for i in range(6)]
    rec, idx = str(tmp_path / "multi.rec"), str(tmp_path / "multi.idx")
    with RecordIOWriter(rec, idx) as writer:  # as im2rec --pack-label writes it
        for i in range(6):
            writer.write(i, pack_record(multi_label(labels[i], i), image_bytes(i)))
    pack(rec, tmp_path / "multi.lmdb", workers=0, progress=False)
    packed = LMDBSource(tmp_path / "multi.lmdb")
    assert packed.field_kinds() == {"labels": "array"} and packed.labels().tolist() == [-1] * 6
    for i in range(6):
        value = packed.read_field(i, "labels")
        assert (value.dtype, value.tobytes()) == (np.dtype(np.float32), labels[i].tobytes())
        assert packed.read(i) == image_bytes(i)
    assert_same_fields(packed, RecordIOSource(rec))


def test_single_label_recordio_packs_without_fields(tmp_path: Path) -> None:
    rec = str(tmp_path / "one.rec")
    with RecordIOWriter(rec, str(tmp_path / "one.idx")) as writer:
        for i in range(4):
            writer.write(i, pack_record(single_label(i % 2, i), image_bytes(i)))
    pack(rec, tmp_path / "one.lmdb", workers=0, progress=False)
    assert LMDBSource(tmp_path / "one.lmdb").meta.version == 1
    assert LMDBSource(tmp_path / "one.lmdb").labels().tolist() == [0, 1, 0, 1]
