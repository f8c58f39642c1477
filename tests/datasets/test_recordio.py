"""RecordIODataset over real images: plain, multi-label and InsightFace layouts, with and without .idx."""

from __future__ import annotations

import io
import os
import pickle
import random
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from fastloader.datasets.base import Source
from fastloader.datasets.recordio import RecordIODataset, RecordIOSource
from fastloader.errors import FormatError, MissingField
from fastloader.fields.source import FieldSource, read_fields
from fastloader.formats.recordio import RecordIOWriter, multi_label, pack, single_label
from fastloader.image.pil import decode_pil

MAGIC = struct.pack("<I", 0xCED7230A)


def encode(mode: str, fmt: str, seed: int, size: tuple[int, int] = (32, 32)) -> bytes:
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "L": 1, "CMYK": 4, "RGBA": 4}[mode]
    pixels = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    image = Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode)
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


KINDS = [("RGB", "JPEG"), ("L", "JPEG"), ("CMYK", "JPEG"), ("RGBA", "PNG"), ("RGB", "PNG")]


def images(n: int, size: tuple[int, int] = (32, 32)) -> list[bytes]:
    return [encode(*KINDS[i % len(KINDS)], seed=i, size=size) for i in range(n)]


def write_rec(path: Path, records: list[tuple[int, bytes]], idx: bool = True) -> tuple[str, str]:
    rec, idx_path = str(path.with_suffix(".rec")), str(path.with_suffix(".idx"))
    with RecordIOWriter(rec, idx_path if idx else None) as writer:
        for key, payload in records:
            writer.write(key, payload)
    return rec, idx_path


def test_single_label_round_trip_random_order(tmp_path: Path) -> None:
    data = images(40)
    data[5] = data[5][:32] + MAGIC + data[5][32:]  # payload offset 24 + 32: aligned, so the record is split
    rec, _ = write_rec(tmp_path / "train", [(k, pack(single_label(k % 7, k), data[k])) for k in range(40)])
    assert Path(rec).read_bytes().count(MAGIC) == 41  # record 5 is two parts; the planted magic is cut out
    source = RecordIOSource(rec)  # finds train.idx beside train.rec
    assert source.idx_path == str(tmp_path / "train.idx")
    assert isinstance(source, Source)
    assert (len(source), source.layout) == (40, "plain")
    order = list(range(40))
    random.Random(1).shuffle(order)
    for i in order:
        assert source.read(i) == data[i]
        assert source.label(i) == i % 7
        assert source.key(i) == f"{rec}#{i}"
    assert source.labels_of(3).tolist() == [3.0]
    assert source.read(-1) == data[39]
    with pytest.raises(IndexError):
        source.read(40)

    dataset = RecordIODataset(rec, transform=lambda image: image.size)
    assert dataset[6] == ((32, 32), 6)
    assert dataset.source.header(5).id == 5


def test_items_follow_idx_line_order_and_label_reads_only_the_header(tmp_path: Path) -> None:
    keys = [9, 2, 7, 4]
    data = images(4)
    rec, _ = write_rec(tmp_path / "odd", [(k, pack(single_label(k, k), d)) for k, d in zip(keys, data)])
    source = RecordIOSource(rec)
    assert [source.key(i).rsplit("#", 1)[1] for i in range(4)] == ["9", "2", "7", "4"]
    assert [source.label(i) for i in (3, 0, 2, 1)] == [4, 9, 7, 2]  # no read() first
    assert [source.read(i) for i in range(4)] == data


def test_multi_label_records(tmp_path: Path) -> None:
    data = images(6)
    labels = [np.array([i, 0.5, -i], dtype=np.float32) for i in range(6)]
    rec, _ = write_rec(tmp_path / "multi", [(i, pack(multi_label(labels[i], i), data[i])) for i in range(6)])
    source = RecordIOSource(rec)
    for i in (4, 0, 5):
        assert source.read(i) == data[i]
        np.testing.assert_array_equal(source.labels_of(i), labels[i])
        assert source.labels_of(i).dtype == np.float32
    assert source.label(2) == -1  # no single class: what a pack stores, the labels going in the field
    assert isinstance(source, FieldSource) and source.field_kinds() == {"labels": "array"}
    for i in (3, 3, 1):
        value = source.read_field(i, "labels")
        assert value.dtype == np.float32 and value.tobytes() == labels[i].tobytes()
    with pytest.raises(MissingField, match=r"multi\.rec#2: no field 'id'"):
        source.read_field(2, "id")
    image, target = RecordIODataset(rec)[1]
    assert image.mode == "RGB"
    np.testing.assert_array_equal(target, labels[1])
    (vector,) = RecordIODataset(rec, fields=("labels",))[4]
    assert vector.tobytes() == labels[4].tobytes()


def test_a_single_label_file_has_no_fields(tmp_path: Path) -> None:
    rec, _ = write_rec(tmp_path / "one", [(k, pack(single_label(k, k), b"img")) for k in range(200)])
    source = RecordIOSource(rec)
    assert source.field_kinds() == {} and read_fields(source, 5) == {}
    with pytest.raises(MissingField, match=r"one\.rec#7: no field 'labels' \(a single-label record\)"):
        source.read_field(7, "labels")


def write_insightface(path: Path, data: list[bytes], identities: int, idx: bool) -> str:
    """InsightFace's train.rec: record 0 holds [first identity key, end], then the images under keys
    1..n, then one record per identity with its image key range; only the images carry an image."""
    n = len(data)
    header0 = (0, pack(multi_label([n + 1, n + 1 + identities], 0), b""))
    faces = [(k, pack(single_label(k % identities, k), data[k - 1])) for k in range(1, n + 1)]
    faces[1] = (2, pack(multi_label([1, 0.25], 2), data[1]))  # a label stored first of several
    ids = [(n + 1 + j, pack(multi_label([j + 1, j + 2], n + 1 + j), b"")) for j in range(identities)]
    # With an .idx the file order does not matter (keys do); without one keys are file positions.
    records = faces[3:] + [header0] + ids + faces[:3] if idx else [header0] + faces + ids
    return write_rec(path, records, idx)[0]


@pytest.mark.parametrize("with_idx", [True, False])
def test_insightface_layout(tmp_path: Path, with_idx: bool) -> None:
    data = images(8)
    rec = write_insightface(tmp_path / "faces", data, identities=3, idx=with_idx)
    source = RecordIOSource(rec)
    assert source.idx_path == (str(tmp_path / "faces.idx") if with_idx else None)
    assert (len(source), source.layout) == (8, "insightface")
    assert [source.key(i).rsplit("#", 1)[1] for i in range(8)] == [str(k) for k in range(1, 9)]
    assert [source.read(i) for i in range(8)] == data
    expected = [k % 3 for k in range(1, 9)]
    expected[1] = 1
    assert [source.label(i) for i in range(8)] == expected
    assert [RecordIODataset(rec)[i][1] for i in range(8)] == expected
    assert source.field_kinds() == {"labels": "array"}  # item 1 holds two labels: the first is its class
    assert source.read_field(1, "labels").tolist() == [1.0, 0.25] and source.read_field(1, "labels").dtype == np.float32
    assert [sorted(read_fields(source, i)) for i in range(3)] == [[], ["labels"], []]


def test_insightface_repeated_key_reads_the_last_record_as_mxnet_does(tmp_path: Path) -> None:
    header0 = (0, pack(multi_label([3, 3], 0), b""))
    records = [header0, (1, pack(single_label(0, 1), b"old")), (2, pack(single_label(0, 2), b"two"))]
    rec, _ = write_rec(tmp_path / "again", [*records, (1, pack(single_label(5, 1), b"new"))])
    source = RecordIOSource(rec)
    assert [(source.read(i), source.label(i)) for i in range(2)] == [(b"new", 5), (b"two", 0)]


def test_insightface_header_announcing_missing_images(tmp_path: Path) -> None:
    records = [(0, pack(multi_label([5, 6], 0), b""))] + [(k, pack(single_label(0, k), b"img")) for k in (1, 2, 4, 5)]
    rec, idx = write_rec(tmp_path / "holes", records)
    with pytest.raises(FormatError, match=r"holes\.idx: InsightFace header announces images 1\.\.4 but key 3"):
        RecordIOSource(rec)
    records[0] = (0, pack(multi_label([1e18, 6], 0), b""))  # must fail before allocating a range of 1e18
    rec, idx = write_rec(tmp_path / "holes", records)
    with pytest.raises(
        FormatError, match=r"holes\.idx: InsightFace header record 0 announces 1e\+18 images, but there are 5 records"
    ):
        RecordIOSource(rec)


def test_rec_without_idx_is_scanned_once(tmp_path: Path) -> None:
    data = images(12)
    rec, idx = write_rec(tmp_path / "noidx", [(k, pack(single_label(k, k), data[k])) for k in range(12)], idx=False)
    assert not os.path.exists(idx)
    source = RecordIOSource(rec)
    assert source.idx_path is None
    index_file = Path(rec + ".flindex")
    assert index_file.exists()
    built = index_file.stat().st_ino
    assert [source.read(i) for i in (11, 0, 6)] == [data[11], data[0], data[6]]
    assert RecordIOSource(rec).label(4) == 4
    assert index_file.stat().st_ino == built  # loaded, not rebuilt

    write_rec(tmp_path / "noidx", [(k, pack(single_label(k, k), data[k])) for k in range(5)], idx=False)
    assert len(RecordIOSource(rec)) == 5  # the .rec changed: rebuilt


def test_explicit_idx_path(tmp_path: Path) -> None:
    data = images(3)
    rec = str(tmp_path / "a.rec")
    with RecordIOWriter(rec, tmp_path / "other-name.idx") as writer:
        for k in range(3):
            writer.write(10 + k, pack(single_label(k, k), data[k]))
    source = RecordIOSource(rec, tmp_path / "other-name.idx")
    assert source.key(0) == f"{rec}#10"
    assert source.read(2) == data[2]


# -- malformed files ------------------------------------------------------------------------------


def test_idx_offset_past_end_of_rec(tmp_path: Path) -> None:
    rec, idx = write_rec(tmp_path / "short", [(k, pack(single_label(k, k), b"x" * 10)) for k in range(3)])
    Path(idx).write_text(Path(idx).read_text() + "3\t99999\n")
    with pytest.raises(FormatError, match=r"short\.idx: line 4: offset 99999 is outside .*short\.rec"):
        RecordIOSource(rec)


def test_corrupt_record_names_file_and_offset(tmp_path: Path) -> None:
    data = images(3)
    rec, idx = write_rec(tmp_path / "bad", [(k, pack(single_label(k, k), data[k])) for k in range(3)])
    offset = int(Path(idx).read_text().splitlines()[1].split("\t")[1])
    raw = bytearray(Path(rec).read_bytes())
    raw[offset] ^= 0xFF  # the magic of record 1
    Path(rec).write_bytes(bytes(raw))
    source = RecordIOSource(rec)
    assert source.read(0) == data[0]
    with pytest.raises(FormatError, match=rf"bad\.rec: bad RecordIO magic .* at offset {offset}"):
        source.read(1)
    with pytest.raises(FormatError, match=rf"bad\.rec: bad RecordIO magic .* at offset {offset}"):
        source.label(1)
    Path(idx).unlink()
    with pytest.raises(FormatError, match=rf"bad\.rec: bad RecordIO magic .* at offset {offset}"):
        RecordIOSource(rec)  # the scan stops at the broken record


def test_record_too_short_for_a_header(tmp_path: Path) -> None:
    rec, _ = write_rec(tmp_path / "tiny", [(0, b"0123456789")])
    with pytest.raises(FormatError, match=r"tiny\.rec: record 0 \(offset 0\): record of 10 bytes is shorter"):
        RecordIOSource(rec).read(0)


def test_non_integer_label_is_an_error(tmp_path: Path) -> None:
    rec, _ = write_rec(tmp_path / "reg", [(0, pack(single_label(0.37, 0), b"img"))])
    with pytest.raises(ValueError, match=r"reg\.rec#0: label 0\.37\d* is not a class index"):
        RecordIOSource(rec).label(0)


# -- processes ------------------------------------------------------------------------------------


def test_pickled_source_is_small_and_reads_in_the_new_process(tmp_path: Path) -> None:
    rec, _ = write_rec(tmp_path / "big", [(k, pack(single_label(k % 10, k), b"jpeg")) for k in range(5000)])
    source = RecordIOSource(rec)
    assert source.read(4321) == b"jpeg"  # opens the file and maps the index in this process
    blob = pickle.dumps(source)
    assert len(blob) < 2000  # the 5000-record index (120 KB of arrays) stays on disk
    clone = pickle.loads(blob)
    assert (len(clone), clone.label(4321), clone.read(17)) == (5000, 1, b"jpeg")


def to_tensor(image: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(image).copy())


def test_dataloader_with_two_workers(tmp_path: Path) -> None:
    data = images(24)
    rec, _ = write_rec(tmp_path / "dl", [(k, pack(single_label(k % 5, k), data[k])) for k in range(24)])
    dataset = RecordIODataset(rec, transform=to_tensor)
    dataset.source.read(0)  # the parent's open file must not be shared with the workers
    loader = DataLoader(dataset, batch_size=4, num_workers=2, shuffle=False)
    batches = list(loader)
    labels = torch.cat([label for _, label in batches]).tolist()
    assert labels == [k % 5 for k in range(24)]
    pixels = torch.cat([images for images, _ in batches])
    for k in (0, 2, 3, 23):  # RGB, CMYK and RGBA decode to the same RGB as in this process
        assert torch.equal(pixels[k], to_tensor(decode_pil(data[k])))
