"""One route from bytes to pixels: every way an ImageDataset hands out a fused image runs header ->
plan -> decode once per image (FusedTransform.decode_planned), timed once (one read, one decode); a batch
of fixed-size images runs it for the whole batch in one call (FusedTransform.decode_batch), timed once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fastloader import transforms as T
from fastloader.datasets import base, batch_route, cache_route, fields_route, pipeline
from fastloader.datasets.base import ImageDataset
from fastloader.fields import Boxes, Mask
from fastloader.image.batching import EncodedImage, PrecollatedBatch
from fastloader.transforms.fused import FusedTransform
from tests.fields.scenes import SceneSource

DETECTION = {"image": "jpg", "mask": Mask("seg.png"), "target": Boxes("json", path="annotations.*.bbox")}


@pytest.fixture()
def route(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts the dataset's decode_planned and decode_batch calls and its timed stages."""
    seen: Counter[str] = Counter()
    real_decode, real_batch, real_timed = FusedTransform.decode_planned, FusedTransform.decode_batch, base.timed

    def decode_planned(self: FusedTransform, *args: Any, **kwargs: Any) -> Any:
        seen["decode_planned"] += 1
        return real_decode(self, *args, **kwargs)

    def decode_batch(self: FusedTransform, blobs: Any, *args: Any) -> Any:
        seen["decode_batch"] += 1
        seen["decode_batch images"] += len(blobs)
        return real_batch(self, blobs, *args)

    def timed(stage: str) -> Any:
        seen[stage] += 1
        return real_timed(stage)

    monkeypatch.setattr(FusedTransform, "decode_planned", decode_planned)
    monkeypatch.setattr(FusedTransform, "decode_batch", decode_batch)
    for module in (base, batch_route, cache_route, fields_route, pipeline):  # every route that times a stage
        monkeypatch.setattr(module, "timed", timed)
    yield seen


def dataset(**options: Any) -> ImageDataset[Any]:
    return ImageDataset(
        SceneSource(), transform=T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip()]), **options
    )


def test_one_item(route: Counter[str]) -> None:
    image, _ = dataset()[0]
    assert tuple(image.shape) == (3, 32, 32)
    assert route == {"decode_planned": 1, "read": 1, "decode": 1}


def test_a_batch_decoded_into_its_buffer(route: Counter[str]) -> None:
    batch = dataset().__getitems__([0, 1, 2])
    assert isinstance(batch, PrecollatedBatch) and tuple(batch.images.shape) == (3, 3, 32, 32)
    assert route == {"decode_batch": 1, "decode_batch images": 3, "read": 1, "decode": 1}


def test_a_batch_under_an_error_policy_goes_at_once_until_a_sample_fails(route: Counter[str]) -> None:
    """A policy decides per sample (skip, replace): a batch of good samples in one call, as without one; a batch
    holding a bad one is tried at once, then goes image by image through decode_planned, as for one item."""
    policed = dataset()
    policed.set_error_policy("skip")
    batch = policed.__getitems__([0, 1, 2])
    assert isinstance(batch, PrecollatedBatch) and tuple(batch.images.shape) == (3, 3, 32, 32)
    assert route == {"decode_batch": 1, "decode_batch images": 3, "read": 1, "decode": 1}
    route.clear()
    real_read = policed.source.read
    policed.source.read = lambda index: b"not an image" if index == 1 else real_read(index)  # type: ignore[method-assign]
    batch = policed.__getitems__([0, 1, 2])
    assert tuple(batch.images.shape) == (2, 3, 32, 32) and policed.error_stats()["bad_samples"] == 1
    assert route == {"decode_batch": 1, "decode_batch images": 3, "decode_planned": 3, "read": 4, "decode": 4}


def test_samples_with_fields_and_annotations(route: Counter[str]) -> None:
    sample = dataset(fields=DETECTION)[0]
    assert tuple(sample["image"].shape) == (3, 32, 32)
    assert route["decode_planned"] == 1 and route["decode"] == 1
    route.clear()
    batch = dataset(fields=("jpg", "txt")).__getitems__([0, 1])
    assert len(batch) == 2 and route["decode_planned"] == 2 and route["decode"] == 2


def test_gpu_decode_items_stop_at_the_plan(route: Counter[str]) -> None:
    gpu = dataset()
    gpu.set_decode_device("cuda")
    encoded, _ = gpu[0]
    assert isinstance(encoded, EncodedImage) and encoded.plan.size == (32, 32) and encoded.index == 0
    assert route == {"decode_planned": 1, "read": 1, "decode": 1}


def test_the_decoded_cache_is_read_through_the_same_route(route: Counter[str], tmp_path: Path) -> None:
    cached = ImageDataset(SceneSource(), transform=T.Compose([T.Resize(40), T.CenterCrop(32)]), cache=tmp_path / "c")
    first = cached[0][0].clone()
    assert route["decode_planned"] == 1
    again = cached[0][0]
    assert route["decode_planned"] == 1 and (again == first).all()  # the second read: from the cache


def test_a_batch_through_the_decoded_cache(route: Counter[str], tmp_path: Path) -> None:
    """Not cached yet: the batch decoded in one call (one read of the cache, one of the source, one decode);
    cached: one read of the cache, nothing decoded."""
    cached = ImageDataset(SceneSource(), transform=T.Compose([T.Resize(40), T.CenterCrop(32)]), cache=tmp_path / "c")
    first = cached.__getitems__([0, 1, 2])
    assert route == {"decode_batch": 1, "decode_batch images": 3, "read": 2, "decode": 1}
    route.clear()
    again = cached.__getitems__([0, 1, 2])
    assert route == {"read": 1} and (again.images == first.images).all()
