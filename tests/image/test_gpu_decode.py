"""GPU decode's batch logic, run here on the CPU (torchvision's decode_jpeg takes lists on the CPU too):
crops, resizes, flips, padding and the CPU fallback must agree with the CPU decode of the same plans.
The nvJPEG path itself is tested in tests/gpu/."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fastloader import transforms as T
from fastloader.image.batching import EncodedImage
from fastloader.image.decode import decode_plan
from fastloader.image.geometry import CropPlan
from fastloader.image.gpu_decode import decode_batch, decode_encoded, is_encoded_batch
from fastloader.sample import make_sample_folder

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    root = make_sample_folder(tmp_path_factory.mktemp("photos"), 40, num_classes=1)
    return [path.read_bytes() for path in sorted(root.glob("*/*.jpg"))]


def cpu_reference(items: list[EncodedImage]) -> torch.Tensor:
    return torch.stack([torch.from_numpy(decode_plan(i.data, i.plan, i.key)).permute(2, 0, 1) for i in items])


def encode(data: bytes, transform: T.Compose, key: str = "k") -> EncodedImage:
    width, height = Image.open(io.BytesIO(data)).size
    return EncodedImage(data, transform.plan(width, height), key)


@pytest.mark.parametrize(
    "transform",
    [
        T.Compose([T.Resize(256), T.CenterCrop(224)]),
        T.Compose([T.RandomResizedCrop(160), T.RandomHorizontalFlip()]),
        T.Compose([T.Resize(100), T.CenterCrop(128)]),  # the crop is larger than the image: zero padding
    ],
)
def test_batch_equals_the_cpu_path(photos: list[bytes], transform: T.Compose) -> None:
    torch.manual_seed(0)
    items = [encode(data, transform) for data in photos]
    got = decode_batch(items, CPU)
    expected = cpu_reference(items)
    assert got.dtype == torch.uint8 and got.shape == expected.shape
    diff = (got.float() - expected.float()).abs()
    assert diff.mean() < 1.0, f"mean difference {diff.mean():.2f}"


def test_what_nvjpeg_cannot_decode_goes_through_the_cpu(photos: list[bytes]) -> None:
    transform = T.Compose([T.Resize(64), T.CenterCrop(64)])
    rgb = np.asarray(Image.open(io.BytesIO(photos[0])).convert("RGB"))
    png, cmyk = io.BytesIO(), io.BytesIO()
    Image.fromarray(rgb).save(png, format="PNG")
    Image.fromarray(rgb).convert("CMYK").save(cmyk, format="JPEG", quality=95)
    items = [encode(png.getvalue(), transform), encode(cmyk.getvalue(), transform), encode(photos[1], transform)]
    got = decode_batch(items, CPU)
    assert torch.equal(got[0], cpu_reference(items[:1])[0]) and torch.equal(got[1], cpu_reference(items[1:2])[0])


def test_mixed_sizes_in_one_batch_are_refused(photos: list[bytes]) -> None:
    items = [encode(photos[0], T.Compose([T.CenterCrop(32)])), encode(photos[1], T.Compose([T.CenterCrop(48)]))]
    with pytest.raises(ValueError, match="one output size per batch"):
        decode_batch(items, CPU)


def test_encoded_lists_are_found_in_a_batch(photos: list[bytes]) -> None:
    items = [EncodedImage(photos[0], CropPlan((0, 0, 8, 8), (8, 8), False), "a")]
    labels = torch.tensor([3])
    assert is_encoded_batch(items) and not is_encoded_batch([1, 2]) and not is_encoded_batch([])
    images, same_labels = decode_encoded([items, labels], CPU)
    assert images.shape == (1, 3, 8, 8) and same_labels is labels


def test_an_unreadable_image_names_its_key(tmp_path: Path) -> None:
    items = [EncodedImage(b"\xff\xd8 not really a jpeg", CropPlan((0, 0, 8, 8), (8, 8), False), "bad/001.jpg")]
    with pytest.raises(Exception, match="bad/001.jpg"):
        decode_batch(items, CPU)
