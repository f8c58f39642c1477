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
from fastloader.datasets.base import Source, decode_pil
from fastloader.datasets.tfrecord import TFRecordDataset, TFRecordSource
from fastloader.errors import FormatError
from fastloader.formats.protobuf import bytes_feature, encode_example, float_feature, int64_feature
from fastloader.formats.tfrecord import TFRecordWriter

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
        assert len(source._local.get()._open) <= 2


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
