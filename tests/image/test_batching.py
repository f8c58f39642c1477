"""__getitems__ batches: one uint8 buffer (shared memory in workers), collate without a copy,
the same values as the per-sample path through a real DataLoader; GPU-decode items."""

from __future__ import annotations

import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, Subset, default_collate
from torchvision.transforms import v2

from fastloader import transforms as T
from fastloader.datasets.folder import ImageFolder
from fastloader.image.batching import EncodedImage, PrecollatedBatch, allocate_batch, collate
from fastloader.image.decode import decode_plan, image_size
from tests.transforms import KINDS, encode, photo

KIND_NAMES = sorted(KINDS)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 photos of every kind (PNG, CMYK, gray, ... all named .jpg), 3 classes, varied sizes."""
    root = tmp_path_factory.mktemp("batching") / "images"
    for index in range(24):
        width, height = 90 + 7 * index, 150 - 3 * index
        (root / f"class_{index % 3}").mkdir(parents=True, exist_ok=True)
        data = encode(photo(width, height, seed=index), KIND_NAMES[index % len(KIND_NAMES)])
        (root / f"class_{index % 3}" / f"{index:03d}.jpg").write_bytes(data)
    return root


EVAL = T.Compose([T.Resize(64), T.CenterCrop(56)], exact_decode=True)
TRAIN = T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip()])
EVAL_FAST = T.Compose([T.Resize(64), T.CenterCrop(48)])


class PerSample(Dataset[Any]):
    """The same dataset without __getitems__: torch fetches item by item and default_collates."""

    def __init__(self, dataset: Dataset[Any]) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]


def test_getitems_writes_one_channels_last_buffer(folder: Path) -> None:
    dataset = ImageFolder(folder, transform=EVAL)
    batch = dataset.__getitems__([0, 5, 23, -1])
    assert isinstance(batch, PrecollatedBatch) and len(batch) == 4
    images, labels = collate(batch)
    assert images is batch.images and labels is batch.labels  # no copy
    assert images.shape == (4, 3, 56, 56) and images.dtype == torch.uint8
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert labels.dtype == torch.int64 and labels.tolist() == [dataset.targets[i] for i in (0, 5, 23, 23)]
    for slot, index in enumerate([0, 5, 23, 23]):
        image, label = dataset[index]
        assert torch.equal(images[slot], image) and label == labels[slot]
        assert batch[slot][0].data_ptr() == images[slot].data_ptr()  # items are views of the buffer
    stacked_images, stacked_labels = default_collate(batch)  # a plain DataLoader: one copy, same values
    assert torch.equal(stacked_images, images) and torch.equal(stacked_labels, labels)


@pytest.mark.parametrize("transform", [TRAIN, EVAL_FAST], ids=["train", "eval"])
@pytest.mark.parametrize("collate_fn", [collate, None], ids=["collate", "default_collate"])
def test_dataloader_workers_match_the_per_sample_path(folder: Path, collate_fn: Any, transform: Any) -> None:
    dataset = ImageFolder(folder, transform=transform)
    kwargs: dict[str, Any] = {"batch_size": 5, "num_workers": 2, "shuffle": True}
    ours = DataLoader(dataset, collate_fn=collate_fn, generator=torch.Generator().manual_seed(7), **kwargs)
    reference = DataLoader(PerSample(dataset), generator=torch.Generator().manual_seed(7), **kwargs)
    count = 0
    for (images, labels), (ref_images, ref_labels) in zip(ours, reference, strict=True):
        assert images.dtype == torch.uint8 and images.shape == (len(labels), 3, 48, 48)
        assert labels.dtype == torch.int64 and torch.equal(labels, ref_labels)
        assert torch.equal(images, ref_images)  # the same crops and flips: same draws, same order
        count += len(labels)
    assert count == len(dataset)


def test_a_batch_of_large_images_is_decoded_in_parts(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bounded encoded bytes per decode call: the same pixels and draws, in as many calls as the bound asks."""
    from fastloader.datasets import batch_route
    from fastloader.transforms.fused import FusedTransform

    dataset = ImageFolder(folder, transform=TRAIN)
    torch.manual_seed(3)
    whole = dataset.__getitems__(list(range(24)))
    calls: list[int] = []
    real = FusedTransform.decode_batch

    def counted(self: FusedTransform, blobs: Any, *args: Any) -> None:
        calls.append(len(blobs))
        real(self, blobs, *args)

    monkeypatch.setattr(batch_route, "_BATCH_BYTES", 20_000)  # a few of these images
    monkeypatch.setattr(FusedTransform, "decode_batch", counted)
    torch.manual_seed(3)
    parts = dataset.__getitems__(list(range(24)))
    assert len(calls) > 2 and sum(calls) == 24
    assert torch.equal(parts.images, whole.images) and torch.equal(parts.labels, whole.labels)


def shared_in_worker(batch: Any) -> tuple[bool, torch.Tensor]:
    return batch.images.untyped_storage().is_shared(), collate(batch)[1]


def test_worker_batches_are_allocated_in_shared_memory(folder: Path) -> None:
    dataset = ImageFolder(folder, transform=EVAL)
    loader = DataLoader(dataset, batch_size=8, num_workers=2, collate_fn=shared_in_worker)
    assert all(shared for shared, _ in loader)
    assert not allocate_batch(2, 4, 4).is_shared()  # the main process: plain memory


def test_other_transforms_get_a_plain_list(folder: Path) -> None:
    jitter = T.Compose([T.Resize(64), T.CenterCrop(56), v2.ColorJitter(0.3)])
    for transform in (None, T.Resize(40), jitter, v2.Compose([v2.PILToTensor(), v2.CenterCrop(30)])):
        dataset = ImageFolder(folder, transform=transform)
        items = dataset.__getitems__([1, 2])
        assert type(items) is list and len(items) == 2 and items[0][1] == dataset.targets[1]
    torch.manual_seed(0)
    images, labels = collate(ImageFolder(folder, transform=jitter).__getitems__([3, 4]))
    assert images.shape == (2, 3, 56, 56) and images.dtype == torch.uint8


def test_a_user_loader_keeps_torchvision_semantics(folder: Path) -> None:
    from PIL import Image

    def load(path: str) -> Image.Image:
        with Image.open(path) as image:
            return image.convert("RGB")

    dataset = ImageFolder(folder, transform=EVAL, loader=load)
    items = dataset.__getitems__([0, 1])
    assert type(items) is list and isinstance(items[0][0], Image.Image) and items[0][0].size == (56, 56)


def test_non_int_targets_are_collated_like_default_collate(folder: Path) -> None:
    dataset = ImageFolder(folder, transform=EVAL, target_transform=lambda y: torch.tensor([y, -y]))
    batch = dataset.__getitems__([0, 1, 2])
    assert torch.equal(collate(batch)[1], default_collate([dataset[i][1] for i in (0, 1, 2)]))


def test_a_precollated_batch_pickles_its_buffer_once(folder: Path) -> None:
    batch = ImageFolder(folder, transform=EVAL).__getitems__(list(range(6)))
    clone = pickle.loads(pickle.dumps(batch))
    assert isinstance(clone, PrecollatedBatch) and torch.equal(clone.images, batch.images)
    assert clone.images.is_contiguous(memory_format=torch.channels_last) and torch.equal(clone.labels, batch.labels)
    assert [label for _, label in clone] == [label for _, label in batch]
    with pytest.raises(ValueError, match="targets"):
        PrecollatedBatch(allocate_batch(2, 4, 4), [0])


def test_subsets_fetch_batches_too(folder: Path) -> None:
    subset = Subset(ImageFolder(folder, transform=EVAL), [3, 1, 4])
    images, labels = collate(subset.__getitems__([0, 2]))
    assert images.shape == (2, 3, 56, 56) and labels.tolist() == [subset[0][1], subset[2][1]]


def test_gpu_decode_items_carry_bytes_and_plans(folder: Path) -> None:
    dataset = ImageFolder(folder, transform=EVAL)
    cpu_image, _ = dataset[4]
    dataset.set_decode_device("cuda")
    encoded, label = dataset[4]
    assert isinstance(encoded, EncodedImage) and encoded.key == dataset.source.key(4)
    assert encoded.plan == EVAL.plan(*image_size(encoded.data)) and label == dataset.targets[4]
    assert np.array_equal(decode_plan(encoded.data, encoded.plan), cpu_image.permute(1, 2, 0).numpy())
    loader = DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=collate)
    for images, labels in loader:
        assert all(isinstance(item, EncodedImage) for item in images) and len(images) == len(labels)
    dataset.set_decode_device("cpu")
    assert isinstance(dataset[4][0], torch.Tensor)


def test_gpu_decode_refuses_transforms_it_cannot_plan(folder: Path) -> None:
    for transform in (None, v2.Compose([v2.PILToTensor()]), T.Compose([T.CenterCrop(8), v2.ColorJitter(0.2)])):
        with pytest.raises(ValueError, match="device='cuda'"):
            ImageFolder(folder, transform=transform).set_decode_device("cuda")
    with pytest.raises(ValueError, match="device must be"):
        ImageFolder(folder, transform=EVAL).set_decode_device("tpu")


def test_a_batch_buffer_without_madvise_populate_still_works(monkeypatch: pytest.MonkeyPatch) -> None:
    """Populating the pages up front is best effort: a kernel that refuses it is asked once, then left alone."""
    from fastloader.image import pages

    calls: list[int] = []

    def refusing(address: int, length: int, advice: int) -> int:
        calls.append(advice)
        return -1

    monkeypatch.setattr(pages, "_madvise", lambda: refusing)
    monkeypatch.setattr(pages, "_refused", set())
    for _ in range(2):
        buffer = allocate_batch(3, 8, 8)
        buffer.fill_(7)
        assert buffer.shape == (3, 8, 8, 3) and int(buffer.sum()) == 7 * buffer.numel()
    assert calls == [pages.POPULATE_WRITE]


def test_decode_threads_share_the_spare_cores_among_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    from fastloader.image import batching

    assert batching.decode_threads() == 1  # the training process: left to the training loop
    assert batching.decode_threads(3) == 3
    for cores, workers, threads in [(2, 2, 1), (2, 1, 1), (16, 4, 3), (16, 1, 4), (64, 8, 4), (8, 16, 1)]:
        monkeypatch.setattr(batching, "get_worker_info", lambda workers=workers: SimpleNamespace(num_workers=workers))
        monkeypatch.setattr(batching.os, "sched_getaffinity", lambda pid, cores=cores: set(range(cores)), raising=False)
        assert batching.decode_threads() == threads, (cores, workers)


class ThreadsSeen(Dataset[Any]):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> int:
        from fastloader.image.batching import decode_threads

        return decode_threads()


def test_a_worker_decodes_on_its_share_of_the_cores() -> None:
    import os

    cores = len(os.sched_getaffinity(0))
    seen = list(DataLoader(ThreadsSeen(), batch_size=None, num_workers=1))
    assert seen == [max(1, min(4, cores - 1))] * 2


def test_threads_change_no_pixel(folder: Path) -> None:
    dataset = ImageFolder(folder, transform=TRAIN)
    torch.manual_seed(11)
    alone = dataset.__getitems__(list(range(24)))
    dataset.set_decode_threads(3)
    torch.manual_seed(11)
    threaded = dataset.__getitems__(list(range(24)))
    assert torch.equal(threaded.images, alone.images)
    for bad in (0, 17, 2.0, True):
        with pytest.raises(ValueError, match="threads"):
            dataset.set_decode_threads(bad)  # type: ignore[arg-type]
    dataset.set_decode_threads(None)
