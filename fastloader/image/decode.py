"""Decode encoded image bytes straight to a planned crop: ``decode_plan(data, plan) -> H×W×3 uint8``.

JPEG decode dominates the CPU cost of training on images, so a crop is decoded at the size it is
needed, never more. The backends, fastest first; each falls through to the next for what it
cannot do:

1. ``fastloader.image.jpeg_ext`` (libjpeg-turbo, optional): decodes only the region the crop needs
   (rows above and below it entropy-decoded only, columns from an iMCU boundary), plus a margin of a
   few pixels for the resampling filter, DCT-scaled as below.
   CMYK / YCCK JPEGs (``UnsupportedJPEGError``) go to PIL; data it refuses (corrupt, truncated anywhere in
   the file whatever the crop, over its scan or pixel limit) is a :class:`~fastloader.errors.DecodeError`,
   never handed to PIL, which would paper over a truncation with grey rows. For fast decodes
   (``fast=True``, the transforms' default) it also resizes, with PIL's filters, weights and pass order
   (Pillow-SIMD's pixels, Pillow's within two levels), straight into ``out``, flipped on the
   way: one call without the GIL (``jpeg_ext.decode_resized``). Exact decodes resize with PIL.
2. PIL (Pillow-SIMD when installed): ``Image.draft`` asks libjpeg for a DCT-scaled decode (1/2,
   1/4, 1/8: fewer IDCTs, a smaller image to resize). Other formats (PNG, WebP, ...) decode in full.

DCT scaling is used only while the reduced image keeps 1.5x the output resolution (never an
upscale from a reduced decode; see ``decode_window.DCT_ROOM``). Then one resize: a whole-pixel box is cropped,
then resized (torchvision's ``RandomResizedCrop``, bit for bit at full scale); a fractional box
(``Resize`` + ``CenterCrop``) is resized with ``Image.resize(size, resample, box=...)``, which
samples exactly what torchvision's resize-then-crop samples. Flip and zero padding come last.

Measured on the sample photos (about 500x375, one thread, medians of A/B rounds), per image,
train / eval pipelines at 224 and 128: torchvision (PIL full decode, crop, resize) 1.07-1.22 ms;
the PIL branch the same within 5% (decode-bound; draft rarely applies at this size); jpeg_ext
region 0.83-0.96 ms (1.22-1.34x). On 1024x768 photos: torchvision 3.3-3.6 ms, PIL + draft
2.4-3.3 ms (1.1-1.4x), jpeg_ext region + DCT 1.85-2.3 ms (1.6-1.8x).

PIL cannot decode only some rows (stopping libjpeg early reads as a broken stream, which cannot
be told apart from a truly truncated file), so region decode is the extension's job.

Colour: every image comes out RGB, as ``fastloader.image.pil.decode_pil`` makes it (grayscale, CMYK,
palette and RGBA converted); grayscale is resized before it is converted (the same result, a third
of the work). Bad data raises :class:`~fastloader.errors.DecodeError` naming the key
(``fastloader.image.pil``: PIL's errors, the pixel limit and the RGB conversion, in one place).
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from fastloader.errors import CorruptJPEGError, DecodeError, UnsupportedJPEGError
from fastloader.image.decode_window import (
    FILTERS,
    INTERPOLATIONS,
    RESAMPLERS,
    batch_job,
    dct_scale,
    scaled_source,
    target_rect,
    window,
)
from fastloader.image.geometry import CropPlan, FloatBox, visible_region, whole_box
from fastloader.image.pil import check_pixels, decode_errors, open_image, pixel_limit, to_rgb

_JPEG_SOI = b"\xff\xd8"


@functools.cache
def _jpeg_ext() -> ModuleType | None:
    """``fastloader.image.jpeg_ext`` when it is built and usable, else None (imported once, lazily)."""
    try:
        module = importlib.import_module("fastloader.image.jpeg_ext")
    except ImportError:
        return None
    return module if getattr(module, "AVAILABLE", False) else None


def pixels_made_by(fast: bool) -> str:
    """Everything besides its arguments that decides :func:`decode_plan`'s pixels: the decode mode (``fast``:
    libjpeg's fast IDCT and the extension's resize; else the exact decode, resized by PIL), the JPEG extension
    (the libjpeg-turbo it was built against, its resize's pass order) and PIL (its distribution and version,
    Pillow-SIMD's included, and the libjpeg it decodes with). A cache of decoded pixels is keyed by it: pixels
    made one way are never served for another."""
    import PIL
    from PIL import features

    from fastloader.image.pil import resize_pass_order

    parts = [f"decode={'fast' if fast else 'exact'}"]
    ext = _jpeg_ext()
    if ext is None:
        parts.append("jpeg extension: none")
    else:
        order = getattr(ext, "_pass_order", None) or resize_pass_order()  # what its first resize sets, unless set
        parts.append(f"jpeg extension: libjpeg-turbo {ext.LIBJPEG_TURBO_VERSION}, pass order {order}")
    turbo = features.check_feature("libjpeg_turbo")
    jpeg = features.version_feature("libjpeg_turbo") if turbo else features.version("jpg")
    # PIL's version tells Pillow-SIMD from Pillow (Pillow-SIMD's carry ".post"), whose resizes differ.
    parts.append(f"PIL {PIL.__version__} with {'libjpeg-turbo' if turbo else 'libjpeg'} {jpeg}")
    return "; ".join(parts)


def is_jpeg(data: bytes | memoryview) -> bool:
    return bytes(data[:2]) == _JPEG_SOI


@dataclass(frozen=True)
class ImageHeader:
    """What an encoded image's header says, read once per image (the pixel limit is checked there)
    and carried with it: to the crop plan, to the decode, to the GPU decoder."""

    width: int
    height: int
    plain_jpeg: bool  # a JPEG in RGB or grayscale: the region decoder and nvJPEG take it; else PIL decodes


def read_header(data: bytes, key: str = "<bytes>") -> ImageHeader:
    """The header of an encoded image; refuses decompression bombs before any pixel is decoded."""
    ext = _jpeg_ext()
    header: ImageHeader | None = None
    if ext is not None and is_jpeg(data):
        try:
            width, height, components = ext.jpeg_info(data)
            header = ImageHeader(int(width), int(height), components in (1, 3))
        except UnsupportedJPEGError:  # a JPEG variant the extension leaves to PIL (12-bit, lossless, ...)
            pass
        except CorruptJPEGError as error:
            raise _refused(key, error) from None
    if header is None:
        with decode_errors(key):
            image = open_image(data)
            plain = image.format == "JPEG" and image.mode in ("RGB", "L") and ext is None
            header = ImageHeader(int(image.size[0]), int(image.size[1]), plain)
    check_pixels(header.width, header.height, key)
    return header


def check_whole(data: bytes, key: str = "<bytes>") -> bool:
    """Check, as training's decoder would, that a whole file decodes; DecodeError naming ``key`` if not.

    A plain JPEG is decoded wholly by the extension at 1/8 scale (every row entropy-decoded, its refusals
    those of any crop: truncation, corrupt data, the scan and pixel limits) and True returned; False for
    what the extension does not take (PNG, CMYK, ...), which the caller checks with PIL."""
    ext = _jpeg_ext()
    if ext is None or not is_jpeg(data):
        return False
    header = read_header(data, key)  # the pixel limit, and a corrupt header refused
    if not header.plain_jpeg:
        return False
    try:
        ext.decode(data, scale_denom=8, fast=True)
    except UnsupportedJPEGError:
        return False
    except CorruptJPEGError as error:
        raise _refused(key, error) from None
    return True


def image_size(data: bytes, key: str = "<bytes>") -> tuple[int, int]:
    """``(width, height)`` of an encoded image, from its header alone; refuses decompression bombs."""
    header = read_header(data, key)
    return header.width, header.height


def decode_plan(
    data: bytes,
    plan: CropPlan,
    key: str = "<bytes>",
    out: np.ndarray | None = None,
    fast: bool = False,
    header: ImageHeader | None = None,
) -> np.ndarray:
    """Decode ``data`` to ``plan``: crop ``plan.box``, resize to ``plan.size``, flip; RGB uint8 H×W×3.

    ``out`` (optional, H×W×3 uint8, any strides: a slot of a batch buffer or of a cache) receives
    the pixels instead of a new array. ``fast``: libjpeg's fast IDCT and upsampling, and the
    extension's own resize (JPEG region decodes only; about one level from the exact pixels on
    average). ``header``: from :func:`read_header` when the caller has it (the pixel limit is then
    not checked again, and an image the region decoder does not take goes straight to PIL).
    """
    height, width = plan.size
    if out is None:
        out = np.empty((height, width, 3), dtype=np.uint8)
    elif out.shape != (height, width, 3) or out.dtype != np.uint8:
        raise ValueError(f"out must be a uint8 array of shape {(height, width, 3)}, got {out.dtype} {out.shape}")
    if plan.interpolation not in INTERPOLATIONS:
        raise ValueError(f"unknown interpolation {plan.interpolation!r}; expected one of {sorted(INTERPOLATIONS)}")
    ext = _jpeg_ext()
    if ext is not None and is_jpeg(data) and (header is None or header.plain_jpeg):
        try:
            _decode_with_ext(ext, data, plan, out, fast, header)
            return out
        except UnsupportedJPEGError:  # what the extension cannot do (CMYK, ...): PIL's job
            pass
        except CorruptJPEGError as error:  # refused: a bad file, never a second, more lenient decoder's
            raise _refused(key, error) from None
    with decode_errors(key):
        _decode_with_pil(data, plan, out, key, checked=header is not None)
    return out


def decode_plans(
    images: Sequence[tuple[bytes, ImageHeader, CropPlan]],
    out: np.ndarray,
    fast: bool,
    keys: Callable[[int], str],
    threads: int = 1,
) -> None:
    """:func:`decode_plan` of each ``(data, header, plan)`` into ``out[i]`` (uint8 N×H×W×3, packed pixels).

    For a fast decode the plain JPEGs (whatever ``jpeg_ext.decode_resized`` takes) go to the extension in one
    call, without the GIL for the whole batch and with no Python between images, on ``threads`` threads
    (``jpeg_ext.decode_resized_batch``); the rest, and the variants it leaves to PIL, one by one through
    :func:`decode_plan`. Errors name ``keys(i)``: the first image the extension refused raises its
    DecodeError. The pixels are those of :func:`decode_plan` with the same arguments, bit for bit.
    """
    if len(images) != len(out):
        raise ValueError(f"{len(images)} images for {len(out)} output slots")
    ext = _jpeg_ext()
    batched = ext is not None and fast and out.strides[2:] == (3, 1)
    jobs: list[tuple[Any, ...]] = []
    slots: list[int] = []
    rest: list[int] = []
    # By plan: a plan of a fixed transform serves every image of one size (FusedTransform.decode_batch).
    planned: dict[int, tuple[Any, ...] | None] = {}
    for slot, (data, header, plan) in enumerate(images):
        if plan.size != out.shape[1:3]:
            raise ValueError(f"{keys(slot)}: the plan's size {plan.size} is not the slot's {out.shape[1:3]}")
        if not (batched and header.plain_jpeg):
            rest.append(slot)
            continue
        if id(plan) not in planned:
            planned[id(plan)] = batch_job(plan, header.width, header.height)
        job = planned[id(plan)]
        if job is None:
            rest.append(slot)
            continue
        wanted, scale, source, crop, rect, code, padded = job
        if padded:
            out[slot] = 0  # torchvision pads a crop larger than the image with 0
        jobs.append((data, wanted, scale, source, crop, slot, rect, plan.flip, code))
        slots.append(slot)
    if jobs:
        assert ext is not None
        for position, error in ext.decode_resized_batch(jobs, out, fast, threads):
            if isinstance(error, CorruptJPEGError):
                raise _refused(keys(slots[position]), error)
            rest.append(slots[position])  # a variant PIL decodes (the extension said unsupported)
    for slot in rest:
        data, header, plan = images[slot]
        decode_plan(data, plan, keys(slot), out[slot], fast=fast, header=header)


def _refused(key: str, error: Exception) -> DecodeError:
    """The DecodeError for a file the JPEG extension refused (corrupt, truncated, over a limit), naming ``key``."""
    return DecodeError(f"{key}: cannot decode image ({error})")


def _decode_with_pil(data: bytes, plan: CropPlan, out: np.ndarray, key: str, checked: bool) -> None:
    image = open_image(data)
    width, height = image.size
    if not checked:
        check_pixels(width, height, key)
    region = visible_region(plan, width, height)
    scale = 1
    if region is not None and image.format == "JPEG":
        wanted = dct_scale(plan, region)
        # draft picks the largest DCT scale whose image is at least this size: exactly `wanted`.
        drafted = image.draft("RGB", (width // wanted, height // wanted)) if wanted > 1 else None
        if drafted is not None:
            scale = round(width / drafted[1][2])  # drafted box = (0, 0, width / scale, height / scale)
    image.load()
    _render(_to_rgb_or_gray(image), plan, region, 1.0 / scale, (0.0, 0.0), out)


def _to_rgb_or_gray(image: Any) -> Any:
    """RGB as decode_pil makes it, except grayscale, which is cheaper to resize before converting."""
    return image if image.mode == "L" else to_rgb(image)


def _decode_with_ext(
    ext: ModuleType, data: bytes, plan: CropPlan, out: np.ndarray, fast: bool, header: ImageHeader | None = None
) -> None:
    from PIL import Image

    if header is not None:  # read (and the pixel limit checked) by the caller: not parsed twice
        width, height = header.width, header.height
    else:
        width, height, _ = ext.jpeg_info(data)
        if (limit := pixel_limit()) is not None and width * height > limit:
            raise ValueError("over the pixel limit")  # the PIL path refuses it, naming the key
    region = visible_region(plan, width, height)
    if region is None:
        out[...] = 0
        return
    wanted, scale = window(plan, region, width, height)
    if fast and plan.interpolation in RESAMPLERS and out.strides[1:] == (3, 1):
        # One call, no GIL: the region decoded, resized and written into its slot (jpeg_ext.decode_resized).
        source, crop = scaled_source(region, scale)
        target = _target(plan, region, out)
        ext.decode_resized(data, wanted, scale, fast, source, crop, target, plan.flip, RESAMPLERS[plan.interpolation])
        return
    (x0, y0, x1, y1), _ = region
    # RGBX: PIL keeps RGB as 4 bytes a pixel, so it wraps these pixels without a copy.
    pixels, (ox, oy) = ext.decode_region(data, wanted, scale_denom=scale, fast=fast, rgbx=True)
    got_h, got_w = pixels.shape[:2]
    need = (math.floor(x0 / scale), math.floor(y0 / scale), math.ceil(x1 / scale), math.ceil(y1 / scale))
    reduced_w, reduced_h = -(-width // scale), -(-height // scale)
    if ox > need[0] or oy > need[1] or ox + got_w < min(need[2], reduced_w) or oy + got_h < min(need[3], reduced_h):
        raise RuntimeError(
            f"jpeg_ext.decode_region({wanted}, scale_denom={scale}) returned {got_w}x{got_h} at ({ox}, {oy}),"
            f" which does not cover {need}"
        )
    image = Image.frombuffer("RGBX", (got_w, got_h), pixels, "raw", "RGBX", 0, 1)
    _render(image, plan, region, 1.0 / scale, (float(ox), float(oy)), out)


def _render(
    image: Any,
    plan: CropPlan,
    region: tuple[FloatBox, tuple[int, int, int, int]] | None,
    factor: float,
    origin: tuple[float, float],
    out: np.ndarray,
) -> None:
    """Resize the visible part of ``image`` into ``out``, flip it, and zero the padding.

    ``image`` holds the source image scaled by ``factor``, its pixel [0, 0] at ``origin`` of the
    scaled image: source coordinate x is image coordinate ``x * factor - origin[0]``.
    """
    from PIL import Image

    if region is None:
        out[...] = 0
        return
    (x0, y0, x1, y1), (u0, v0, u1, v1) = region
    box = (x0 * factor - origin[0], y0 * factor - origin[1], x1 * factor - origin[0], y1 * factor - origin[1])
    resample = getattr(Image.Resampling, FILTERS[plan.interpolation][0])
    whole = whole_box(box)
    if whole is not None:
        # torchvision's RandomResizedCrop crops, then resizes: the filter sees no pixel outside the
        # box. Cropping first does the same, exactly, for a few microseconds.
        resized = image.crop(whole).resize((u1 - u0, v1 - v0), resample)
    else:
        # A fractional box is torchvision's resize-then-crop (Resize + CenterCrop): resizing with
        # the box samples exactly the pixels the full resize would, neighbours included.
        resized = image.resize((u1 - u0, v1 - v0), resample, box=box)
    _put(resized, _target(plan, region, out), plan.flip)


def _target(plan: CropPlan, region: tuple[FloatBox, tuple[int, int, int, int]], out: np.ndarray) -> np.ndarray:
    """The part of ``out`` the visible region is resized into (where a flip puts it); the rest zeroed."""
    (u0, v0, u1, v1), padded = target_rect(plan, region)
    if padded:
        out[...] = 0  # torchvision pads a crop larger than the image with 0
    return out[v0:v1, u0:u1]


def _put(image: Any, target: np.ndarray, flip: bool) -> None:
    """Write a resized image into its place in the output, mirrored left to right when ``flip``."""
    ext = _jpeg_ext()
    if ext is not None and image.mode in ("RGB", "RGBX") and hasattr(image, "__arrow_c_array__"):
        try:
            arrow = image.__arrow_c_array__()
        except ValueError:  # over Pillow's block size (16 MiB) an image is in pieces: no single buffer
            pass
        else:
            ext.pack_rgb(arrow, target, flip)  # in one pass, where tobytes and a copy take two
            return
    from PIL import Image

    if flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    target[...] = _rgb_view(image)


def _rgb_view(image: Any) -> np.ndarray:
    """The pixels of a resized image as an H×W×3 (or H×W×1, broadcast to 3) array.

    Packed by PIL: a numpy copy of the strided ``[..., :3]`` of RGBX is 10x slower (measured).
    """
    if image.mode == "RGBX":
        width, height = image.size
        return np.frombuffer(image.tobytes("raw", "RGB"), dtype=np.uint8).reshape(height, width, 3)
    if image.mode == "L":
        return np.asarray(image)[..., None]  # gray: resized at one channel, expanded on the copy into out
    return np.asarray(image if image.mode == "RGB" else image.convert("RGB"))
