"""PIL in one place: encoded bytes opened, the pixel limit checked, PIL's errors named, RGB made.

Every decode through PIL goes through here (the default ``decode`` of every dataset, the region
decoder's fallback in ``fastloader.image.decode``, masks in ``fastloader.fields.reader``, the pack's
re-encoding): one list of what PIL raises for bad data (:func:`decode_errors`, a
:class:`~fastloader.errors.DecodeError` naming the key), one decompression-bomb check
(:func:`check_pixels`) and one conversion to RGB (:func:`to_rgb`: grayscale, CMYK, palette and RGBA).
:func:`resize_pass_order` says how the installed PIL orders a resize's two passes (the extension's resize
follows it). PIL itself is imported when first used.
"""

from __future__ import annotations

import contextlib
import functools
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
    # SyntaxError, EOFError: what PIL's PNG (and other) plugins raise for a broken chunk or cut data.
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as error:
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


# How a PIL orders the two passes of a resize where both change the image (the rounding and clipping to
# 8 bits between them make the orders differ, by tens of levels where a filter overshoots).
HORIZONTAL_FIRST = "horizontal-first"  # always: Pillow-SIMD, Pillow before 13
PILLOW_13 = "pillow-13"  # the vertical first when the height loses more pixels than twice what the width loses


def _stripes(width: int, height: int) -> Any:
    from PIL import Image

    pixels = bytes(255 if (x * 3 + y * 5) % 7 < 3 else 0 for y in range(height) for x in range(width) for _ in "rgb")
    return Image.frombytes("RGB", (width, height), pixels)


def _runs_first(image: Any, size: tuple[int, int]) -> str | None:
    """Which pass PIL ran first resizing ``image`` to ``size`` (Lanczos): its result against the two passes
    alone (each a resize of one side), composed each way. None when it is neither."""
    from PIL import Image

    lanczos, (width, height) = Image.Resampling.LANCZOS, image.size
    result = image.resize(size, lanczos).tobytes()
    if result == image.resize((size[0], height), lanczos).resize(size, lanczos).tobytes():
        return "horizontal"
    if result == image.resize((width, size[1]), lanczos).resize(size, lanczos).tobytes():
        return "vertical"
    return None


@functools.cache
def resize_pass_order() -> str:
    """How the installed PIL orders a resize's passes: :data:`HORIZONTAL_FIRST` or :data:`PILLOW_13`, found by
    resizing two small striped images whose orders differ (12x40 to 16x9: Pillow 13 runs the vertical first;
    40x30 to 9x25: it does not). :data:`HORIZONTAL_FIRST` for a PIL that does neither."""
    if _runs_first(_stripes(12, 40), (16, 9)) == "vertical" and _runs_first(_stripes(40, 30), (9, 25)) == "horizontal":
        return PILLOW_13
    return HORIZONTAL_FIRST
