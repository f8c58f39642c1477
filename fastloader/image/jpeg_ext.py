"""Partial JPEG decoding: decode only a crop region, optionally DCT-scaled, with libjpeg-turbo.

A thin typed wrapper over the optional C extension ``fastloader.image._jpeg``. ``AVAILABLE`` is False when
the extension was not built (no libjpeg-turbo headers at install time); callers then decode with PIL.

``decode_resized`` also resizes the region into a batch slot in the same call (``_resample.c``), so that a
small image needs no PIL image at all: PIL's filters, weights and 8-bit passes, in the order the installed
PIL runs them (:func:`set_pass_order`), the weights in 16 bits as Pillow-SIMD keeps them. Pillow-SIMD's
pixels exactly; Pillow's (22-bit weights) within two levels.

Exactness: with ``fast=False`` every returned pixel equals the same pixel of PIL's decode of the same
bytes at the same scale (both use the system libjpeg-turbo, accurate integer IDCT, fancy upsampling),
including the columns and rows outside the requested box. ``fast=True`` uses the fast integer IDCT and
plain (non-fancy) chroma upsampling: a little faster, off by a few levels at chroma edges.

Errors: ``CorruptJPEGError`` (a ``ValueError``) for data this decoder refuses: corrupt or truncated data
(including warnings that libjpeg would paper over with grey rows, and a file cut below the requested box:
the rows below it are entropy-decoded too), non-JPEG bytes, absurd dimensions (more than ``MAX_PIXELS``)
and more than ``MAX_SCANS`` scans (counted before any is decoded). A refused file is a bad file: callers
never hand it to a more lenient decoder. ``UnsupportedJPEGError`` (a ``NotImplementedError``) for valid
JPEGs this decoder leaves to PIL (CMYK, YCCK, 12-bit, lossless). ``ValueError`` for bad arguments.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastloader.errors import CorruptJPEGError, UnsupportedJPEGError
from fastloader.image.pil import HORIZONTAL_FIRST, PILLOW_13, resize_pass_order


def _load_extension() -> Any:
    try:
        return importlib.import_module("fastloader.image._jpeg")
    except ImportError:  # not built (no libjpeg-turbo headers at install), or libjpeg missing at run time
        return None


_ext: Any = _load_extension()
AVAILABLE: bool = _ext is not None
# The libjpeg-turbo the extension was compiled against, e.g. 2001005 for 2.1.5; None when not built.
LIBJPEG_TURBO_VERSION: int | None = _ext.LIBJPEG_TURBO_VERSION if _ext is not None else None
# Whether decode_resized's passes run with AVX2 on this CPU (else plain C: the same pixels, slower).
RESIZE_SIMD: bool = bool(_ext.RESIZE_SIMD) if _ext is not None else False
MAX_PIXELS = 1 << 28  # larger images are rejected from their header (decompression bombs)
# More scans than this are refused, counted from the markers before any is decoded (the progressive DoS).
MAX_SCANS: int = int(_ext.MAX_SCANS) if _ext is not None else 500
# Threads one decode_resized_batch call may run on: the extension's own limit (16 where it is not built).
MAX_THREADS: int = int(_ext.MAX_THREADS) if _ext is not None else 16
# The most filter weights the resize plans for one axis of an image (taps x output pixels): a ``source`` box
# that would take more is refused (ValueError) before anything is decoded.
MAX_AXIS_WEIGHTS: int = int(_ext.MAX_AXIS_WEIGHTS) if _ext is not None else 1 << 22
SCALE_DENOMS = (1, 2, 4, 8)
# The resize's pass orders (fastloader.image.pil), by the extension's codes.
PASS_ORDERS = (HORIZONTAL_FIRST, PILLOW_13)
_pass_order: str | None = None  # None until the first resize sets the installed PIL's

__all__ = [
    "AVAILABLE",
    "LIBJPEG_TURBO_VERSION",
    "MAX_AXIS_WEIGHTS",
    "MAX_PIXELS",
    "MAX_SCANS",
    "MAX_THREADS",
    "PASS_ORDERS",
    "RESIZE_SIMD",
    "SCALE_DENOMS",
    "decode",
    "decode_region",
    "decode_resized",
    "decode_resized_batch",
    "jpeg_info",
    "pack_rgb",
    "set_pass_order",
]


def _module() -> Any:
    if _ext is None:
        raise RuntimeError("fastloader.image._jpeg is not built (no libjpeg-turbo headers at install); check AVAILABLE")
    return _ext


def _call(name: str, *args: Any) -> Any:
    """The extension's ``name(*args)``, its errors as fastloader's (the data's fault: refused or unsupported)."""
    module = _module()
    try:
        return getattr(module, name)(*args)
    except NotImplementedError as error:
        raise UnsupportedJPEGError(str(error)) from None
    except module.CorruptJPEG as error:
        raise CorruptJPEGError(str(error)) from None


def set_pass_order(order: str) -> str:
    """Which pass of :func:`decode_resized`'s resize runs first where both change the image, for every thread of
    the process: one of ``PASS_ORDERS`` (see ``fastloader.image.pil``). Returns the order before. Unset, the
    first resize sets the installed PIL's (:func:`~fastloader.image.pil.resize_pass_order`), so that the pixels
    are that PIL's; set it before resizing, not while other threads resize."""
    global _pass_order
    if order not in PASS_ORDERS:
        raise ValueError(f"order must be one of {PASS_ORDERS}, got {order!r}")
    previous = PASS_ORDERS[_module().set_pass_order(PASS_ORDERS.index(order))]
    _pass_order = order
    return previous


def _resizer() -> None:
    """Before a resize: the installed PIL's pass order, unless one was set."""
    if _pass_order is None:
        set_pass_order(resize_pass_order())


def _check_scale(scale_denom: int) -> None:
    if scale_denom not in SCALE_DENOMS:
        raise ValueError(f"scale_denom must be one of {SCALE_DENOMS}, got {scale_denom!r}")


def jpeg_info(data: bytes) -> tuple[int, int, int]:
    """(width, height, n_components) from the JPEG header only; ValueError if it is not a readable JPEG."""
    width, height, components = _call("info", data)
    return int(width), int(height), int(components)


def _run(data: bytes, box: tuple[int, int, int, int] | None, scale_denom: int, fast: bool, rgbx: bool = False) -> Any:
    _check_scale(scale_denom)
    return _call("decode", data, box, scale_denom, bool(fast), bool(rgbx))


def _array(buffer: bytearray, offset: int, height: int, width: int, channels: int = 3) -> np.ndarray:
    # The bytearray carries a few bytes of slack around the pixels (see read_rows in _jpeg.c): frombuffer
    # views the packed pixels without a copy, writable because a bytearray is.
    pixels = np.frombuffer(buffer, dtype=np.uint8, count=height * width * channels, offset=offset)
    return pixels.reshape(height, width, channels)


def decode_region(
    data: bytes, box: tuple[int, int, int, int], scale_denom: int = 1, fast: bool = False, rgbx: bool = False
) -> tuple[np.ndarray, tuple[int, int]]:
    """Decode box=(x0, y0, x1, y1) (full-resolution pixels) at 1/scale_denom into RGB uint8 (H', W', 3).

    The array may cover a little more than the box (columns from an iMCU boundary, whole scaled rows);
    the second value is (ox, oy), the scaled-image coordinates of pixel [0, 0], so the box in array
    coordinates is (x0 / scale_denom - ox, y0 / scale_denom - oy, x1 / scale_denom - ox, ...).
    Only the box's rows are colour-converted; the rows above and below it are entropy-decoded only (so that
    a file truncated anywhere is refused, whatever the box).
    ``rgbx``: 4 bytes per pixel (the 4th unspecified), the layout PIL stores RGB in, so that
    ``Image.frombuffer("RGBX", ...)`` wraps the pixels without a copy.
    """
    if len(box) != 4:
        raise ValueError(f"box must be (x0, y0, x1, y1), got {box!r}")
    x0, y0, x1, y1 = box
    buffer, offset, height, width, ox, oy = _run(data, (x0, y0, x1, y1), scale_denom, fast, rgbx)
    return _array(buffer, offset, height, width, 4 if rgbx else 3), (ox, oy)


def decode(data: bytes, scale_denom: int = 1, fast: bool = False) -> np.ndarray:
    """Decode the whole image at 1/scale_denom (size ceil(width / scale_denom) etc.) into RGB uint8 (H, W, 3)."""
    buffer, offset, height, width, _, _ = _run(data, None, scale_denom, fast)
    return _array(buffer, offset, height, width)


def decode_resized(
    data: bytes,
    box: tuple[int, int, int, int],
    scale_denom: int,
    fast: bool,
    source: tuple[float, float, float, float],
    crop: bool,
    out: np.ndarray,
    flip: bool,
    filter_code: int,
) -> None:
    """Decode ``box`` (as :func:`decode_region`), resize part of it into ``out``, in one call without the GIL.

    ``source``: the part resized, (x0, y0, x1, y1) in fractional pixels of the image scaled by
    1/scale_denom; ``crop``: ``source`` is whole pixels and the filter sees no pixel outside it (PIL's crop
    then resize), else the filter reads the decoded neighbours (PIL's resize with a box). ``out``: uint8
    (H, W, 3) with packed pixels, any row stride; mirrored left to right when ``flip``. ``filter_code``: 0 box,
    1 bilinear, 2 hamming, 3 bicubic, 4 lanczos: PIL's filters, weights and 8-bit passes in the installed PIL's
    order, the weights in 16 bits as Pillow-SIMD keeps them (Pillow-SIMD's pixels exactly, Pillow's within two
    levels). Errors as :func:`decode_region`; ValueError also for a ``source`` that is not a box or that no
    image is large enough for (its filter weights past the extension's limit); RuntimeError if the rows
    decoded for ``box`` do not cover ``source``.
    """
    _check_scale(scale_denom)
    _resizer()
    _call("decode_resized", data, box, scale_denom, fast, source, crop, out, flip, filter_code)


def decode_resized_batch(
    jobs: Sequence[tuple[Any, ...]], out: np.ndarray, fast: bool, threads: int = 1
) -> list[tuple[int, Exception]]:
    """:func:`decode_resized` for a whole batch, in one call without the GIL in between, on ``threads`` threads
    (the caller's and up to ``threads - 1`` started for the call; at most ``MAX_THREADS``).

    ``out``: uint8 (N, H, W, 3) with packed pixels. Each job: ``(data, box, scale_denom, source, crop, slot,
    rect, flip, filter_code)``, as :func:`decode_resized`'s arguments, the image going to ``out[slot]`` at
    ``rect`` = (u0, v0, u1, v1), already mirrored for ``flip`` (the rest of the slot is left as it is).
    Returns ``(position in jobs, error)`` for the jobs whose data the extension did not decode: a
    ``CorruptJPEGError`` (a bad file) or an ``UnsupportedJPEGError`` (a variant for PIL); every other
    job's pixels are in ``out``.
    Bad arguments raise ValueError (naming the job), rows that miss a job's ``source`` RuntimeError (a planning
    bug). ``jobs`` is copied before any job is read: a job's field that changes the caller's list is harmless.
    """
    _resizer()
    refused = _call("decode_resized_batch", jobs, out, bool(fast), int(threads))
    return [
        (position, UnsupportedJPEGError(message) if unsupported else CorruptJPEGError(message))
        for position, unsupported, message in refused
    ]


def pack_rgb(arrow: tuple[Any, Any], out: np.ndarray, flip: bool = False) -> None:
    """Copy an RGB or RGBX PIL image into ``out``, mirrored left to right when ``flip``.

    ``arrow``: the image's ``__arrow_c_array__()`` pair (Pillow >= 11.2 exports its pixels without a copy);
    ``out``: uint8 (H, W, 3) with packed pixels, any row stride (a slot of a batch buffer, or part of one).
    One pass, where ``tobytes("raw", "RGB")`` and a numpy copy take two (measured: 16 against 45 µs at 224²).
    """
    _module().pack_rgb(arrow, out, bool(flip))
