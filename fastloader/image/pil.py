"""PIL in one place: encoded bytes opened, the pixel limit checked, PIL's errors named, RGB made.

Every decode through PIL goes through here (the default ``decode`` of every dataset, the region
decoder's fallback in ``fastloader.image.decode``, masks in ``fastloader.fields.reader``, the pack's
re-encoding): one list of what PIL raises for bad data (:func:`decode_errors`, a
:class:`~fastloader.errors.DecodeError` naming the key), one decompression-bomb check
(:func:`check_pixels`) and one conversion to RGB (:func:`to_rgb`: grayscale, CMYK, palette and RGBA).
PIL itself is imported when first used.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import Any

from fastloader.errors import DecodeError


def pixel_limit() -> int | None:
    """PIL's ``Image.MAX_IMAGE_PIXELS``: larger images are refused before they are decoded (None: no limit)."""
    from PIL import Image

    return Image.MAX_IMAGE_PIXELS


def check_pixels(width: int, height: int, key: str) -> None:
    """Refuse, before decoding, an image larger than PIL's ``Image.MAX_IMAGE_PIXELS`` (a decompression
    bomb: a few KB of file that decode to gigabytes). Raise the limit there to accept larger images."""
    limit = pixel_limit()
    if limit is not None and width * height > limit:
        raise DecodeError(
            f"{key}: {width}x{height} = {width * height} pixels exceeds the limit of {limit}"
            " (PIL.Image.MAX_IMAGE_PIXELS; a decompression bomb?)"
        )


@contextlib.contextmanager
def decode_errors(key: str, what: str = "image") -> Iterator[None]:
    """Turn what PIL raises for bad data into a DecodeError naming the key (``cannot decode <what>``)."""
    from PIL import Image, UnidentifiedImageError

    try:
        yield
    except DecodeError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as error:
        raise DecodeError(f"{key}: cannot decode {what} ({type(error).__name__}: {error})") from error


def open_image(data: bytes) -> Any:
    """``PIL.Image.open`` of encoded bytes: the header is read, no pixel is decoded yet."""
    from PIL import Image

    return Image.open(io.BytesIO(data))


def to_rgb(image: Any) -> Any:
    """``image`` in RGB: grayscale, CMYK and palette converted, a palette's transparency through RGBA
    (PIL's documented path, without its warning)."""
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    return image if image.mode == "RGB" else image.convert("RGB")


def decode_pil(data: bytes, key: str = "<bytes>") -> Any:
    """Decode encoded image bytes to an RGB ``PIL.Image`` (grayscale, CMYK, palette, RGBA converted)."""
    with decode_errors(key):
        image = open_image(data)
        width, height = image.size
        check_pixels(width, height, key)  # before decoding: a decompression bomb never allocates
        image.load()
        return to_rgb(image)
