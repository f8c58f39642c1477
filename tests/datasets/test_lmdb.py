"""LMDBDataset / LMDBSource over real packs: worker processes, fork, pickling, and clear refusals."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import lmdb
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from fastloader import transforms as T
from fastloader.datasets.base import ImageDataset
from fastloader.datasets.lmdb import LMDBDataset, LMDBSource
from fastloader.errors import FormatError
from fastloader.formats import lmdb_records as records
from fastloader.pack import pack
from tests.images import write_image_folder


def digest(data: bytes, key: str) -> str:
    """A loader that returns the image bytes' hash: what a worker read, comparable to the source."""
    return hashlib.sha1(data).hexdigest()


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[str, int, bytes]]]:
    root = tmp_path_factory.mktemp("lmdb")
    items = write_image_folder(root / "images", count=48)
    pack(root / "images", root / "train.lmdb", workers=0, progress=False)
    return root / "train.lmdb", items


def test_dataset_yields_rgb_images_labels_and_classes(packed) -> None:
    path, items = packed
    dataset = LMDBDataset(path, transform=lambda image: (image.mode, image.size), target_transform=lambda y: y * 10)
    assert len(dataset) == 48 and dataset.classes == ["class_0", "class_1", "class_2"]
    assert dataset.class_to_idx == {"class_0": 0, "class_1": 1, "class_2": 2}
    for index in (0, 5, -1):  # CMYK, grayscale, palette and RGBA images all arrive as RGB
        mode, _ = dataset[index][0]
        assert mode == "RGB" and dataset[index][1] == items[index][1] * 10
    with pytest.raises(IndexError):
        dataset[48]


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes:UserWarning")
def test_four_workers_three_epochs_read_every_record_once_per_epoch(packed) -> None:
    path, items = packed
    dataset = LMDBDataset(path, decode=digest)
    assert dataset[0][0] == hashlib.sha1(items[0][2]).hexdigest()  # opened here before workers fork
    expected = Counter((hashlib.sha1(data).hexdigest(), label) for _, label, data in items)
    loader = DataLoader(dataset, batch_size=5, shuffle=True, num_workers=4, collate_fn=list)
    for _ in range(3):
        seen = Counter((image, label) for batch in loader for image, label in batch)
        assert seen == expected
    assert dataset[1][0] == hashlib.sha1(items[1][2]).hexdigest()  # the main process still reads


def test_two_datasets_on_one_pack_share_the_environment(packed) -> None:
    path, items = packed
    first, second = LMDBSource(path), LMDBSource(str(path))
    assert first.read(3) == second.read(3) == items[3][2]
    assert second.labels().tolist() == [label for _, label, _ in items]


def test_a_pickled_source_reopens_lazily(packed) -> None:
    path, items = packed
    source = LMDBSource(path)
    source.read(0)
    clone = pickle.loads(pickle.dumps(source))
    assert clone.read(7) == items[7][2] and clone.label(7) == items[7][1] and clone.source_key(7) == items[7][0]


def test_a_single_file_lmdb_opens_from_its_path(packed, tmp_path: Path) -> None:
    path, items = packed
    shutil.copy(path / "data.mdb", tmp_path / "train.mdb")
    source = LMDBSource(tmp_path / "train.mdb")
    assert len(source) == 48 and source.read(10) == items[10][2]


def test_checksums_on_read_are_optional(packed, tmp_path: Path) -> None:
    path, items = packed
    copy = tmp_path / "copy.lmdb"
    shutil.copytree(path, copy)
    blob = bytearray((copy / "data.mdb").read_bytes())
    at = blob.find(items[4][2][-60:-20])
    blob[at + 5] ^= 0xFF
    (copy / "data.mdb").write_bytes(blob)
    assert LMDBSource(copy).read(4) != items[4][2]  # default: no checksum, no cost
    with pytest.raises(FormatError, match=r"copy\.lmdb\[4\]: checksum mismatch"):
        LMDBSource(copy, verify_checksums=True).read(4)


def _lmdb_with(path: Path, entries: dict[bytes, bytes]) -> Path:
    with lmdb.open(str(path)) as env, env.begin(write=True) as txn:
        for key, value in entries.items():
            txn.put(key, value)
    return path


def test_foreign_incomplete_and_newer_packs_are_refused_naming_the_path(packed, tmp_path: Path) -> None:
    foreign = _lmdb_with(tmp_path / "caffe.lmdb", {b"00000001": b"\x08\x03datum"})
    with pytest.raises(FormatError, match=r"caffe\.lmdb: not a fastloader LMDB \(no metadata record\)"):
        LMDBDataset(foreign)
    progress = records.PackProgress({}, next_position=3, count=3).to_json()
    incomplete = _lmdb_with(tmp_path / "half.lmdb", {records.PROGRESS_KEY: progress})
    with pytest.raises(FormatError, match=r"half\.lmdb: incomplete pack: run the same `fastloader pack` command"):
        LMDBDataset(incomplete)
    meta = json.loads(records.LMDBMeta(0, None, {}, 0, "fastloader 9").to_json())
    newer = _lmdb_with(tmp_path / "new.lmdb", {records.META_KEY: json.dumps({**meta, "version": 3}).encode()})
    with pytest.raises(FormatError, match=r"new\.lmdb: written by a newer fastloader \(format version 3"):
        LMDBDataset(newer)
    (tmp_path / "plain").mkdir()
    with pytest.raises(FormatError, match="plain: not an LMDB"):
        LMDBDataset(tmp_path / "plain")
    (tmp_path / "junk.mdb").write_bytes(b"\x00" * 10000)
    with pytest.raises(FormatError, match=r"junk\.mdb: not a readable LMDB"):
        LMDBDataset(tmp_path / "junk.mdb")
    with pytest.raises(FileNotFoundError, match="missing.lmdb"):
        LMDBDataset(tmp_path / "missing.lmdb")


def test_batches_of_tensors_through_torchvision_style_transform(packed) -> None:
    path, items = packed

    def to_tensor(image) -> torch.Tensor:
        return torch.from_numpy(np.array(image.resize((16, 16)))).permute(2, 0, 1)

    loader = DataLoader(LMDBDataset(path, transform=to_tensor), batch_size=16, num_workers=0)
    images, labels = next(iter(loader))
    assert images.shape == (16, 3, 16, 16) and images.dtype == torch.uint8
    assert labels.tolist() == [label for _, label, _ in items[:16]]


class Captions(torch.utils.data.Dataset):
    """Item i: record i's image digest and its fields, read by a worker from a pickled source."""

    def __init__(self, source: LMDBSource) -> None:
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> tuple[str, str, str]:
        image = hashlib.sha1(self.source.read(index)).hexdigest()
        return image, self.source.read_field(index, "caption"), self.source.read_field(index, "source")


def test_workers_read_the_fields_of_a_pack(tmp_path: Path) -> None:
    items = write_image_folder(tmp_path / "images", count=12)
    lines = [f'{key},{label},"caption of {key}, ✓",web' for key, label, _ in items]
    (tmp_path / "images" / "list.csv").write_text("path,label,caption,source\n" + "\n".join(lines) + "\n")
    pack(tmp_path / "images" / "list.csv", tmp_path / "captions.lmdb", workers=0, progress=False)
    source = LMDBSource(tmp_path / "captions.lmdb")
    assert source.read_field(5, "caption") == f"caption of {items[5][0]}, ✓"
    assert b"caption of" not in pickle.dumps(source)  # the record read last stays in this process
    loader = DataLoader(Captions(source), batch_size=4, num_workers=2, collate_fn=list)
    got = [item for batch in loader for item in batch]
    assert got == [(hashlib.sha1(data).hexdigest(), f"caption of {key}, ✓", "web") for key, _, data in items]


def test_a_packed_detection_dataset_gives_the_samples_its_source_gives(tmp_path: Path) -> None:
    from fastloader import transforms as T
    from fastloader.fields.specs import Boxes, Mask
    from tests.fields.scenes import SceneSource

    pack(SceneSource(8), tmp_path / "scenes.lmdb", workers=0, progress=False)
    boxes = Boxes("json", path="annotations.*.bbox", format="xywh", labels="annotations.*.category_id")
    spec = {"image": "image", "mask": Mask("seg.png"), "target": boxes, "caption": "txt", "label": "label"}
    fused = T.Compose([T.Resize(40), T.CenterCrop(32)])
    packed = LMDBDataset(tmp_path / "scenes.lmdb", transform=fused, fields=spec)
    original = ImageDataset(SceneSource(8), transform=fused, fields=spec)
    for index in (0, 5):
        got, expected = packed[index], original[index]
        assert sorted(got) == sorted(expected) == ["caption", "image", "label", "mask", "target"]
        assert torch.equal(got["image"], expected["image"]) and torch.equal(got["mask"], expected["mask"])
        assert got["caption"] == expected["caption"] and got["label"] == expected["label"]
        assert sorted(got["target"]) == ["boxes", "labels"] and len(got["target"]["boxes"]) > 0
        for name in ("boxes", "labels"):
            assert torch.equal(got["target"][name], expected["target"][name])


def test_a_record_rewritten_after_the_decoded_cache_was_filled_is_served_new(packed, tmp_path: Path) -> None:
    """A record the cache's fingerprint does not sample is rewritten in the pack with another image after the
    cache was filled: its record header (length, CRC32C) changed, so the next epoch decodes it, not the old."""
    path, items = packed
    copy = tmp_path / "copy.lmdb"
    shutil.copytree(path, copy)
    transform = T.Compose([T.Resize(40), T.CenterCrop(32)])
    dataset = LMDBDataset(copy, transform=transform)
    dataset.set_cache(tmp_path / "eval.cache")
    everything = list(range(len(dataset)))
    before = dataset.__getitems__(everything).images
    sampled = {int(i) for i in np.linspace(0, len(dataset) - 1, num=16)}
    edited = next(index for index in everything if index not in sampled)
    value = records.encode_record(items[edited][1], items[0][2])
    script = f"import lmdb\nwith lmdb.open({str(copy)!r}) as env, env.begin(write=True) as txn:\n"
    script += f"    txn.put({records.record_key(edited)!r}, {value!r})\n"
    subprocess.run([sys.executable, "-c", script], check=True)  # another process: as a re-pack would
    after = dataset.__getitems__(everything).images
    assert torch.equal(after[edited], before[0]) and not torch.equal(after[edited], before[edited])
    assert torch.equal(after, LMDBDataset(copy, transform=transform).__getitems__(everything).images)
    assert torch.equal(dataset[edited][0], before[0])
