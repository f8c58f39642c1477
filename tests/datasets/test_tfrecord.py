"""TFRecordDataset over real images in several shards: order, labels, indexes, errors, workers."""

from __future__ import annotations

import io
import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

import fastloader.datasets.tfrecord as tfrecord_dataset
from fastloader.datasets.base import Source
from fastloader.datasets.tfrecord import TFRecordDataset, TFRecordSource
from fastloader.errors import FormatError, MissingField
from fastloader.fields.source import FieldSource, read_fields
from fastloader.formats.protobuf import Feature, bytes_feature, encode_example, float_feature, int64_feature
from fastloader.formats.tfrecord import TFRecordWriter
from fastloader.image.pil import decode_pil

KINDS = [("RGB", "JPEG"), ("L", "JPEG"), ("CMYK", "JPEG"), ("RGBA", "PNG"), ("P", "PNG")]


def encode(mode: str, fmt: str, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (32, 32, 4), dtype=np.uint8)
    image = Image.fromarray(pixels, "RGBA")
    image = image.convert(mode) if mode != "P" else image.convert("RGB").convert("P")  # no transparency
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


def images(n: int) -> list[bytes]:
    return [encode(*KINDS[i % len(KINDS)], seed=i) for i in range(n)]


def imagenet_example(image: bytes, label: int) -> bytes:
    """Features as TensorFlow's ImageNet conversion writes them (a few extra ones around ours)."""
    return encode_example(
        {
            "image/height": int64_feature(32),
            "image/colorspace": bytes_feature(b"RGB"),
            "image/class/label": int64_feature(label),
            "image/class/synset": bytes_feature(b"n01440764"),
            "image/object/bbox/xmin": float_feature(0.1, 0.2),
            "image/encoded": bytes_feature(image),
        }
    )


def write_shard(path: Path, examples: list[bytes]) -> None:
    with TFRecordWriter(path) as writer:
        for example in examples:
            writer.write(example)


def write_shards(tmp_path: Path, data: list[bytes], sizes: list[int]) -> list[Path]:
    paths, start = [], 0
    for number, size in enumerate(sizes):
        path = tmp_path / f"train-{number:05d}-of-{len(sizes):05d}.tfrecord"
        write_shard(path, [imagenet_example(data[i], 1 + i % 10) for i in range(start, start + size)])
        paths.append(path)
        start += size
    return paths


def test_shards_read_back_byte_exact_in_random_order(tmp_path: Path) -> None:
    data = images(30)
    paths = write_shards(tmp_path, data, [12, 0, 7, 11])  # an empty shard in the middle
    source = TFRecordSource(str(tmp_path / "train-{00000..00003}-of-00004.tfrecord"))
    assert source.paths == [str(p) for p in paths]
    assert isinstance(source, Source)
    assert (len(source), source.starts.tolist()) == (30, [0, 12, 12, 19, 30])
    assert [source.locate(i) for i in (0, 11, 12, 18, 19, 29, -1)] == [
        (0, 0),
        (0, 11),
        (2, 0),
        (2, 6),
        (3, 0),
        (3, 10),
        (3, 10),
    ]
    order = list(range(30))
    random.Random(5).shuffle(order)
    for i in order:
        assert source.read(i) == data[i]
        assert source.label(i) == 1 + i % 10
    assert [source.label(i) for i in (29, 0, 13)] == [10, 1, 4]  # without read() first
    assert source.key(13) == f"{paths[2]}#1"
    with pytest.raises(IndexError):
        source.read(30)
    assert len(TFRecordSource(str(tmp_path / "train-*.tfrecord"))) == 30


def test_dataset_items_and_custom_feature_names(tmp_path: Path) -> None:
    data = images(5)
    path = tmp_path / "custom.tfrecord"
    write_shard(path, [encode_example({"jpg": bytes_feature(d), "cls": int64_feature(-i)}) for i, d in enumerate(data)])
    dataset = TFRecordDataset(path, transform=lambda image: (image.mode, image.size), image_key="jpg", label_key="cls")
    assert [dataset[i] for i in range(5)] == [(("RGB", (32, 32)), -i) for i in range(5)]
    with pytest.raises(FormatError, match=r"custom\.tfrecord: record 0 \(offset 0\): no feature 'image/encoded'"):
        TFRecordDataset(path)[0]


def test_index_sidecars_built_once_and_explicit_index_paths(tmp_path: Path) -> None:
    paths = write_shards(tmp_path, images(6), [4, 2])
    TFRecordSource([str(p) for p in paths])
    sidecars = [Path(f"{p}.flindex") for p in paths]
    inodes = [s.stat().st_ino for s in sidecars]
    TFRecordSource([str(p) for p in paths])
    assert [s.stat().st_ino for s in sidecars] == inodes  # reused

    elsewhere = [tmp_path / "indexes" / f"{p.name}.idx" for p in paths]
    assert TFRecordSource([str(p) for p in paths], index_paths=elsewhere).read(5) == images(6)[5]
    assert all(p.exists() for p in elsewhere)
    with pytest.raises(ValueError, match="index_paths: 1 paths given for 2 TFRecord files"):
        TFRecordSource([str(p) for p in paths], index_paths=elsewhere[:1])


def test_missing_or_mistyped_features_name_file_and_record(tmp_path: Path) -> None:
    path = tmp_path / "odd.tfrecord"
    good = imagenet_example(images(1)[0], 3)
    no_label = encode_example({"image/encoded": bytes_feature(b"img"), "other": int64_feature(1)})
    float_label = encode_example({"image/encoded": bytes_feature(b"img"), "image/class/label": float_feature(3.0)})
    write_shard(path, [good, no_label, float_label, b"not an Example at all"])
    source = TFRecordSource(path)
    assert source.label(0) == 3
    offset1 = len(good) + 16
    with pytest.raises(
        FormatError, match=rf"odd\.tfrecord: record 1 \(offset {offset1}\): no feature 'image/class/label'.*'other'"
    ):
        source.read(1)
    with pytest.raises(FormatError, match=r"odd\.tfrecord: record 2 .*'image/class/label' holds 1 float values"):
        source.label(2)
    with pytest.raises(FormatError, match=r"odd\.tfrecord: record 3 .*not a tf\.train\.Example"):
        source.read(3)


def test_corrupt_shard_is_reported_on_read(tmp_path: Path) -> None:
    data = images(3)
    paths = write_shards(tmp_path, data, [3])
    source = TFRecordSource(str(paths[0]))
    raw = bytearray(paths[0].read_bytes())
    raw[len(raw) - 100] ^= 0x01  # inside the last record's data; size and mtime kept: the index stays
    stat = paths[0].stat()
    paths[0].write_bytes(bytes(raw))
    os.utime(paths[0], ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert source.read(0) == data[0]
    with pytest.raises(FormatError, match=r"train-00000-of-00001\.tfrecord: data CRC mismatch in the record at"):
        source.read(2)


def test_open_shards_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tfrecord_dataset, "_MAX_OPEN_SHARDS", 2)
    data = images(10)
    write_shards(tmp_path, data, [2] * 5)
    source = TFRecordSource(str(tmp_path / "train-*.tfrecord"))
    for i in [0, 9, 4, 2, 7, 1, 8, 5, 3, 6, 0]:
        assert source.read(i) == data[i]
        assert len(source._local.get().open) <= 2


# -- processes ------------------------------------------------------------------------------------


def test_pickled_source_is_small_and_reads_in_the_new_process(tmp_path: Path) -> None:
    path = tmp_path / "many.tfrecord"
    example = encode_example({"image/encoded": bytes_feature(b"jpeg"), "image/class/label": int64_feature(7)})
    write_shard(path, [example] * 5000)
    source = TFRecordSource(path)
    assert source.read(4999) == b"jpeg"
    blob = pickle.dumps(source)
    assert len(blob) < 2000  # the 5000-record index (80 KB of arrays) stays on disk
    clone = pickle.loads(blob)
    assert (len(clone), clone.label(1234), clone.read(3)) == (5000, 7, b"jpeg")


def to_tensor(image: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(image).copy())


def negate(label: int) -> int:
    return -label


def test_dataloader_with_two_workers(tmp_path: Path) -> None:
    data = images(20)
    write_shards(tmp_path, data, [6, 6, 8])
    dataset = TFRecordDataset(str(tmp_path / "train-*.tfrecord"), transform=to_tensor, target_transform=negate)
    assert dataset[0][1] == -1
    loader = DataLoader(dataset, batch_size=5, num_workers=2, shuffle=False)
    batches = list(loader)
    assert torch.cat([labels for _, labels in batches]).tolist() == [-(1 + i % 10) for i in range(20)]
    pixels = torch.cat([images for images, _ in batches])
    for i in (0, 1, 2, 3, 4, 19):  # RGB, grayscale, CMYK, RGBA and palette images, decoded to RGB
        assert torch.equal(pixels[i], to_tensor(decode_pil(data[i])))


# -- fields ---------------------------------------------------------------------------------------


def test_the_other_features_are_fields_of_the_kinds_the_first_record_gives(tmp_path: Path) -> None:
    data = images(3)
    path = tmp_path / "fields.tfrecord"
    write_shard(path, [imagenet_example(d, i + 1) for i, d in enumerate(data)])
    source = TFRecordSource(path)
    assert isinstance(source, FieldSource)
    assert source.field_kinds() == {
        "image/class/synset": "bytes",
        "image/colorspace": "bytes",
        "image/height": "array",
        "image/object/bbox/xmin": "array",
    }
    assert source.field_aliases() == {"image/encoded": "image", "image/class/label": "label"}
    reads = []
    original = source._record
    source._record = lambda index, shards: reads.append(index) or original(index, shards)  # type: ignore[method-assign]
    assert source.read(2) == data[2] and source.label(2) == 3
    assert source.read_field(2, "image/class/synset") == b"n01440764"
    height = source.read_field(2, "image/height")
    assert height.dtype == np.int64 and height.tolist() == [32]
    xmin = source.read_field(2, "image/object/bbox/xmin")
    assert xmin.dtype == np.float32 and xmin.tolist() == [np.float32(0.1), np.float32(0.2)]
    assert reads == [2], "the image, the label and every field of one item: one read"
    assert source.read_field(0, "image/colorspace") == b"RGB" and reads == [2, 0]
    assert read_fields(source, 1)["image/class/synset"] == b"n01440764"


def test_fields_missing_empty_or_of_several_values_name_the_record_and_feature(tmp_path: Path) -> None:
    path = tmp_path / "odd.tfrecord"
    first = {
        "image/encoded": bytes_feature(b"img"),
        "image/class/label": int64_feature(1),
        "caption": bytes_feature(b"a cat"),
        "boxes": float_feature(0.5, 0.25),
    }
    others = [
        {**first, "caption": bytes_feature(b"one", b"two"), "boxes": float_feature()},  # empty list: no boxes
        {k: v for k, v in first.items() if k != "caption"},
        {**first, "caption": bytes_feature(), "boxes": int64_feature(3)},
        {**first, "caption": Feature("empty", ()), "boxes": bytes_feature(b"x")},
    ]
    write_shard(path, [encode_example(f) for f in [first, *others]])
    source = TFRecordSource(path)
    assert source.field_kinds() == {"boxes": "array", "caption": "bytes"}
    with pytest.raises(FormatError, match=r"odd\.tfrecord#1: field 'caption': holds 2 bytes values, a bytes field"):
        source.read_field(1, "caption")
    assert source.read_field(1, "boxes").shape == (0,) and source.read_field(1, "boxes").dtype == np.float32
    with pytest.raises(MissingField, match=r"odd\.tfrecord#2: field 'caption': the record has no such feature"):
        source.read_field(2, "caption")
    with pytest.raises(MissingField, match=r"odd\.tfrecord#3: field 'caption': the bytes list is empty"):
        source.read_field(3, "caption")
    assert source.read_field(3, "boxes").tolist() == [3] and source.read_field(3, "boxes").dtype == np.int64
    with pytest.raises(MissingField, match=r"odd\.tfrecord#4: field 'caption'"):
        source.read_field(4, "caption")
    with pytest.raises(FormatError, match=r"odd\.tfrecord#4: field 'boxes': holds a bytes list, not numbers"):
        source.read_field(4, "boxes")
    with pytest.raises(MissingField, match=r"odd\.tfrecord#0: no field 'image/encoded'"):
        source.read_field(0, "image/encoded")
    assert read_fields(source, 2) == {"boxes": pytest.approx(np.array([0.5, 0.25]))}


def test_fields_named_with_their_kinds(tmp_path: Path) -> None:
    path = tmp_path / "named.tfrecord"
    example = {
        "image/encoded": bytes_feature(b"img"),
        "image/class/label": int64_feature(1),
        "caption": bytes_feature("ünïcode ✓".encode()),
        "objects": bytes_feature(b"cat", "dög".encode()),
        "height": int64_feature(480),
        "score": float_feature(0.5),
        "ids": int64_feature(-(2**63), 2**63 - 1),
    }
    write_shard(path, [encode_example(example)])
    kinds = {"caption": "text", "objects": "json", "height": "int", "score": "float", "ids": "array", "x": "bytes"}
    source = TFRecordSource(path, field_kinds=kinds)
    assert source.field_kinds() == kinds
    assert read_fields(source, 0) == {
        "caption": "ünïcode ✓",
        "objects": ["cat", "dög"],
        "height": 480,
        "score": 0.5,
        "ids": pytest.approx(np.array([-(2**63), 2**63 - 1])),
    }
    assert source.read_field(0, "ids").tolist() == [-(2**63), 2**63 - 1]
    with pytest.raises(MissingField, match="named.tfrecord#0: field 'x': the record has no such feature"):
        source.read_field(0, "x")
    wrong = TFRecordSource(path, field_kinds={"caption": "int", "objects": "text"})
    with pytest.raises(FormatError, match="field 'caption': holds a bytes list, a int field is read from a int64"):
        wrong.read_field(0, "caption")
    with pytest.raises(FormatError, match="field 'objects': holds 2 bytes values, a text field is one"):
        wrong.read_field(0, "objects")
    with pytest.raises(ValueError, match="kind must be one of"):
        TFRecordSource(path, field_kinds={"caption": "str"})
    with pytest.raises(ValueError, match=r"\['image/encoded'\] are the image or label, not fields"):
        TFRecordSource(path, field_kinds={"image/encoded": "bytes"})


def test_examples_without_a_label(tmp_path: Path) -> None:
    data = images(2)
    path = tmp_path / "pairs.tfrecord"
    write_shard(
        path, [encode_example({"jpg": bytes_feature(d), "txt": bytes_feature(b"x%d" % i)}) for i, d in enumerate(data)]
    )
    source = TFRecordSource(path, image_key="jpg", label_key=None)
    assert [source.read(1), source.label(1), source.label(0)] == [data[1], -1, -1]
    assert source.field_kinds() == {"txt": "bytes"} and source.field_aliases() == {"jpg": "image"}
    assert [source.read_field(i, "txt") for i in range(2)] == [b"x0", b"x1"]
    dataset = TFRecordDataset(path, image_key="jpg", label_key=None, fields={"caption": "txt", "y": "label"})
    assert dataset[1] == {"caption": b"x1", "y": -1}
    assert TFRecordDataset(path, image_key="jpg", label_key=None, transform=lambda image: image.size)[0] == (
        (32, 32),
        -1,
    )
