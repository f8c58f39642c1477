"""decode_plan: both backends (jpeg_ext region decode, PIL draft) give torchvision's pixels, DCT
scaling only where the output is small enough, zero padding and flips, errors naming the key."""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest
import torch
import torchvision.transforms as tv
import torchvision.transforms.functional as tvf
from PIL import Image, JpegImagePlugin

from fastloader import transforms as T
from fastloader.errors import CorruptJPEGError, DecodeError
from fastloader.image import decode
from fastloader.image.geometry import CropPlan
from fastloader.image.pil import decode_pil
from tests.images import needs_arrow
from tests.transforms import photo_bytes

needs_ext = pytest.mark.skipif(decode._jpeg_ext() is None, reason="fastloader.image.jpeg_ext is not built")


def pil_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode, "_jpeg_ext", lambda: None)


def test_image_size_reads_the_header() -> None:
    assert decode.image_size(photo_bytes("jpeg", 333, 250)) == (333, 250)
    assert decode.image_size(photo_bytes("jpeg_cmyk", 90, 70)) == (90, 70)  # jpeg_ext refuses CMYK: PIL
    assert decode.image_size(photo_bytes("png_rgba", 90, 70)) == (90, 70)
    with pytest.raises(DecodeError, match="shard-3/img.jpg"):
        decode.image_size(b"\xff\xd8garbage", key="shard-3/img.jpg")


PLANS = [
    CropPlan((0, 0, 500, 375), (375, 500), False),  # the whole image, 1:1
    CropPlan((13, 7, 301, 290), (224, 224), True),  # a crop: region decode, crop then resize
    CropPlan((430, 300, 500, 375), (100, 120), False),  # bottom-right corner, upscaled
    CropPlan((10, 5, 490, 370), (60, 80), False),  # small output: DCT 1/4
    CropPlan((85, 23, 414, 352), (224, 224), False, exact_box=(85.04, 23.44, 413.49, 351.56)),
]


@needs_ext
@pytest.mark.parametrize("kind", ["jpeg", "jpeg_progressive", "jpeg_gray"])
def test_region_decode_equals_the_pil_path(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = photo_bytes(kind, 500, 375, seed=5)
    with_ext = [decode.decode_plan(data, plan) for plan in PLANS]
    pil_only(monkeypatch)
    for plan, ours in zip(PLANS, with_ext):
        # Same libjpeg-turbo, same scale, a margin around the box for the filter: the same pixels
        # (a fractional box lands on a region-relative float: a handful of pixels round the other way).
        diff = np.abs(ours.astype(int) - decode.decode_plan(data, plan))
        assert diff.max() <= (0 if plan.exact_box is None else 1) and np.count_nonzero(diff) < 10, plan


@needs_ext
@needs_arrow
@pytest.mark.parametrize("kind", ["jpeg", "jpeg_gray", "png_rgba"])
def test_packing_into_the_output_gives_the_pixels_of_a_copy(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = photo_bytes(kind, 500, 375, seed=6)
    plans = [*PLANS, CropPlan((13, 7, 301, 290), (224, 224), True, exact_box=(13.5, 7.25, 300.75, 289.5))]
    ext, packs = decode._jpeg_ext(), []

    def counted(*args: Any) -> None:
        packs.append(args)
        ext.pack_rgb(*args)

    monkeypatch.setattr(decode, "_jpeg_ext", lambda: types.SimpleNamespace(**{**vars(ext), "pack_rgb": counted}))
    packed = [decode.decode_plan(data, plan) for plan in plans]
    assert len(packs) == len(plans)  # each went through pack_rgb
    monkeypatch.undo()

    def no_arrow_export(self: Image.Image) -> None:
        raise ValueError("Image is in multiple array blocks")  # what Pillow says of an image over its block size

    monkeypatch.setattr(Image.Image, "__arrow_c_array__", no_arrow_export)
    for plan, ours in zip(plans, packed):
        assert np.array_equal(ours, decode.decode_plan(data, plan)), plan


@needs_ext
@pytest.mark.parametrize("kind", ["jpeg", "jpeg_gray"])
def test_fast_decodes_resize_in_the_extension_as_pil_does(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default (fast) decode resizes in jpeg_ext, straight into the slot: PIL's pixels within two levels,
    padding and flips included."""
    data = photo_bytes(kind, 500, 375, seed=11)
    plans = [
        *PLANS,
        CropPlan((13, 7, 301, 290), (224, 224), True, exact_box=(13.5, 7.25, 300.75, 289.5)),
        CropPlan((-40, 300, 120, 420), (64, 80), True),  # off the image's corner: padded with 0, flipped
        CropPlan((0, 0, 500, 375), (7, 9), False, interpolation="lanczos"),
    ]
    ext, calls = decode._jpeg_ext(), []

    def counted(*args: Any) -> None:
        calls.append(args)
        ext.decode_resized(*args)

    monkeypatch.setattr(decode, "_jpeg_ext", lambda: types.SimpleNamespace(**{**vars(ext), "decode_resized": counted}))
    batch = np.full((2, 400, 512, 3), 9, np.uint8)
    ours = [
        decode.decode_plan(data, plan, fast=True, out=batch[0, : plan.size[0], : plan.size[1]]).copy() for plan in plans
    ]
    assert len(calls) == len(plans) and (batch[1] == 9).all()
    monkeypatch.setattr(decode, "RESAMPLERS", {})  # the PIL resize of the same decoded region
    for plan, pixels in zip(plans, ours):
        diff = np.abs(pixels.astype(int) - decode.decode_plan(data, plan, fast=True))
        assert diff.max() <= 2 and diff.mean() < 0.05, plan


def test_dct_scaling_only_when_the_output_is_small_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    scales: list[int] = []
    original_draft = JpegImagePlugin.JpegImageFile.draft

    def spy(self: JpegImagePlugin.JpegImageFile, mode: str | None, size: tuple[int, int] | None) -> object:
        result = original_draft(self, mode, size)
        scales.append(round(self.size[0] and 2000 / self.size[0]))
        return result

    pil_only(monkeypatch)
    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", spy)
    data = photo_bytes("jpeg", 2000, 1500, seed=6)
    small = T.Compose([T.Resize(146), T.CenterCrop(128)])
    reference = tv.Compose([tv.Resize(146), tv.CenterCrop(128)])
    ours = small(data)
    assert scales == [4]  # 1315 px -> 128: 1/4 still leaves >= 1.5x the output resolution
    mean = (ours.int() - tvf.pil_to_tensor(reference(decode_pil(data))).int()).abs().double().mean()
    assert mean < 1.0
    scales.clear()
    T.Compose([T.Resize(146, interpolation=tv.InterpolationMode.NEAREST), T.CenterCrop(128)])(data)
    T.CenterCrop(1000)(data)
    assert scales == []  # nearest neighbour picks pixels; a 1:1 crop has no room


@needs_ext
def test_region_decode_scales_too(monkeypatch: pytest.MonkeyPatch) -> None:
    ext = decode._jpeg_ext()
    calls: list[tuple[tuple[int, ...], int]] = []

    def spy(
        data: bytes, box: tuple[int, int, int, int], scale_denom: int = 1, fast: bool = False, rgbx: bool = False
    ) -> object:
        calls.append((box, scale_denom))
        return ext.decode_region(data, box, scale_denom, fast, rgbx)

    monkeypatch.setattr(
        decode,
        "_jpeg_ext",
        lambda: types.SimpleNamespace(jpeg_info=ext.jpeg_info, decode_region=spy, pack_rgb=ext.pack_rgb),
    )
    data = photo_bytes("jpeg", 1024, 768, seed=7)
    decode.decode_plan(data, CropPlan((100, 50, 900, 700), (64, 64), False))  # 650 / 64 >= 1.5 * 4
    decode.decode_plan(data, CropPlan((100, 50, 300, 250), (128, 128), False))
    assert [scale for _, scale in calls] == [4, 1]
    x0, y0, x1, y1 = calls[1][0]  # the box and a margin for the bilinear filter's reach, not the image
    assert 95 <= x0 < 100 and 45 <= y0 < 50 and 300 < x1 <= 305 and 250 < y1 <= 255


def test_padding_is_zero_and_flips_with_the_image(monkeypatch: pytest.MonkeyPatch) -> None:
    data = photo_bytes("jpeg", 150, 101, seed=8)
    for flip in (False, True):
        ours = T.Compose([T.CenterCrop((120, 181)), T.RandomHorizontalFlip(p=float(flip))], exact_decode=True)(data)
        reference = tvf.center_crop(decode_pil(data), [120, 181])
        reference = tvf.hflip(reference) if flip else reference
        assert torch.equal(ours, tvf.pil_to_tensor(reference))  # left pad 15, right pad 16: flipped too
    outside = decode.decode_plan(data, CropPlan((200, 0, 260, 40), (8, 8), False))
    assert outside.shape == (8, 8, 3) and not outside.any()


def test_out_receives_the_pixels() -> None:
    data = photo_bytes("jpeg", 200, 150, seed=9)
    plan = CropPlan((10, 10, 110, 90), (40, 50), False)
    batch = np.zeros((3, 40, 50, 3), dtype=np.uint8)
    slot = batch[1]
    assert decode.decode_plan(data, plan, out=slot) is slot
    assert np.array_equal(batch[1], decode.decode_plan(data, plan)) and not batch[0].any()
    with pytest.raises(ValueError, match="shape"):
        decode.decode_plan(data, plan, out=np.zeros((40, 50, 4), dtype=np.uint8))
    with pytest.raises(ValueError, match="interpolation"):
        decode.decode_plan(data, CropPlan((0, 0, 10, 10), (4, 4), False, interpolation="cubic"))


def test_corrupt_data_is_a_decode_error_naming_the_key() -> None:
    data = photo_bytes("jpeg", 200, 150, seed=10)
    plan = CropPlan((0, 0, 200, 150), (32, 32), False)
    for bad in (data[:600], data[:2] + b"\x00" * 64, b"GIF89a not really", b""):
        with pytest.raises(DecodeError, match="n01440764/bad.JPEG"):
            decode.decode_plan(bad, plan, key="n01440764/bad.JPEG")


def test_a_region_that_misses_the_box_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken extension must fail loudly, not shift the crop."""

    def short(
        data: bytes, box: tuple[int, int, int, int], scale_denom: int = 1, fast: bool = False, rgbx: bool = False
    ) -> object:
        return np.zeros((4, 4, 4 if rgbx else 3), dtype=np.uint8), (box[0] // scale_denom, box[1] // scale_denom)

    fake = types.SimpleNamespace(jpeg_info=lambda data: (200, 150, 3), decode_region=short)
    monkeypatch.setattr(decode, "_jpeg_ext", lambda: fake)
    with pytest.raises(RuntimeError, match="does not cover"):
        decode.decode_plan(photo_bytes("jpeg", 200, 150), CropPlan((0, 0, 100, 100), (32, 32), False))


def test_a_bug_in_the_fast_path_is_never_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ValueError from a bug in the fast path is raised, not hidden behind a slower PIL decode."""
    from fastloader.image import decode as decode_module
    from fastloader.image import jpeg_ext

    if not jpeg_ext.AVAILABLE:
        pytest.skip("the JPEG extension is not built")
    data = photo_bytes("jpeg", 64, 48)
    plan = CropPlan((0, 0, 64, 48), (24, 32), flip=False)
    truncated = data[:200]
    with pytest.raises(CorruptJPEGError):
        jpeg_ext.decode_region(truncated, (0, 0, 64, 48))
    with pytest.raises(DecodeError, match="broken.jpg"):  # corrupt data: a DecodeError naming the key
        decode_module.decode_plan(truncated, plan, "broken.jpg")

    def buggy(*args: object, **kwargs: object) -> None:
        raise ValueError("a bug in the fast path")

    monkeypatch.setattr(decode_module, "_decode_with_ext", buggy)
    with pytest.raises(ValueError, match="a bug in the fast path"):
        decode_module.decode_plan(data, plan, "good.jpg")


@pytest.mark.parametrize("kind", ["jpeg", "jpeg_cmyk", "png_rgba"])
def test_the_header_is_read_once_per_image(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One header parse and one pixel-limit check per image on the fused path; an image the region
    decoder does not take (CMYK, PNG) goes straight to PIL, without a failed attempt first."""
    from fastloader.image import decode as decode_module

    calls: dict[str, int] = {"header": 0, "check": 0, "ext": 0}
    real_header, real_check, real_ext = (
        decode_module.read_header,
        decode_module.check_pixels,
        decode_module._decode_with_ext,
    )

    def counting(name: str, function: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return function(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(decode_module, "read_header", counting("header", real_header))
    monkeypatch.setattr(decode_module, "check_pixels", counting("check", real_check))
    monkeypatch.setattr(decode_module, "_decode_with_ext", counting("ext", real_ext))
    pixels = T.Compose([T.Resize(40), T.CenterCrop(32)])(photo_bytes(kind, 90, 70))
    assert tuple(pixels.shape) == (3, 32, 32)
    expected_ext = 1 if kind == "jpeg" and decode_module._jpeg_ext() is not None else 0
    assert calls == {"header": 1, "check": 1, "ext": expected_ext}


def batch_of_every_kind() -> list[tuple[bytes, decode.ImageHeader, CropPlan]]:
    """Images the extension takes and images it leaves to PIL, with plans of every route through decode_plan."""
    size = (40, 48)
    plans = [
        CropPlan((13, 7, 301, 290), size, True),  # crop then resize, flipped
        CropPlan((85, 23, 414, 352), size, False, exact_box=(85.04, 23.44, 413.49, 351.56)),  # a fractional box
        CropPlan((10, 5, 490, 370), size, False, interpolation="bicubic"),  # DCT scaled
        CropPlan((-50, -20, 550, 395), size, True),  # padded: zeros around the image, flipped
        CropPlan((600, 0, 700, 100), size, False),  # misses the image: all zeros
        CropPlan((0, 0, 500, 375), size, False, interpolation="nearest"),  # PIL's filter
    ]
    images = []
    for i, kind in enumerate(["jpeg", "jpeg_progressive", "jpeg_gray", "jpeg_cmyk", "png_rgba", "png_palette"]):
        data = photo_bytes(kind, 500, 375, seed=i)
        for j in range(len(plans)):
            images.append((data, decode.read_header(data), plans[(i + j) % len(plans)]))
    return images


@pytest.mark.parametrize("fast", [True, False])
def test_decode_plans_gives_decode_plans_pixels_for_every_image(fast: bool) -> None:
    images = batch_of_every_kind()
    out = np.full((len(images), 40, 48, 3), 7, np.uint8)
    decode.decode_plans(images, out, fast, lambda slot: f"item-{slot}")
    for slot, (data, header, plan) in enumerate(images):
        alone = decode.decode_plan(data, plan, fast=fast, header=header)
        assert np.array_equal(out[slot], alone), (slot, plan)


def test_decode_plans_without_the_extension_is_decode_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    pil_only(monkeypatch)
    images = batch_of_every_kind()[:12]
    expected = np.stack([decode.decode_plan(data, plan, fast=True, header=header) for data, header, plan in images])
    out = np.zeros_like(expected)
    decode.decode_plans(images, out, True, str)
    assert np.array_equal(out, expected)


def test_decode_plans_decodes_refused_jpegs_with_pil_and_names_bad_keys() -> None:
    good = photo_bytes("jpeg", 200, 150, seed=3)
    plan = CropPlan((0, 0, 200, 150), (24, 32), False)
    header = decode.read_header(good)
    # Cut after the header: the extension refuses it, PIL decodes what is there or refuses it, naming the key.
    images = [(good, header, plan), (good[:900], header, plan), (good, header, plan)]
    out = np.zeros((3, 24, 32, 3), np.uint8)
    with pytest.raises(DecodeError, match="item-1"):
        decode.decode_plans(images, out, True, lambda slot: f"item-{slot}")
    with pytest.raises(ValueError, match="size"):
        decode.decode_plans([(good, header, CropPlan((0, 0, 200, 150), (8, 8), False))], out[:1], True, str)
    with pytest.raises(ValueError, match="slots"):
        decode.decode_plans(images, out[:2], True, str)
