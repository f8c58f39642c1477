"""The routes get a Pipeline, never the dataset: one built from a source and a transform alone decodes a batch
as the dataset does; the dataset builds its pipeline again whenever what it holds changes (a setter, a
transform, target transform or ImageFolder loader reassigned) and a copied or pickled dataset keeps its own."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from fastloader import transforms as T
from fastloader.datasets import ImageFolder
from fastloader.datasets.base import ImageDataset
from fastloader.datasets.batch_route import whole_batch
from fastloader.datasets.pipeline import Pipeline
from fastloader.datasets.policy_route import image_by_image
from fastloader.image.batching import EncodedImage, PrecollatedBatch, allocate_batch
from tests.fields.scenes import SceneSource
from tests.images import write_image_folder


def fixed(size: int) -> T.Compose:
    return T.Compose([T.Resize(size), T.CenterCrop(size)])


def batch(dataset: ImageDataset[Any], indices: list[int]) -> PrecollatedBatch:
    got = dataset.__getitems__(indices)
    assert isinstance(got, PrecollatedBatch)
    return got


def test_the_routes_need_only_a_pipeline() -> None:
    source, transform = SceneSource(), fixed(24)
    pipeline = Pipeline(
        source=source,
        transform=transform,
        target=source.label,
        target_transform=None,
        decodes_bytes=True,
        fused=transform,
        errors=None,
        cache=None,
        cached_transform=None,
        decode_device="cpu",
        decode_threads=1,
        layout=None,
        fields=None,
    )
    expected = batch(ImageDataset(SceneSource(), transform=fixed(24)), [3, 0, 5])
    assert pipeline.buffer_size == (24, 24)
    at_once = allocate_batch(3, 24, 24)
    labels = whole_batch(pipeline, [3, 0, 5], at_once.numpy())
    assert labels is not None and labels == expected.labels.tolist()
    assert torch.equal(PrecollatedBatch(at_once, labels).images, expected.images)
    one_by_one = image_by_image(pipeline, allocate_batch(3, 24, 24), [3, 0, 5])
    assert torch.equal(one_by_one.labels, expected.labels) and torch.equal(one_by_one.images, expected.images)


def test_a_reassigned_transform_or_target_transform_is_the_next_items() -> None:
    dataset = ImageDataset(SceneSource(), transform=fixed(32))
    labels = batch(dataset, [0, 1]).labels.tolist()
    dataset.transform = fixed(16)
    assert dataset.batch_buffer_size() == (16, 16) and batch(dataset, [0, 1]).images.shape == (2, 3, 16, 16)
    dataset.target_transform = lambda label: label + 100
    assert batch(dataset, [0, 1]).labels.tolist() == [label + 100 for label in labels]
    assert dataset[1][1] == labels[1] + 100
    dataset.transform = lambda image: np.asarray(image).shape  # not a fastloader transform: PIL decodes
    assert dataset.batch_buffer_size() is None and dataset[1][0] == (72, 96, 3)


def test_each_setter_is_the_next_items(tmp_path: Path) -> None:
    dataset = ImageDataset(SceneSource(), transform=fixed(32))
    batch(dataset, [0, 1, 2])
    real_read = dataset.source.read
    dataset.source.read = lambda index: b"not an image" if index == 1 else real_read(index)  # type: ignore[method-assign]
    with pytest.raises(Exception, match="1"):
        batch(dataset, [0, 1, 2])
    dataset.set_error_policy("skip")
    assert batch(dataset, [0, 1, 2]).labels.tolist() == [dataset.source.label(0), dataset.source.label(2)]
    dataset.source.read = real_read  # type: ignore[method-assign]
    dataset.set_cache(tmp_path / "decoded.cache")
    batch(dataset, [3, 4, 5])  # (sample 1 is known bad now: never read again)
    assert dataset._cache is not None and dataset._cache.filled() == 3
    dataset.set_cache(None)
    dataset.set_decode_device("cuda")  # items stay encoded, for the GPU: no CUDA call here
    assert dataset.batch_buffer_size() is None and isinstance(dataset[0][0], EncodedImage)


def test_an_image_folder_s_reassigned_loader_reads_the_next_items(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "images", count=6)
    dataset = ImageFolder(tmp_path / "images", transform=fixed(16))
    assert dataset[0][0].shape == (3, 16, 16)  # fastloader decodes the bytes
    read: list[str] = []

    def loader(path: str) -> Any:
        read.append(path)
        return Image.new("RGB", (40, 30))

    dataset.loader = loader
    image, _ = dataset[0]
    assert read == [dataset.samples[0][0]] and isinstance(image, Image.Image) and image.size == (16, 16)
    assert dataset.batch_buffer_size() is None  # the loader's images go one by one


def test_a_copied_or_pickled_dataset_keeps_its_own_route() -> None:
    dataset = ImageDataset(SceneSource(), transform=fixed(32))
    expected = batch(dataset, [2, 4])
    unpickled = pickle.loads(pickle.dumps(dataset))
    again = batch(unpickled, [2, 4])
    assert torch.equal(again.labels, expected.labels) and torch.equal(again.images, expected.images)
    other = copy.copy(dataset)  # it shares the original's pipeline until something of it changes
    other.transform = fixed(16)
    assert batch(other, [2, 4]).images.shape == (2, 3, 16, 16)
    other.set_decode_threads(2)
    other.set_error_policy("skip")
    assert dataset.error_policy is None and batch(dataset, [2, 4]).images.shape == (2, 3, 32, 32)
