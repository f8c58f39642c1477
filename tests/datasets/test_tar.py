"""TarShardDataset over real shards: patterns, decoding of odd images, the catalog, and DataLoader workers."""

from __future__ import annotations

import io
import json
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.transforms import PILToTensor

import fastloader.datasets.tar_catalog as tar_catalog
import fastloader.formats.tar_shards as tar_shards
from fastloader.datasets.base import ImageDataset
from fastloader.datasets.tar import TarShardDataset, TarShardSource
from fastloader.errors import DecodeError, FormatError, MissingField
from fastloader.fields.source import read_fields
from fastloader.formats.index_file import read_index
from fastloader.formats.tar_manifest import MANIFEST_NAME
from fastloader.formats.tar_shards import INDEX_KIND, INDEX_VERSION
from fastloader.pack.tar_sink import TarShardSink
from tests.formats.test_tar_shards import index_as_version_1

# (format, mode): PNG, grayscale and CMYK next to plain JPEG, as real datasets have them.
KINDS = [("JPEG", "RGB", "jpg"), ("PNG", "RGB", "png"), ("JPEG", "L", "jpg"), ("JPEG", "CMYK", "jpeg")]


def encode(fmt: str, mode: str, value: int) -> bytes:
    """A 32 px image whose top-left pixel holds ``value`` in its red (or gray) channel."""
    pixels = np.full((32, 32, 3), (value, 40, 80), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(out, format=fmt, **({"quality": 100} if fmt == "JPEG" else {}))
    return out.getvalue()


def expected_pixel(n: int) -> tuple[int, int, int]:
    """The RGB pixel sample ``n`` decodes to (grayscale: the luma of the colour)."""
    if KINDS[n % len(KINDS)][1] == "L":
        gray = round(0.299 * 10 * n + 0.587 * 40 + 0.114 * 80)
        return gray, gray, gray
    return 10 * n, 40, 80


def write_shards(directory: Path, shards: int, per_shard: int) -> list[tuple[str, int, bytes]]:
    """WebDataset shards written by tarfile; returns (key, label, image bytes) in dataset order.

    Sample n has label n, so that tests can tell samples apart after decoding."""
    samples = []
    for s in range(shards):
        with tarfile.open(directory / f"train-{s:04d}.tar", "w", format=tarfile.PAX_FORMAT) as tar:
            for j in range(per_shard):
                n = s * per_shard + j
                fmt, mode, ext = KINDS[n % len(KINDS)]
                key, data = f"cls{n % 2}/sample_{n:03d}", encode(fmt, mode, 10 * n)
                for name, payload in ((f"{key}.{ext}", data), (f"{key}.cls", str(n).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
                samples.append((key, n, data))
    return samples


def test_brace_and_glob_patterns_read_every_sample(tmp_path: Path) -> None:
    samples = write_shards(tmp_path, shards=3, per_shard=4)
    braces = TarShardSource(str(tmp_path / "train-{0000..0002}.tar"))
    glob = TarShardSource(str(tmp_path / "train-*.tar"))
    for source in (braces, glob):
        assert len(source) == 12 and source.shards == [str(tmp_path / f"train-{s:04d}.tar") for s in range(3)]
        for i in (11, 0, 5, 7, -1):
            key, label, data = samples[i]
            assert source.read(i) == data and source.label(i) == label
        assert source.key(5) == f"{tmp_path / 'train-0001.tar'}:{samples[5][0]}"
        assert source.labels().tolist() == [label for _, label, _ in samples]
        assert [source.extension(i) for i in range(4)] == ["jpg", "png", "jpg", "jpeg"]
    assert braces.source_key(0) is None and braces.classes is None
    with pytest.raises(IndexError):
        braces.read(12)


def test_dataset_decodes_png_grayscale_and_cmyk_to_rgb(tmp_path: Path) -> None:
    write_shards(tmp_path, shards=1, per_shard=4)
    dataset = TarShardDataset(str(tmp_path / "train-0000.tar"), transform=PILToTensor(), target_transform=float)
    assert isinstance(dataset, ImageDataset) and len(dataset) == 4
    for i in range(4):
        image, label = dataset[i]
        assert image.shape == (3, 32, 32) and image.dtype == torch.uint8 and label == float(i)
        assert np.abs(image[:, 0, 0].numpy().astype(int) - expected_pixel(i)).max() <= 2, KINDS[i]


def test_dataloader_with_two_workers(tmp_path: Path) -> None:
    write_shards(tmp_path, shards=3, per_shard=4)
    dataset = TarShardDataset(str(tmp_path / "train-{0000..0002}.tar"), transform=PILToTensor())
    loader = DataLoader(dataset, batch_size=3, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(0))
    seen = []
    for images, labels in loader:
        assert images.shape == (3, 3, 32, 32)
        for image, n in zip(images, labels.tolist()):
            assert np.abs(image[:, 0, 0].numpy().astype(int) - expected_pixel(n)).max() <= 2, n
            seen.append(n)
    assert sorted(seen) == list(range(12)) and seen != list(range(12))  # all once, shuffled


def test_catalog_is_reused_and_rebuilt_when_a_shard_changes(tmp_path: Path) -> None:
    write_shards(tmp_path, shards=2, per_shard=3)
    pattern = str(tmp_path / "train-*.tar")
    first = TarShardSource(pattern)
    catalog = first._catalog.get().path
    before = os.stat(catalog)
    TarShardSource(pattern)
    assert os.stat(catalog).st_ino == before.st_ino, "an unchanged shard list reuses its catalog"
    shard = tmp_path / "train-0001.tar"
    stat = shard.stat()
    with tarfile.open(shard, "w") as tar:
        info = tarfile.TarInfo("only.png")
        data = encode("PNG", "RGB", 7)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    os.utime(shard, ns=(stat.st_mtime_ns + 10**9, stat.st_mtime_ns + 10**9))
    second = TarShardSource(pattern)
    assert len(second) == 4 and second.read(3) == data and second.label(3) == -1


def test_source_survives_pickling_and_reopens_lazily(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    samples = write_shards(tmp_path, shards=4, per_shard=2)
    source = TarShardSource(str(tmp_path / "train-*.tar"))
    source.read(0)
    clone = pickle.loads(pickle.dumps(source))  # as for a spawned worker: handles dropped, reopened
    monkeypatch.setattr(tar_catalog, "_MAX_OPEN_SHARDS", 2)  # force descriptors to be recycled
    for i in (7, 0, 3, 5, 1, 6):
        assert clone.read(i) == samples[i][2]
    assert len(clone._files.get().open) == 2


def test_image_exts_and_index_paths(tmp_path: Path) -> None:
    write_shards(tmp_path, shards=2, per_shard=4)
    pngs = TarShardSource(str(tmp_path / "train-*.tar"), image_exts=[".PNG"])
    assert len(pngs) == 2 and pngs.no_image == 6 and {pngs.extension(i) for i in range(2)} == {"png"}
    index_dir = tmp_path / "indexes"
    paths = [index_dir / "a.idx", index_dir / "b.idx"]
    TarShardSource(str(tmp_path / "train-{0000..0001}.tar"), image_exts=["jpg"], index_paths=paths)
    assert all(path.is_file() for path in paths)
    with pytest.raises(ValueError, match="index_paths has 1 entries for 2 shards"):
        TarShardSource(str(tmp_path / "train-*.tar"), index_paths=paths[:1])


def test_pack_directory_and_incomplete_pack(tmp_path: Path) -> None:
    dst = tmp_path / "packed"
    sink = TarShardSink(dst, {"test": 1}, shard_size=2)
    images = [encode("PNG", "RGB", v) for v in range(3)]
    for position, data in enumerate(images):
        sink.add(position, f"src/{position}.png", position, data)
    with pytest.raises(FormatError, match="incomplete pack.*interrupted"):
        TarShardDataset(dst)
    sink.finish(["zero", "one", "two"], {})
    dataset = TarShardDataset(dst, transform=PILToTensor())
    assert dataset.classes == ["zero", "one", "two"] and dataset.class_to_idx == {"zero": 0, "one": 1, "two": 2}
    assert [int(dataset[i][0][0, 0, 0]) for i in range(3)] == [0, 1, 2]
    with pytest.raises(FormatError, match="incomplete pack"):
        TarShardDataset(tmp_path)  # a directory that holds no pack


def test_empty_pack_reads_as_an_empty_dataset(tmp_path: Path) -> None:
    sink = TarShardSink(tmp_path / "empty", {"test": 2})
    sink.add_skipped(0, "src/0.png", "unreadable")
    sink.finish(None, {})
    source = TarShardSource(tmp_path / "empty")
    assert len(source) == 0 and source.shards == [] and source.labels().shape == (0,)


def test_undecodable_image_names_shard_and_key(tmp_path: Path) -> None:
    shard = tmp_path / "bad.tar"
    with tarfile.open(shard, "w") as tar:
        info = tarfile.TarInfo("broken/one.jpg")
        info.size = 10
        tar.addfile(info, io.BytesIO(b"\xff\xd8\xff" + bytes(7)))
    with pytest.raises(DecodeError, match=rf"{shard}:broken/one: cannot decode"):
        TarShardDataset(str(shard))[0]


# -- fields ---------------------------------------------------------------------------------------


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def write_members(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))


def test_every_member_of_plain_shards_is_a_field(tmp_path: Path) -> None:
    image, mask, second = encode("JPEG", "RGB", 1), encode("PNG", "L", 2), encode("PNG", "RGB", 3)
    caption = "Ünïcödé caption\r\n with\ttabs "
    meta = {"boxes": [[1, 2, 3, 4]], "ok": True, "none": None, "f": 0.1}
    array = np.arange(12, dtype=np.int16).reshape(3, 4)
    write_members(
        tmp_path / "a.tar",
        [
            ("dir/full.jpg", image),
            ("dir/full.cls", b"7"),
            ("dir/full.txt", caption.encode()),
            ("dir/full.json", json.dumps(meta).encode()),
            ("dir/full.seg.png", mask),
            ("dir/full.npy", npy(array)),
            ("dir/full.id", b"-9007199254740993"),  # not a float64
            ("dir/full.xyz", b"\x00\xff unknown"),
            ("bare.png", second),  # its image is a png: it has no "png" field
        ],
    )
    write_members(tmp_path / "b.tar", [("two.jpg", image), ("two.png", second), ("two.label", b"3")])
    source = TarShardSource(str(tmp_path / "*.tar"))
    assert len(source) == 3 and source.labels().tolist() == [7, -1, 3]
    assert source.field_kinds() == {
        "id": "int",
        "json": "json",
        "npy": "array",
        "png": "image",  # the second image of "two"
        "seg.png": "image",
        "txt": "text",
        "xyz": "bytes",
    }
    assert source.read_field(0, "txt") == caption and source.read_field(0, "json") == meta
    assert source.read_field(0, "seg.png") == mask and source.read_field(0, "xyz") == b"\x00\xff unknown"
    assert source.read_field(0, "id") == -9007199254740993
    got = source.read_field(0, "npy")
    assert got.dtype == np.int16 and np.array_equal(got, array)
    assert source.read(2) == image and source.read_field(2, "png") == second
    assert read_fields(source, 1) == {} and read_fields(source, 2) == {"png": second}
    with pytest.raises(MissingField, match=rf"{tmp_path / 'a.tar'}:bare: no field 'txt'"):
        source.read_field(1, "txt")
    with pytest.raises(MissingField, match=rf"{tmp_path / 'b.tar'}:two: no field 'nothing'.*fields: id, json"):
        source.read_field(2, "nothing")
    aliases = source.field_aliases()
    assert aliases["jpg"] == "image" and aliases["cls"] == "label" and aliases["label"] == "label"
    assert "png" not in aliases  # a field here, not the image
    clone = pickle.loads(pickle.dumps(source))
    assert clone.read_field(0, "txt") == caption


def test_a_bad_field_member_names_the_sample_and_field(tmp_path: Path) -> None:
    write_members(tmp_path / "s.tar", [("k.jpg", encode("JPEG", "RGB", 1)), ("k.json", b"{not json")])
    source = TarShardSource(str(tmp_path / "s.tar"))
    with pytest.raises(FormatError, match=rf"{tmp_path / 's.tar'}:k: field 'json': not a valid json value"):
        source.read_field(0, "json")


def test_a_pack_of_the_previous_version_still_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A v1 pack (manifest without fields, indexes without members) reads without rescanning its shards."""
    dst = tmp_path / "old"
    sink = TarShardSink(dst, {"test": 3}, shard_size=2)
    images = [encode("PNG", "RGB", v) for v in range(3)]
    for position, data in enumerate(images):
        sink.add(position, f"src/{position}.png", position, data)
    sink.finish(["a", "b", "c"], {})
    manifest = json.loads((dst / MANIFEST_NAME).read_text())
    del manifest["fields"]
    for shard in manifest["shards"]:  # v1 recorded no content hashes
        del shard["size"], shard["sha256"]
    (dst / MANIFEST_NAME).write_text(json.dumps({**manifest, "version": 1}))
    for path in dst.glob("*.fl-idx"):
        index_as_version_1(path)
    monkeypatch.setattr(tar_shards, "build_shard_index", None)  # a rescan would fail
    source = TarShardSource(dst)
    assert [source.read(i) for i in range(3)] == images and source.classes == ["a", "b", "c"]
    assert [source.source_key(i) for i in range(3)] == ["src/0.png", "src/1.png", "src/2.png"]
    assert source.field_kinds() == {}
    assert read_index(dst / "shard-000000.tar.fl-idx", INDEX_KIND, INDEX_VERSION).meta["member_exts"] == []


def test_a_local_dataset_refuses_the_options_of_s3_shards(tmp_path: Path) -> None:
    write_shards(tmp_path, shards=1, per_shard=2)
    pattern = str(tmp_path / "train-*.tar")
    for options in ({"shard_cache": tmp_path / "c"}, {"shard_cache_limit": 1 << 30}, {"endpoint_url": "http://s3"}):
        with pytest.raises(ValueError, match=f"{next(iter(options))} is for s3:// shards, not local ones"):
            TarShardDataset(pattern, **options)


def test_cache_is_the_cache_of_decoded_images_on_local_shards(tmp_path: Path) -> None:
    from fastloader import transforms as T

    write_shards(tmp_path, shards=1, per_shard=4)
    path = tmp_path / "decoded.cache"
    dataset = TarShardDataset(
        str(tmp_path / "train-*.tar"), transform=T.Compose([T.Resize(16), T.CenterCrop(16)]), cache=path
    )
    first = [dataset[i][0].clone() for i in range(len(dataset))]
    assert dataset._cache is not None and Path(dataset._cache.path).is_file()  # path with its key, beside it
    again = TarShardDataset(str(tmp_path / "train-*.tar"), transform=dataset.transform, cache=path)
    assert all(torch.equal(again[i][0], first[i]) for i in range(len(again)))


def test_on_s3_shards_cache_names_shard_cache_and_index_paths_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"the directory of the S3 shard cache is now shard_cache="):
        TarShardDataset("s3://bucket/train", cache=tmp_path / "c")
    with pytest.raises(ValueError, match="index_paths is for local shards, not s3:// ones"):
        TarShardDataset("s3://bucket/train", index_paths=[tmp_path / "a.idx"])


def test_a_pack_whose_manifest_class_names_were_edited_is_refused_at_open(tmp_path: Path) -> None:
    """The shards hold integer labels; the names are the manifest's: swapped there, every label of classes 0 and 1
    would be served under the other's name. The pack's fingerprint records the source's names: checked at open."""
    from fastloader.pack import pack
    from tests.images import write_image_folder

    write_image_folder(tmp_path / "images", count=9, classes=3)
    dst = tmp_path / "pack"
    pack(tmp_path / "images", dst, format="tar", shard_size=4, workers=0, progress=False)
    assert TarShardDataset(dst).classes == ["class_0", "class_1", "class_2"]
    manifest = dst / MANIFEST_NAME
    raw = json.loads(manifest.read_bytes())
    raw["classes"] = ["class_1", "class_0", "class_2"]
    manifest.write_text(json.dumps(raw, indent=1))
    with pytest.raises(
        FormatError, match=rf"{manifest}: its class names \(\['class_1', 'class_0', 'class_2'\]\) are not"
    ):
        TarShardDataset(dst)
