"""The decoded cache: filled by worker processes in the first epoch, identical images from the
second on without reading the source, rebuilt when the transform or the source changes."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from fastloader import transforms as T
from fastloader.datasets.base import ImageDataset
from fastloader.datasets.folder import ImageFolder
from fastloader.errors import FormatError
from fastloader.image.batching import collate
from fastloader.image.decoded_cache import DecodedCache, _read_meta
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
    return root


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
    meta = _read_meta(str(path))
    assert meta is not None and meta.length == len(smaller) == len(dataset) - 1
    path.write_bytes(b"not a cache")
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
    assert cached._cache is not None and cached._cache.read_batch(
        [7, 8, 9], torch.empty(3, 32, 32, 3, dtype=torch.uint8).numpy()
    ).tolist() == [True, False, True]


def test_the_cache_refuses_images_of_another_shape(folder: Path, tmp_path: Path) -> None:
    cached = ImageFolder(folder, transform=EVAL)
    cached.set_cache(tmp_path / "shape.cache")
    assert cached._cache is not None
    with pytest.raises(ValueError, match="32x32x3 uint8"):
        cached._cache.write_batch([0], torch.zeros(1, 32, 30, 3, dtype=torch.uint8).numpy())
    with pytest.raises(ValueError, match="2 images"):
        cached._cache.write_batch([0, 1], torch.zeros(1, 32, 32, 3, dtype=torch.uint8).numpy())
    assert cached._cache.filled() == 0


def test_a_cache_rebuilt_by_another_run_is_never_written(folder: Path, tmp_path: Path) -> None:
    """Another run rebuilt the file at the path for another transform: writes go to the file this one mapped
    or nowhere, and say so; the other run's cache is left as it is."""
    path = tmp_path / "shared.cache"
    ours = ImageFolder(folder, transform=EVAL)
    ours.set_cache(path)
    ours.__getitems__([0])  # the file mapped here
    other = ImageFolder(folder, transform=T.Compose([T.Resize(40), T.CenterCrop(30)]))
    other.set_cache(path)
    with pytest.raises(FormatError, match="rebuilt or removed by another run"):
        ours.__getitems__([1])
    assert other._cache is not None and other._cache.filled() == 0
    path.unlink()
    with pytest.raises(FormatError, match="rebuilt or removed by another run"):
        ours.__getitems__([2])
