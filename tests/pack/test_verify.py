"""``verify``: corrupted bytes, labels, keys and structure in real LMDB files are found and named."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import lmdb
import numpy as np
import pytest

from fastloader.datasets.folder import FolderSource
from fastloader.errors import FormatError, MissingField
from fastloader.formats import lmdb_records as records
from fastloader.pack import pack
from fastloader.pack.verify import verify
from tests.field_items import FieldItems
from tests.images import write_image_folder


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[str, int, bytes]]]:
    root = tmp_path_factory.mktemp("verify")
    items = write_image_folder(root / "images", count=30)
    pack(root / "images", root / "clean.lmdb", workers=0, progress=False)
    return root / "clean.lmdb", items


def corrupted_copy(clean: Path, tmp_path: Path, needle: bytes, offset: int) -> Path:
    """A copy of the pack with one byte flipped, ``offset`` bytes into the only occurrence of ``needle``."""
    copy = tmp_path / "copy.lmdb"
    shutil.copytree(clean, copy)
    blob = bytearray((copy / "data.mdb").read_bytes())
    at = blob.find(needle)
    assert at >= 0 and blob.find(needle, at + 1) == -1, "the needle must identify one place in the file"
    blob[at + offset] ^= 0xFF
    (copy / "data.mdb").write_bytes(blob)
    return copy


def test_a_clean_pack_verifies(clean) -> None:
    path, items = clean
    report = verify(path)
    assert report.ok and (report.format, report.expected, report.checked) == ("lmdb", 30, 30)
    assert report.format_text() == f"OK: 30 records verified in {path} (lmdb)"


def test_a_flipped_image_byte_is_found_and_named(clean, tmp_path: Path) -> None:
    path, items = clean
    copy = corrupted_copy(path, tmp_path, items[11][2][-80:], 40)
    report = verify(copy)
    assert not report.ok and report.bad_records == (11,) and report.checked == 30
    assert report.problems == (f"{copy}[11] ({items[11][0]}): checksum mismatch: the record is corrupted",)
    assert "FAILED: 1 problems" in report.format_text()


def test_a_flipped_label_byte_is_found(clean, tmp_path: Path) -> None:
    path, items = clean
    header = records.encode_record(items[20][1], items[20][2])[: records.HEADER.size] + items[20][2][:16]
    report = verify(corrupted_copy(path, tmp_path, header, 8))  # byte 8: the label's low byte
    assert report.bad_records == (20,) and "checksum mismatch" in report.problems[0]


def test_a_damaged_key_is_found_without_crashing(clean, tmp_path: Path) -> None:
    path, _ = clean
    node_key = b"\x08\x00" + records.record_key(7)  # a leaf node's key size (8), then the key
    report = verify(corrupted_copy(path, tmp_path, node_key, 9))  # key 7 becomes key 248
    assert len(report.problems) == 1 and "LMDB structure: main DB: leaf keys out of order" in report.problems[0]


def test_a_missing_record_and_a_foreign_key_are_found(clean, tmp_path: Path) -> None:
    path, _ = clean
    copy = tmp_path / "holes.lmdb"
    shutil.copytree(path, copy)
    with lmdb.open(str(copy)) as env, env.begin(write=True) as txn:
        txn.delete(records.record_key(5))
        txn.put(b"stray", b"value")
    report = verify(copy)
    assert f"{copy}: records 5..5 are missing" in report.problems
    assert f"{copy}: unexpected key b'stray' (not a record, not reserved)" in report.problems


def test_an_incomplete_or_missing_pack_is_an_error(tmp_path: Path) -> None:
    with lmdb.open(str(tmp_path / "half.lmdb")) as env, env.begin(write=True) as txn:
        txn.put(records.PROGRESS_KEY, records.PackProgress({}, 4, 4).to_json())
    with pytest.raises(FormatError, match="incomplete pack"):
        verify(tmp_path / "half.lmdb")
    with pytest.raises(FileNotFoundError, match="nothing.lmdb"):
        verify(tmp_path / "nothing.lmdb")
    (tmp_path / "folder").mkdir()
    with pytest.raises(FormatError, match="neither a fastloader LMDB"):
        verify(tmp_path / "folder")


def test_tar_shards_verify_and_a_truncated_shard_is_found(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "images", count=12)
    pack(tmp_path / "images", tmp_path / "shards", format="tar", shard_size=5, workers=0, progress=False)
    report = verify(tmp_path / "shards")
    assert report.ok and (report.format, report.checked) == ("tar", 12)
    shard = tmp_path / "shards" / "shard-000001.tar"
    shard.write_bytes(shard.read_bytes()[:1500])
    damaged = verify(tmp_path / "shards")
    assert not damaged.ok and "shard-000001.tar" in damaged.problems[0] and "truncated" in damaged.problems[0]


def without_hashes(dst: Path) -> str:
    """Make ``dst`` a tar pack as fastloader wrote it before content hashes (manifest v2); returns the line
    verify then reports first."""
    manifest = dst / "fastloader-tar.json"
    raw = json.loads(manifest.read_bytes())
    for shard in raw["shards"]:
        del shard["size"], shard["sha256"]
    manifest.write_text(json.dumps({**raw, "version": 2}))
    return f"{dst}: cannot check the bytes of this tar pack: its manifest records no size and SHA-256"


def test_corrupted_field_members_are_found_and_named(tmp_path: Path) -> None:
    pack(FieldItems(8), tmp_path / "shards", format="tar", shard_size=5, workers=0, progress=False)
    assert verify(tmp_path / "shards").ok
    json_member = corrupt_member(tmp_path / "shards" / "shard-000000.tar", "000000003.meta.json", b"]")
    npy_member = corrupt_member(
        tmp_path / "shards" / "shard-000001.tar", "000000006.image%2fobject%2fbbox%2fxmin.npy", b"\x00"
    )
    report = verify(tmp_path / "shards")  # the bytes differ from those packed: each member named
    assert any("member '000000003.meta.json' is not one that was packed" in line for line in report.problems)
    assert any("member '000000006.image%2fobject%2fbbox%2fxmin.npy' is not one" in line for line in report.problems)
    unchecked = without_hashes(tmp_path / "shards")  # an older pack: the values are still decoded as their kinds
    report = verify(tmp_path / "shards")
    assert not report.ok and report.bad_records == (3, 6) and report.checked == 8
    assert len(report.problems) == 3 and report.problems[0].startswith(unchecked)
    assert report.problems[1].startswith(f"{json_member}: field 'meta': not a valid json value")
    assert report.problems[2].startswith(f"{npy_member}: field 'image/object/bbox/xmin': not a valid array value")


def corrupt_member(shard: Path, name: str, first_byte: bytes) -> str:
    """Overwrite the first byte of member ``name`` in place; returns the sample as keys name it."""
    with tarfile.open(shard) as tar:
        offset = tar.getmember(name).offset_data
    with open(shard, "r+b") as file:
        file.seek(offset)
        file.write(first_byte)
    return f"{shard}:{name.split('.', 1)[0]}"


def test_members_the_manifest_does_not_record_are_found(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "images", count=3)
    pack(tmp_path / "images", tmp_path / "shards", format="tar", workers=0, progress=False)
    shard = tmp_path / "shards" / "shard-000000.tar"
    with tarfile.open(shard) as tar:
        members = [(info, tar.extractfile(info).read()) for info in tar.getmembers()]  # type: ignore[union-attr]
    with tarfile.open(shard, "w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data))
            if info.name == "000000001.cls":  # sample 1: one more member
                extra = tarfile.TarInfo("000000001.stray")
                extra.size = 2
                tar.addfile(extra, io.BytesIO(b"hi"))
    later = shard.stat().st_mtime_ns + 10**9  # the same size (tar pads to 10 KiB), maybe the same clock tick
    os.utime(shard, ns=(later, later))
    report = verify(tmp_path / "shards")
    assert (
        f"{shard}: member '000000001.stray' is not one that was packed (changed, renamed or added)" in report.problems
    )
    unchecked = without_hashes(tmp_path / "shards")  # an older pack: the extension is still found
    report = verify(tmp_path / "shards")
    assert report.problems[0].startswith(unchecked) and report.problems[1:] == (
        f"{tmp_path / 'shards'}: the shards hold '.stray' members, which the manifest does not record",
    )


class Captioned:
    """A folder source whose items carry a caption and a count (the even ones also a score)."""

    def __init__(self, root: Path) -> None:
        self.inner = FolderSource(root)

    def __len__(self) -> int:
        return len(self.inner)

    def read(self, index: int) -> bytes:
        return self.inner.read(index)

    def label(self, index: int) -> int:
        return self.inner.label(index)

    def key(self, index: int) -> str:
        return self.inner.key(index)

    def field_kinds(self) -> dict[str, str]:
        return {"caption": "text", "count": "int", "score": "float"}

    def read_field(self, index: int, name: str) -> object:
        if name == "score" and index % 2:
            raise MissingField(f"{self.key(index)}: no field 'score'")
        return {"caption": f"caption number {index} ✓", "count": index * 7, "score": index / 3}[name]


@pytest.fixture(scope="module")
def with_fields(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[str, int, bytes]]]:
    root = tmp_path_factory.mktemp("verify-fields")
    items = write_image_folder(root / "images", count=10)
    pack(Captioned(root / "images"), root / "fields.lmdb", workers=0, progress=False)
    return root / "fields.lmdb", items


def rewrite_record(clean: Path, tmp_path: Path, number: int, fields: list[tuple[int, bytes]]) -> Path:
    """A copy of the pack whose record ``number`` carries ``fields`` (a valid checksum: only decoding finds them)."""
    copy = tmp_path / "rewritten.lmdb"
    shutil.copytree(clean, copy)
    with lmdb.open(str(copy)) as env, env.begin(write=True) as txn:
        label, image = records.decode_record(txn.get(records.record_key(number)), "r")
        txn.put(records.record_key(number), records.encode_record(label, image, fields))
    return copy


def test_a_pack_with_fields_verifies_and_a_flipped_field_byte_is_found(with_fields, tmp_path: Path) -> None:
    path, items = with_fields
    report = verify(path)
    assert report.ok and report.checked == 10
    copy = corrupted_copy(path, tmp_path, "caption number 6 ✓".encode(), 3)
    report = verify(copy)
    assert report.bad_records == (6,) and report.problems == (
        f"{copy}[6] ({items[6][0]}): checksum mismatch: the record is corrupted",
    )


def test_a_field_that_does_not_decode_as_its_kind_is_named(with_fields, tmp_path: Path) -> None:
    path, items = with_fields
    copy = rewrite_record(path, tmp_path, 3, [(0, b"caf\xe9"), (1, b"12"), (2, b"one third")])
    report = verify(copy)
    assert report.bad_records == (3, 3) and len(report.problems) == 2
    assert report.problems[0].startswith(f"{copy}[3] ({items[3][0]}): field 'caption': not a valid text value")
    assert report.problems[1].startswith(f"{copy}[3] ({items[3][0]}): field 'score': not a valid float value")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ([(0, b"x"), (5, b"1")], "field number 5 is not one of the pack's 3 fields"),
        ([(1, b"12 apples")], "field 'count': not a valid int value"),
    ],
)
def test_fields_outside_the_schema_or_of_the_wrong_kind_are_found(with_fields, tmp_path, fields, message) -> None:
    path, items = with_fields
    report = verify(rewrite_record(path, tmp_path, 8, fields))
    assert report.bad_records == (8,) and message in report.problems[0] and items[8][0] in report.problems[0]


def test_a_field_table_that_does_not_describe_the_bytes_is_found(with_fields, tmp_path: Path) -> None:
    path, _ = with_fields
    copy = tmp_path / "table.lmdb"
    shutil.copytree(path, copy)
    with lmdb.open(str(copy)) as env, env.begin(write=True) as txn:
        label, image = records.decode_record(txn.get(records.record_key(2)), "r")
        value = records.encode_record(label, image, [(0, b"abc")])
        header, tail = value[: records.HEADER.size + len(image)], value[records.HEADER.size + len(image) :]
        broken = header[:20] + b"\x00" * 4 + header[24:] + tail[:-1]  # the last field byte cut off
        checked = bytearray(broken)
        checked[20:24] = records.record_checksum(broken).to_bytes(4, "little")
        txn.put(records.record_key(2), bytes(checked))
    report = verify(copy)
    assert report.bad_records == (2,)
    assert "the field table announces 3 bytes of fields, the record holds 2" in report.problems[0]


class VectorsAndRecords(FieldItems):
    """An array field and a JSON field (field numbers 0: meta, 1: vector, in name order)."""

    kinds = {"meta": "json", "vector": "array"}

    def values(self, index: int) -> dict[str, object]:
        return {"meta": {"i": index, "tags": [[index]]}, "vector": np.arange(index + 1, dtype=np.float32)}
