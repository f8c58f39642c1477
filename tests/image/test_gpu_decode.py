"""GPU decode's batch logic, run here on the CPU (torchvision's decode_jpeg takes lists on the CPU too):
crops, resizes, flips, padding and the CPU fallback must agree with the CPU decode of the same plans.
The nvJPEG path itself is tested in tests/gpu/."""

from __future__ import annotations

import dataclasses
import io
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from fastloader import transforms as T
from fastloader.datasets import ImageFolder
from fastloader.errors import DecodeError
from fastloader.image.batching import EncodedImage, collate
from fastloader.image.decode import decode_plan
from fastloader.image.geometry import CropPlan, visible_region, whole_box
from fastloader.image.gpu_decode import (
    GpuDecoder,
    _crop_resize,
    _gpu_decodable,
    _raise_if_out_of_memory,
    decode_batch,
    is_encoded_batch,
)
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
    images, same_labels = GpuDecoder(CPU)([items, labels])
    assert images.shape == (1, 3, 8, 8) and same_labels is labels


def test_an_unreadable_image_names_its_key(tmp_path: Path) -> None:
    items = [EncodedImage(b"\xff\xd8 not really a jpeg", CropPlan((0, 0, 8, 8), (8, 8), False), "bad/001.jpg")]
    with pytest.raises(Exception, match="bad/001.jpg"):
        decode_batch(items, CPU)


def noisy_plans(count: int) -> list[tuple[int, int, CropPlan]]:
    """RandomResizedCrop plans whose visible region has float noise in a whole-pixel edge (232.00000000000003):
    about 2.5% of all plans on varied image sizes."""
    generator = torch.Generator().manual_seed(0)
    transform = T.Compose([T.RandomResizedCrop(224)])
    found = []
    while len(found) < count:
        width, height = (int(v) for v in torch.randint(200, 1600, (2,), generator=generator))
        plan = transform.plan(width, height)
        region = visible_region(plan, width, height)
        assert region is not None
        if not all(float(edge).is_integer() for edge in region[0]):
            found.append((width, height, plan))
    return found


def test_float_noise_in_a_whole_pixel_box_crops_then_resizes_as_the_cpu_path() -> None:
    # 2.4% of RandomResizedCrop images used to take the resize-then-crop branch on the GPU (6 levels off).
    for width, height, plan in noisy_plans(12):
        image = torch.randint(0, 256, (3, height, width), dtype=torch.uint8)
        x0, y0, x1, y1 = plan.box
        expected = torch.nn.functional.interpolate(
            image[:, y0:y1, x0:x1].unsqueeze(0).float(), size=plan.size, mode="bilinear", antialias=True
        )
        expected = expected.round_().clamp_(0, 255).to(torch.uint8)[0]
        assert torch.equal(_crop_resize(image, plan), expected), plan


def test_the_cpu_decoder_crops_noisy_boxes_as_whole_pixels_too() -> None:
    assert whole_box((191.0, 0.0, 457.0, 232.00000000000003)) == (191, 0, 457, 232)
    assert whole_box((10.9999999999999, 0.0, 20.0, 5.0)) == (11, 0, 20, 5)
    assert whole_box((10.5, 0.0, 20.0, 5.0)) is None


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear", "bicubic"])
def test_each_image_follows_its_plans_filter(photos: list[bytes], interpolation: str) -> None:
    transform = T.Compose([T.Resize(160, interpolation=interpolation), T.CenterCrop(144)])
    items = [encode(data, transform) for data in photos[:12]]
    got = decode_batch(items, CPU).float()
    expected = cpu_reference(items).float()
    per_image = (got - expected).abs().mean(dim=(1, 2, 3))
    # Per image, not per batch: one bad image must not hide behind good ones.
    assert per_image.max() < 1.0, f"{interpolation}: worst image {per_image.max():.2f} levels from the CPU path"
    if interpolation != "bilinear":
        bilinear = [EncodedImage(i.data, dataclasses.replace(i.plan, interpolation="bilinear"), i.key) for i in items]
        other = (decode_batch(bilinear, CPU).float() - expected).abs().mean(dim=(1, 2, 3))
        assert other.mean() > per_image.mean() + 0.3, "the filter made no difference: is the plan's filter ignored?"


@pytest.mark.parametrize("interpolation", ["box", "hamming", "lanczos"])
def test_filters_without_a_gpu_equivalent_are_refused_for_gpu_decode(tmp_path: Path, interpolation: str) -> None:
    root = make_sample_folder(tmp_path / "data", 4, num_classes=1)
    dataset = ImageFolder(root, transform=T.Compose([T.Resize(64, interpolation=interpolation), T.CenterCrop(64)]))
    with pytest.raises(ValueError, match=interpolation):
        dataset.set_decode_device("cuda")
    assert dataset.decode_device == "cpu"


def test_out_of_memory_is_never_taken_for_a_bad_image() -> None:
    with pytest.raises(torch.cuda.OutOfMemoryError):
        _raise_if_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    with pytest.raises(RuntimeError, match="ALLOCATOR_FAILURE"):
        _raise_if_out_of_memory(RuntimeError("nvjpegDecodeBatched failed: NVJPEG_STATUS_ALLOCATOR_FAILURE"))
    _raise_if_out_of_memory(RuntimeError("Corrupt JPEG data: premature end of data segment"))  # a bad image


@pytest.fixture
def folder_with_a_corrupt_jpeg(tmp_path: Path) -> tuple[Path, int]:
    root = make_sample_folder(tmp_path / "data", 64, num_classes=2)
    paths = sorted(root.glob("*/*.jpg"))
    plain = [i for i, path in enumerate(paths) if Image.open(path).mode == "RGB" and Image.open(path).format == "JPEG"]
    bad = plain[len(plain) // 2]
    data = bytearray(paths[bad].read_bytes())
    middle = len(data) // 2
    data[middle : middle + 200] = b"\xff" * 200  # header and end marker intact: only a decode can tell
    paths[bad].write_bytes(bytes(data))
    return root, bad


def gpu_mode_batch(dataset: ImageFolder, indices: list[int]) -> Any:
    return collate(dataset.__getitems__(indices))


def test_one_corrupt_jpeg_is_replaced_under_the_replace_policy(
    folder_with_a_corrupt_jpeg: tuple[Path, int],
) -> None:
    root, bad = folder_with_a_corrupt_jpeg
    transform = T.Compose([T.Resize(72), T.CenterCrop(64)])
    dataset = ImageFolder(root, transform=transform)
    dataset.set_decode_device("cuda")
    dataset.set_error_policy("replace", quarantine=root.parent / "bad.tsv")
    decoder = GpuDecoder(CPU, dataset, collate)
    indices = list(range(64))
    images, labels = decoder(gpu_mode_batch(dataset, indices))
    assert images.shape == (64, 3, 64, 64) and labels.shape == (64,)
    substitute, label = dataset[bad + 1]
    # The corrupt image's row holds the next sample, image and label together; the others are untouched.
    assert torch.equal(images[bad], cpu_reference([substitute])[0]) and int(labels[bad]) == label
    good = [i for i in indices if i != bad]
    expected = cpu_reference([dataset[i][0] for i in good]).float()
    per_image = (images[good].float() - expected).abs().mean(dim=(1, 2, 3))
    assert per_image.max() < 3.0  # resampler differences (DCT scaling on the CPU); a wrong image is > 20
    assert decoder.counts.batch_retries == 1 and decoder.counts.bad == 1
    assert decoder.counts.on_gpu == 63 - decoder.counts.on_cpu + 1  # every good image decoded once
    assert [sample.position for sample in dataset.error_policy.bad_samples()] == [bad]


def test_one_corrupt_jpeg_is_dropped_from_every_column_under_skip(
    folder_with_a_corrupt_jpeg: tuple[Path, int],
) -> None:
    root, bad = folder_with_a_corrupt_jpeg
    dataset = ImageFolder(root, transform=T.Compose([T.Resize(72), T.CenterCrop(64)]))
    dataset.set_decode_device("cuda")
    dataset.set_error_policy("skip", quarantine=root.parent / "bad.tsv")
    images, labels = GpuDecoder(CPU, dataset, collate)(gpu_mode_batch(dataset, list(range(64))))
    expected_labels = [dataset.source.label(i) for i in range(64) if i != bad]
    assert images.shape[0] == 63 and labels.tolist() == expected_labels


def test_one_corrupt_jpeg_raises_naming_its_file_by_default(folder_with_a_corrupt_jpeg: tuple[Path, int]) -> None:
    root, bad = folder_with_a_corrupt_jpeg
    dataset = ImageFolder(root, transform=T.Compose([T.Resize(72), T.CenterCrop(64)]))
    dataset.set_decode_device("cuda")
    with pytest.raises(DecodeError, match=dataset.source.key(bad)):
        GpuDecoder(CPU, dataset, collate)(gpu_mode_batch(dataset, list(range(64))))


def test_fallbacks_are_logged_once_and_counted(
    folder_with_a_corrupt_jpeg: tuple[Path, int], caplog: pytest.LogCaptureFixture
) -> None:
    root, _ = folder_with_a_corrupt_jpeg
    dataset = ImageFolder(root, transform=T.Compose([T.Resize(72), T.CenterCrop(64)]))
    dataset.set_decode_device("cuda")
    dataset.set_error_policy("replace", quarantine=root.parent / "bad.tsv")
    decoder = GpuDecoder(CPU, dataset, collate)
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        for _ in range(3):
            decoder(gpu_mode_batch(dataset, list(range(64))))
    retries = [r for r in caplog.records if "retrying" in r.getMessage()]
    # Found bad in the first batch, the sample is never read again: the next batches hold its substitute.
    assert len(retries) == 1 and decoder.counts.batch_retries == 1 and decoder.counts.bad == 1
    assert decoder.counts.images == 192 and dataset.error_stats()["bad_samples"] == 1


def test_a_truncated_jpeg_never_reaches_nvjpeg(photos: list[bytes]) -> None:
    # nvJPEG may decode a truncated file without an error (grey where the data stops); the CPU path
    # rejects it: such files go to the CPU so that both paths agree on what a bad sample is.
    transform = T.Compose([T.CenterCrop(32)])
    whole, cut, padded = photos[0], photos[0][: len(photos[0]) // 2], photos[0] + b"\x00" * 8
    assert _gpu_decodable(encode(whole, transform)) and _gpu_decodable(encode(padded, transform))
    assert not _gpu_decodable(encode(cut, transform))
    decoder = GpuDecoder(CPU)
    _, bad = decoder.decode([encode(whole, transform), encode(cut, transform, key="cut.jpg")])
    assert [(row, "cut.jpg" in str(error)) for row, error in bad] == [(1, True)]
    assert decoder.counts.batch_retries == 0  # found before the batched call, not by its failure
