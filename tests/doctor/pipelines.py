"""Pipelines with one deliberately slow stage, for the doctor's tests (picklable: they run in workers)."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.utils.data import default_collate
from torchvision.transforms.functional import pil_to_tensor

from fastloader import transforms as T
from fastloader.datasets import ImageDataset
from fastloader.image.pil import decode_pil
from tests.images import image_bytes

SLOW_S = 0.02  # the injected stage's cost per sample


class MemorySource:
    """Small real images in memory; ``read_s`` makes each read that slow (slow storage)."""

    def __init__(self, count: int = 96, read_s: float = 0.0) -> None:
        self.count, self.read_s = count, read_s
        self.images = [image_bytes(kind * 6) for kind in range(6)]  # RGB JPEGs and PNGs of a few dozen pixels

    def __len__(self) -> int:
        return self.count

    def read(self, index: int) -> bytes:
        if self.read_s:
            time.sleep(self.read_s)
        return self.images[index % 6]

    def label(self, index: int) -> int:
        return index % 3

    def key(self, index: int) -> str:
        return f"memory/{index}"


def slow_decode(data: bytes, key: str) -> Any:
    time.sleep(SLOW_S)
    return decode_pil(data, key)


class SlowTransform:
    def __call__(self, image: Any) -> torch.Tensor:
        time.sleep(SLOW_S)
        return pil_to_tensor(image.resize((32, 32)))


def to_tensor(image: Any) -> torch.Tensor:
    return pil_to_tensor(image.resize((32, 32)))


def slow_collate(samples: list[Any]) -> Any:
    time.sleep(SLOW_S * len(samples))
    return default_collate(samples)


def dataset(slow: str | None) -> ImageDataset[Any]:
    """A dataset whose ``slow`` stage ("read", "decode", "transform"; None: none) costs SLOW_S per image."""
    source = MemorySource(read_s=SLOW_S if slow == "read" else 0.0)
    if slow == "read":
        return ImageDataset(source, transform=T.Compose([T.Resize((32, 32))]))  # decoded at the needed size
    if slow == "decode":
        return ImageDataset(source, transform=to_tensor, decode=slow_decode)
    if slow == "transform":
        return ImageDataset(source, transform=SlowTransform())
    return ImageDataset(source, transform=T.Compose([T.Resize((32, 32))]))
