"""Shared by the transform, decode, batching and cache tests: real photos in the formats datasets hold."""

from __future__ import annotations

import functools
import io

import numpy as np
from PIL import Image

from fastloader.sample import PHOTOS

# name -> (PIL mode saved, format, save options): what real datasets contain.
KINDS: dict[str, tuple[str, str, dict]] = {
    "jpeg": ("RGB", "JPEG", {"quality": 90}),
    "jpeg_progressive": ("RGB", "JPEG", {"quality": 85, "progressive": True}),
    "jpeg_gray": ("L", "JPEG", {"quality": 90}),
    "jpeg_cmyk": ("CMYK", "JPEG", {"quality": 90}),
    "png_rgba": ("RGBA", "PNG", {}),
    "png_palette": ("P", "PNG", {}),
}


@functools.cache
def _photo(index: int) -> Image.Image:
    paths = sorted(PHOTOS.glob("*.jpg"))
    with Image.open(paths[index % len(paths)]) as image:
        return image.convert("RGB")


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A crop of a real photograph, resized to ``width`` x ``height`` (RGB)."""
    rng = np.random.default_rng(seed)
    source = _photo(seed)
    sw, sh = source.size
    cw, ch = int(sw * rng.uniform(0.5, 0.9)), int(sh * rng.uniform(0.5, 0.9))
    x, y = int(rng.integers(0, sw - cw + 1)), int(rng.integers(0, sh - ch + 1))
    return source.crop((x, y, x + cw, y + ch)).resize((width, height), Image.Resampling.BICUBIC)


def encode(image: Image.Image, kind: str) -> bytes:
    """``image`` saved as ``kind`` (see KINDS)."""
    mode, fmt, options = KINDS[kind]
    converted = image.convert(mode, palette=Image.Palette.ADAPTIVE) if mode == "P" else image.convert(mode)
    if mode == "RGBA":  # a real alpha channel, not all-opaque
        alpha = np.linspace(0, 255, image.width, dtype=np.uint8)[None, :].repeat(image.height, 0)
        converted.putalpha(Image.fromarray(alpha))
    out = io.BytesIO()
    converted.save(out, format=fmt, **options)
    return out.getvalue()


@functools.cache
def photo_bytes(kind: str = "jpeg", width: int = 500, height: int = 375, seed: int = 0) -> bytes:
    return encode(photo(width, height, seed), kind)
