"""The decoded cache: filled by worker processes in the first epoch, identical images from the
second on without reading the source, rebuilt when the transform or the source changes."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from fastloader import transforms as T
from fastloader.datasets.base import ImageDataset
from fastloader.datasets.folder import ImageFolder
from fastloader.errors import FormatError
from fastloader.image import decoded_cache
from fastloader.image.batching import collate
from fastloader.image.decoded_cache import RECORD, DecodedCache, _read_meta, item_identities, record_bytes
from tests.transforms import KINDS, encode, photo

EVAL = T.Compose([T.Resize(40), T.CenterCrop(32)])


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cache") / "images"
    kinds = sorted(KINDS)
    for index in range(18):
        (root / f"class_{index % 2}").mkdir(parents=True, exist_ok=True)
        data = encode(photo(80 + 5 * index, 60 + 3 * index, seed=index), kinds[index % len(kinds)])
        (root / f"class_{index % 2}" / f"{index:03d}.jpg").write_bytes(data)
    settle(root)
    return root


def settle(root: Path) -> None:
    """Date every image an hour back: files written just now are not trusted to the cache (an edit in the same
    clock tick would not change their mtime; ``ImageFolder``'s ``content_identity``)."""
    for path in root.rglob("*.jpg"):
        os.utime(path, ns=(time.time_ns() - 3600 * 10**9,) * 2)


def epoch(dataset: ImageFolder, workers: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    loader = DataLoader(dataset, batch_size=4, num_workers=workers, collate_fn=collate)
    images, labels = zip(*loader)
    return torch.cat(images), torch.cat(labels)


def test_second_epoch_comes_from_the_cache_filled_by_workers(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = ImageFolder(folder, transform=EVAL)
    uncached = epoch(dataset)
    dataset.set_cache(tmp_path / "eval.cache")
    assert dataset._cache is not None and dataset._cache.filled() == 0
    first = epoch(dataset)
    assert dataset._cache.filled() == len(dataset)  # written by two worker processes, seen here
    assert torch.equal(first[0], uncached[0]) and torch.equal(first[1], uncached[1])

    def unreadable(index: int) -> bytes:
        raise AssertionError("a cached epoch must not read the source")

    with monkeypatch.context() as patch:
        patch.setattr(dataset.source, "read", unreadable)
        second = epoch(dataset)
        assert torch.equal(second[0], first[0]) and torch.equal(second[1], first[1])
        assert torch.equal(dataset[3][0], first[0][3])  # the per-sample path reads the cache too
    clone = pickle.loads(pickle.dumps(dataset))  # a spawned worker: maps the file itself
    assert torch.equal(clone[5][0], first[0][5])


def test_a_changed_transform_or_source_rebuilds_the_cache(folder: Path, tmp_path: Path) -> None:
    path = tmp_path / "eval.cache"
    dataset = ImageFolder(folder, transform=EVAL)
    dataset.set_cache(path)
    epoch(dataset, workers=0)
    assert dataset._cache is not None and dataset._cache.filled() == len(dataset)
    dataset.set_cache(path)  # the same transform and source: reused
    assert dataset._cache.filled() == len(dataset)
    dataset.transform = T.Compose([T.Resize(40), T.CenterCrop(30)])
    with pytest.raises(ValueError, match="set_cache again"):
        dataset[0]
    dataset.set_cache(path)
    assert dataset._cache.filled() == 0 and dataset[0][0].shape == (3, 30, 30)
    smaller = ImageFolder(folder, transform=dataset.transform, is_valid_file=lambda p: not p.endswith("017.jpg"))
    smaller.set_cache(path)
    assert smaller._cache is not None and smaller._cache.path == dataset._cache.path  # the same transform's file
    meta = _read_meta(smaller._cache.path)
    assert meta is not None and meta.length == len(smaller) == len(dataset) - 1
    Path(smaller._cache.path).write_bytes(b"not a cache")
    smaller.set_cache(path)
    assert smaller._cache is not None and smaller._cache.filled() == 0 and torch.equal(smaller[2][0], smaller[2][0])


def test_random_or_unsized_transforms_are_refused(folder: Path, tmp_path: Path) -> None:
    for transform, match in (
        (T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip()]), "fixed transform"),
        (T.Compose([T.CenterCrop(32), T.RandomHorizontalFlip()]), "fixed transform"),
        (T.Resize(32), "fixed output size"),
        (v2.Compose([v2.PILToTensor()]), "fastloader transform"),
    ):
        with pytest.raises(ValueError, match=match):
            ImageFolder(folder, transform=transform).set_cache(tmp_path / "x.cache")


def test_trailing_random_transforms_run_on_every_read(folder: Path, tmp_path: Path) -> None:
    jitter = T.Compose([T.Resize(40), T.CenterCrop(32), v2.ColorJitter(brightness=0.5)])
    dataset = ImageFolder(folder, transform=jitter)
    dataset.set_cache(tmp_path / "jitter.cache")
    torch.manual_seed(0)
    first = dataset[2][0]
    assert dataset._cache is not None and dataset._cache.filled() == 1  # the crop, before the jitter
    torch.manual_seed(1)
    assert not torch.equal(dataset[2][0], first)
    torch.manual_seed(0)
    assert torch.equal(dataset[2][0], first)


def test_the_constructor_takes_a_cache_path(folder: Path, tmp_path: Path) -> None:
    source = ImageFolder(folder).source
    dataset = ImageDataset(source, transform=EVAL, cache=tmp_path / "ctor.cache")
    images, labels = collate(dataset.__getitems__([0, 1, 2]))
    assert images.shape == (3, 3, 32, 32) and labels.tolist() == [source.label(i) for i in range(3)]
    assert isinstance(dataset._cache, DecodedCache) and dataset._cache.filled() == 3
    again, _ = collate(dataset.__getitems__([0, 1, 2]))
    assert torch.equal(again, images)
    dataset.set_cache(None)
    assert dataset._cache is None


def test_a_batch_copies_what_is_cached_and_decodes_the_rest_at_once(folder: Path, tmp_path: Path) -> None:
    """The batch route through the cache: its cached items copied, the others decoded in one call and stored;
    the pixels are the uncached dataset's, and a batch of cached items reads nothing from the source."""
    plain = ImageFolder(folder, transform=EVAL)
    expected = plain.__getitems__(list(range(len(plain))))
    cached = ImageFolder(folder, transform=EVAL)
    cached.set_cache(tmp_path / "batch.cache")
    assert cached._cache is not None
    first = cached.__getitems__([2, 5, 6])
    assert torch.equal(first.images, expected.images[[2, 5, 6]]) and cached._cache.filled() == 3
    reads: list[int] = []
    real_read = cached.source.read
    cached.source.read = lambda index: reads.append(index) or real_read(index)  # type: ignore[method-assign]
    mixed = cached.__getitems__([5, 0, 6, 1, 2])  # two new among cached ones
    assert torch.equal(mixed.images, expected.images[[5, 0, 6, 1, 2]]) and mixed.labels.tolist() == [
        plain.source.label(i) for i in (5, 0, 6, 1, 2)
    ]
    assert sorted(reads) == [0, 1] and cached._cache.filled() == 5
    reads.clear()
    again = cached.__getitems__([1, 0, 2, 6, 5])
    assert reads == [] and torch.equal(again.images, expected.images[[1, 0, 2, 6, 5]])


def test_a_cached_batch_keeps_the_error_policy(folder: Path, tmp_path: Path) -> None:
    """An excluded sample is never read, from the cache either (its substitute stands in); a bad sample among
    those not cached yet sends the batch image by image, and nothing bad is stored."""
    cached = ImageFolder(folder, transform=EVAL)
    cached.set_cache(tmp_path / "policy.cache")
    full = cached.__getitems__([3, 4, 5])  # 4 cached, as every item here
    cached.set_error_policy("replace", exclude=[4], quarantine=tmp_path / "q.tsv")
    batch = cached.__getitems__([3, 4, 5])
    assert torch.equal(batch.images, torch.stack([full.images[0], full.images[2], full.images[2]]))
    real_read = cached.source.read
    cached.source.read = lambda index: b"not an image" if index == 8 else real_read(index)  # type: ignore[method-assign]
    cached.set_error_policy("skip", quarantine=tmp_path / "q.tsv")
    skipped = cached.__getitems__([3, 7, 8, 9])
    assert skipped.images.shape[0] == 3 and cached.error_stats()["bad_samples"] == 1
    assert torch.equal(skipped.images[0], full.images[0])
    out = torch.empty(3, 32, 32, 3, dtype=torch.uint8).numpy()
    identities = item_identities(cached.source, [7, 8, 9])
    assert cached._cache is not None
    assert cached._cache.read_batch([7, 8, 9], out, identities).tolist() == [True, False, True]


def test_the_cache_refuses_images_of_another_shape(folder: Path, tmp_path: Path) -> None:
    cached = ImageFolder(folder, transform=EVAL)
    cached.set_cache(tmp_path / "shape.cache")
    assert cached._cache is not None
    with pytest.raises(ValueError, match="32x32x3 uint8"):
        cached._cache.write_batch([0], torch.zeros(1, 32, 30, 3, dtype=torch.uint8).numpy(), np.ones(1, np.uint64))
    with pytest.raises(ValueError, match="2 images"):
        cached._cache.write_batch([0, 1], torch.zeros(1, 32, 32, 3, dtype=torch.uint8).numpy(), np.ones(2, np.uint64))
    assert cached._cache.filled() == 0


def test_a_cache_rebuilt_by_another_run_is_never_written(folder: Path, tmp_path: Path) -> None:
    """Another run rebuilt the file of this transform for another dataset (one image fewer): writes go to the file
    this one mapped or nowhere, and say so; the other run's cache is left as it is."""
    path = tmp_path / "shared.cache"
    ours = ImageFolder(folder, transform=EVAL)
    ours.set_cache(path)
    ours.__getitems__([0])  # the file mapped here
    other = ImageFolder(folder, transform=EVAL, is_valid_file=lambda p: not p.endswith("017.jpg"))
    other.set_cache(path)
    with pytest.raises(FormatError, match="rebuilt or removed by another run"):
        ours.__getitems__([1])
    assert other._cache is not None and other._cache.filled() == 0
    assert ours._cache is not None and ours._cache.path == other._cache.path
    Path(ours._cache.path).unlink()
    with pytest.raises(FormatError, match="rebuilt or removed by another run"):
        ours.__getitems__([2])


# -- never stale, never wrong: what the cache serves is checked against the source and its own CRC -------------


def make_folder(root: Path, count: int = 20) -> Path:
    for index in range(count):
        (root / f"class_{index % 2}").mkdir(parents=True, exist_ok=True)
        data = encode(photo(70 + 3 * index, 60 + 2 * index, seed=index), "jpeg")
        (root / f"class_{index % 2}" / f"{index:03d}.jpg").write_bytes(data)
    settle(root)
    return root


def unsampled(length: int) -> list[int]:
    """The positions the source fingerprint does not read (an edit there does not rebuild the cache)."""
    sampled = {int(i) for i in np.linspace(0, length - 1, num=16)}
    return [index for index in range(length) if index not in sampled]


def test_an_image_edited_after_the_cache_was_filled_is_served_new(tmp_path: Path) -> None:
    """Two images the fingerprint does not sample are rewritten under their names after two workers filled the
    cache: one in place with its old mtime put back (as ``cp -p`` or ``rsync -t`` do), one written beside and
    renamed over it. The next epoch serves the new pixels of both, the cached ones of the others."""
    root = make_folder(tmp_path / "images")
    dataset = ImageFolder(root, transform=EVAL)
    dataset.set_cache(tmp_path / "eval.cache")
    before = epoch(dataset)
    in_place, renamed = (root / dataset.source.key(index) for index in unsampled(len(dataset))[:2])
    kept = in_place.stat()
    in_place.write_bytes(encode(photo(90, 70, seed=101), "jpeg"))
    os.utime(in_place, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    (root / "new.tmp").write_bytes(encode(photo(75, 66, seed=102), "jpeg"))
    os.utime(root / "new.tmp", ns=(kept.st_atime_ns, kept.st_mtime_ns))
    os.replace(root / "new.tmp", renamed)
    after = epoch(dataset)
    expected = epoch(ImageFolder(root, transform=EVAL))
    edited = set(unsampled(len(dataset))[:2])
    for index in range(len(dataset)):
        assert torch.equal(after[0][index], expected[0][index]), f"item {index}: not the image on disk"
        assert torch.equal(after[0][index], before[0][index]) == (index not in edited), f"item {index}"
    assert dataset._cache is not None and dataset._cache.filled() == len(dataset)  # the new pixels stored


def test_a_file_written_just_now_is_never_cached(tmp_path: Path) -> None:
    """Timestamps are coarse: a file modified just now might be edited again within the same tick, its mtime
    unchanged, so its identity is not trusted and its pixels not stored (decoded each time, until it is older)."""
    root = make_folder(tmp_path / "images", count=4)
    dataset = ImageFolder(root, transform=EVAL)
    dataset.set_cache(tmp_path / "eval.cache")
    fresh = root / dataset.source.key(1)
    fresh.write_bytes(encode(photo(80, 64, seed=103), "jpeg"))
    first = dataset.__getitems__([0, 1, 2, 3])
    assert dataset._cache is not None and dataset._cache.filled() == 3
    fresh.write_bytes(encode(photo(80, 64, seed=104), "jpeg"))  # within the same second, likely the same tick
    again = dataset.__getitems__([0, 1, 2, 3])
    assert torch.equal(again.images, ImageFolder(root, transform=EVAL).__getitems__([0, 1, 2, 3]).images)
    assert not torch.equal(again.images[1], first.images[1])


def pixels_of(cache: DecodedCache, index: int) -> int:
    meta = cache.meta
    return meta.pixels_offset + index * meta.height * meta.width * 3


def test_a_bit_flip_in_the_cached_pixels_is_decoded_again(
    folder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One bit of one cached image flipped in the file: that image is decoded again (and logged, naming the
    item), in a batch and alone, and stored again; never served flipped."""
    path = tmp_path / "eval.cache"
    dataset = ImageFolder(folder, transform=EVAL)
    dataset.set_cache(path)
    filled = epoch(dataset)
    assert dataset._cache is not None
    path = Path(dataset._cache.path)  # the file of this transform's key
    for index, offset in ((5, 1000), (6, 0)):
        with open(path, "r+b") as file:
            byte = os.pread(file.fileno(), 1, pixels_of(dataset._cache, index) + offset)
            os.pwrite(file.fileno(), bytes([byte[0] ^ 0x10]), pixels_of(dataset._cache, index) + offset)
    with caplog.at_level("WARNING", logger="fastloader.image.decoded_cache"):
        alone = dataset[6][0]  # here, where the log is seen; item 5 goes to the workers
    assert torch.equal(alone, filled[0][6])
    assert "item 6 fail their CRC32C" in caplog.text and str(path) in caplog.text
    served = epoch(dataset)
    for index in range(len(dataset)):
        assert torch.equal(served[0][index], filled[0][index]), f"item {index}"
    with open(path, "rb") as file:  # stored again: the file holds the right pixels
        stored = os.pread(file.fileno(), 32 * 32 * 3, pixels_of(dataset._cache, 5))
    assert stored == filled[0][5].permute(1, 2, 0).contiguous().numpy().tobytes()


def test_a_record_without_its_pixels_is_never_served(folder: Path, tmp_path: Path) -> None:
    """What a crash can leave (a file's pages reach the disk in any order): the record of an item, exactly as a
    writer writes it, over pixels never written; and stray bytes in another item's record. Both decoded, never
    an all-zero image."""
    path = tmp_path / "eval.cache"
    expected = ImageFolder(folder, transform=EVAL).__getitems__([3, 4, 5]).images
    dataset = ImageFolder(folder, transform=EVAL)
    dataset.set_cache(path)
    assert dataset._cache is not None
    identities = item_identities(dataset.source, [3, 4])
    record = record_bytes(3, int(identities[0]), expected[0].permute(1, 2, 0).numpy())
    with open(dataset._cache.path, "r+b") as file:
        os.pwrite(file.fileno(), record, 4096 + 3 * RECORD.itemsize)
        os.pwrite(file.fileno(), b"\x01" * RECORD.itemsize, 4096 + 4 * RECORD.itemsize)
    assert dataset._cache.filled() == 1  # the record is whole: only the pixels tell
    assert torch.equal(dataset[3][0], expected[0]) and torch.equal(dataset[4][0], expected[1])
    fresh = ImageFolder(folder, transform=EVAL)
    fresh.set_cache(path)  # the same header: the same file, item 3 now stored for real
    with open(dataset._cache.path, "r+b") as file:
        os.pwrite(file.fileno(), bytes(32 * 32 * 3), pixels_of(dataset._cache, 3))  # its pixels lost again
    assert torch.equal(fresh.__getitems__([3, 4, 5]).images, expected)


def test_a_process_killed_between_pixels_and_record_leaves_nothing_wrong(folder: Path, tmp_path: Path) -> None:
    """A forked process filling the cache batch by batch gets SIGKILL right after writing the pixels of item 9,
    before any record of its batch: the next epoch (two workers) serves every image right, sample by sample."""
    path = tmp_path / "eval.cache"
    dataset = ImageFolder(folder, transform=EVAL)
    dataset.set_cache(path)
    assert dataset._cache is not None
    child = multiprocessing.get_context("fork").Process(target=fill_until_killed, args=(dataset, 9))
    child.start()
    child.join()
    assert child.exitcode == -signal.SIGKILL
    assert dataset._cache.filled() == 8  # the batches before item 9's; its batch wrote pixels, no record
    served = epoch(dataset)
    expected = epoch(ImageFolder(folder, transform=EVAL), workers=0)
    for index in range(len(dataset)):
        assert torch.equal(served[0][index], expected[0][index]), f"item {index}"
    assert dataset._cache.filled() == len(dataset)


def fill_until_killed(dataset: ImageFolder, victim: int) -> None:
    """Fill the cache in batches of 4; SIGKILL this process as soon as item ``victim``'s pixels are written."""
    assert dataset._cache is not None
    offset, real_pwrite = pixels_of(dataset._cache, victim), os.pwrite

    def pwrite_then_die(descriptor: int, data: Any, at: int) -> int:
        written = real_pwrite(descriptor, data, at)
        if at == offset:
            os.kill(os.getpid(), signal.SIGKILL)
        return written

    decoded_cache.os.pwrite = pwrite_then_die  # this process only: it dies here
    for start in range(0, len(dataset), 4):
        dataset.__getitems__(list(range(start, min(start + 4, len(dataset)))))


class PackedSource:
    """Encoded images held like a pack's records: no ``content_identity``, so the cache checks each record's
    bytes (their length and CRC32C)."""

    def __init__(self, blobs: list[bytes]) -> None:
        self.blobs = blobs

    def __len__(self) -> int:
        return len(self.blobs)

    def read(self, index: int) -> bytes:
        return self.blobs[index]

    def label(self, index: int) -> int:
        return index % 3

    def key(self, index: int) -> str:
        return f"record-{index}"


def test_a_packed_record_rewritten_after_the_cache_was_filled_is_served_new(tmp_path: Path) -> None:
    blobs = [encode(photo(70 + index, 60 + index, seed=index), "jpeg") for index in range(20)]
    source = PackedSource(list(blobs))
    dataset = ImageDataset(source, transform=EVAL, cache=tmp_path / "pack.cache")
    before = dataset.__getitems__(list(range(20))).images
    edited = unsampled(20)[0]
    source.blobs[edited] = encode(photo(88, 77, seed=200), "jpeg")
    after = dataset.__getitems__(list(range(20))).images
    expected = ImageDataset(PackedSource(source.blobs), transform=EVAL).__getitems__(list(range(20))).images
    assert torch.equal(after, expected) and not torch.equal(after[edited], before[edited])
    assert torch.equal(dataset[edited][0], expected[edited])


class BrokenRecord(PackedSource):
    def read(self, index: int) -> bytes:
        if index == unsampled(len(self))[0]:
            raise OSError(5, "Input/output error", self.key(index))
        return super().read(index)


def test_an_unreadable_record_is_left_to_the_error_policy(tmp_path: Path) -> None:
    """The identity of a record that cannot be read is not trusted (never an error of its own): the decode's
    read fails, and the error policy skips that sample, as it does without a cache."""
    blobs = [encode(photo(70 + index, 60 + index, seed=index), "jpeg") for index in range(20)]
    dataset = ImageDataset(BrokenRecord(blobs), transform=EVAL)
    dataset.set_error_policy("skip")
    expected = dataset.__getitems__(list(range(20))).images
    assert expected.shape[0] == 19
    dataset.set_cache(tmp_path / "broken.cache")
    for _ in range(2):
        assert torch.equal(dataset.__getitems__(list(range(20))).images, expected)
    assert dataset._cache is not None and dataset._cache.filled() == 19
    assert dataset.error_stats()["bad_samples"] == 1  # one sample, however often it failed
