"""The batched JPEG decoder behind GPU decode (``fastloader.image.gpu_decode``): torchcodec's when it is
installed and works, else torchvision's.

Why two: torchvision's ``torchvision.io.decode_jpeg`` (nvJPEG, batched) is deprecated since torchvision
0.29 in favour of torchcodec's ``torchcodec.decoders.decode_jpeg``, which takes the same list of
encoded byte tensors and returns the same RGB 3×H×W uint8 images on the device. torchvision stays the
fallback for installs without torchcodec.

Which one: :func:`jpeg_decoder` picks once per device and remembers: the environment variable
``FASTLOADER_JPEG_DECODER`` (``torchcodec`` or ``torchvision``) when set, else torchcodec if it imports
and decodes a probe image right, else torchvision. The choice is logged once and shown in
``DataLoaderX.stats()["gpu_decoder"]``.

One difference is handled here: torchcodec always applies a JPEG's EXIF orientation (a phone photo
comes out turned), where torchvision's decoder and fastloader's CPU path never do, and the crop plan
was drawn on the stored width and height. :func:`blank_exif_orientation` blanks the TIFF mark of every
APP1 segment of the (copied) bytes, so that no EXIF reader finds an orientation; the probe checks that
an image stored with orientation 6 comes back unturned, else torchcodec is not used.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fastloader.errors import JpegDecoderUnavailable

ENV = "FASTLOADER_JPEG_DECODER"
NAMES = ("torchcodec", "torchvision")
_PROBE_SIZE = (8, 16)  # height, width: not square, so that a turned image shows
_PROBE_RGB = (200, 30, 90)  # not grey, so that a wrong channel order shows
log = logging.getLogger("fastloader")


# torchcodec reports nvJPEG's statuses as numbers: 5 is NVJPEG_STATUS_ALLOCATOR_FAILURE (torchvision names it).
# A failed stream synchronization is a CUDA error (sticky), not a bad image either.
_NOT_A_BAD_IMAGE = re.compile(
    r"out of memory|ALLOCATOR_FAILURE|Failed to synchronize CUDA stream"
    r"|(?:Failed to (?:get image info|initialize batch decoding|decode batch)|nvjpegDecode failed): 5\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class JpegDecoder:
    """One batched JPEG decoder: ``decode(list of 1-D uint8 CPU tensors, device)`` -> RGB 3×H×W uint8
    images on ``device``; raises RuntimeError for data it cannot decode."""

    name: str
    version: str
    decode: Callable[[list[torch.Tensor], torch.device], list[torch.Tensor]]
    applies_exif: bool  # True: the bytes must go through blank_exif_orientation first

    def __str__(self) -> str:
        return f"{self.name} {self.version}"

    def prepare(self, data: bytes) -> torch.Tensor | None:
        """``data`` as the decoder takes it (a copy), or None when it must not decode it: a JPEG whose
        header this module cannot walk, so whose EXIF orientation it cannot blank (the CPU decodes it)."""
        copy = bytearray(data)
        if self.applies_exif and not blank_exif_orientation(copy):
            return None
        return torch.frombuffer(copy, dtype=torch.uint8)


def jpeg_decoder(device: torch.device, name: str | None = None) -> JpegDecoder:
    """The decoder GPU decode uses on ``device``: ``name``, else ``$FASTLOADER_JPEG_DECODER``, else the
    first of torchcodec and torchvision that works (chosen once per device)."""
    name = name or os.environ.get(ENV) or None
    if name is not None:
        if name not in NAMES:
            raise ValueError(f"{ENV}={name!r}: the JPEG decoders are {', '.join(NAMES)}")
        return _load(name, str(device))
    return _first_working(str(device))


@functools.cache
def _first_working(device: str) -> JpegDecoder:
    reasons = []
    for name in NAMES:
        try:
            decoder = _load(name, device)
        except JpegDecoderUnavailable as error:
            reasons.append(str(error))
            continue
        for reason in reasons:
            log.info("GPU decode: %s", reason)
        log.info("GPU decode: JPEGs on %s decoded by %s", device, decoder)
        return decoder
    raise JpegDecoderUnavailable(
        f"GPU decode (decode_on='cuda') on {device} needs torchcodec (pip install 'fastloader[gpu]') or"
        " torchvision: " + "; ".join(reasons)
    )


@functools.cache
def _load(name: str, device: str) -> JpegDecoder:
    """``name``'s decoder, checked on a probe image; JpegDecoderUnavailable (why) if it cannot be used."""
    decoder = _import(name)
    try:
        images = decoder.decode([_probe_bytes(decoder)], torch.device(device))
    except RuntimeError as error:
        raise JpegDecoderUnavailable(f"{decoder} cannot decode JPEGs on {device}: {error}") from error
    problem = _probe_problem(images, torch.device(device))
    if problem is not None:
        raise JpegDecoderUnavailable(f"{decoder} decoded a probe JPEG wrongly on {device}: {problem}")
    return decoder


def _probe_problem(images: list[torch.Tensor], device: torch.device) -> str | None:
    """What is wrong with the probe's decode (None: nothing): one 3×8×16 uint8 image on ``device``, unturned,
    its colour the probe's within JPEG's error."""
    if len(images) != 1:
        return f"{len(images)} images for one"
    image = images[0]
    if tuple(image.shape) != (3, *_PROBE_SIZE) or image.dtype != torch.uint8 or image.device != device:
        turned = " (turned by its EXIF orientation)" if tuple(image.shape) == (3, *_PROBE_SIZE[::-1]) else ""
        expected = f"3x{_PROBE_SIZE[0]}x{_PROBE_SIZE[1]} uint8"
        return f"{tuple(image.shape)} {image.dtype} on {image.device}{turned}, not {expected}"
    colour = image.float().mean(dim=(1, 2)).cpu()
    if (colour - torch.tensor(_PROBE_RGB, dtype=torch.float32)).abs().max() > 8:
        return f"colour {[round(v) for v in colour.tolist()]}, not {list(_PROBE_RGB)}"
    return None


def _import(name: str) -> JpegDecoder:
    from importlib.metadata import PackageNotFoundError, version

    try:
        if name == "torchcodec":
            from torchcodec.decoders import ImageReadMode as CodecMode
            from torchcodec.decoders import decode_jpeg as codec_decode

            def decode(encoded: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
                return list(codec_decode(encoded, mode=CodecMode.RGB, device=device))

            applies_exif = True
        else:
            from torchvision.io import ImageReadMode as VisionMode
            from torchvision.io import decode_jpeg as vision_decode

            def decode(encoded: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
                return list(vision_decode(encoded, mode=VisionMode.RGB, device=device))

            applies_exif = False
    except (ImportError, OSError, RuntimeError) as error:  # not installed, or its native libraries do not load
        raise JpegDecoderUnavailable(f"{name} is not usable: {type(error).__name__}: {error}") from error
    try:
        installed = version(name)
    except PackageNotFoundError:
        installed = "?"
    return JpegDecoder(name, installed, decode, applies_exif)


def _probe_bytes(decoder: JpegDecoder) -> torch.Tensor:
    """A small JPEG stored with EXIF orientation 6 ("turn 90°"), prepared as GPU decode prepares its images."""
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    Image.new("RGB", _PROBE_SIZE[::-1], _PROBE_RGB).save(out, format="JPEG", exif=exif.tobytes())
    prepared = decoder.prepare(out.getvalue())
    if prepared is None:
        raise JpegDecoderUnavailable("the probe JPEG's header could not be walked")
    return prepared


def not_a_bad_image(error: RuntimeError) -> bool:
    """True for a decoder's error that says nothing about the image (out of memory, a CUDA error): never
    a reason to decode the image on the CPU or to call it bad."""
    return isinstance(error, torch.cuda.OutOfMemoryError) or _NOT_A_BAD_IMAGE.search(str(error)) is not None


def blank_exif_orientation(data: bytearray) -> bool:
    """Blank, in place, the TIFF mark (0x2A) of every APP1 segment before the scan, so that no EXIF reader
    finds an orientation (torchcodec's readers both give up on a wrong mark; a JPEG decoder skips APP1).
    False, ``data`` perhaps half-blanked, when the markers before the scan are not a clean chain of
    segments (padding, garbage, a length past the end): the caller does not give such bytes to a decoder
    that would apply an orientation."""
    pos, end = 2, len(data)
    while pos + 4 <= end:
        marker = data[pos + 1]
        if data[pos] != 0xFF or marker == 0xFF or 0xD0 <= marker <= 0xD8 or marker == 0x01:
            return False  # not a marker, fill bytes, or a marker without a length: not a plain header
        if marker in (0xDA, 0xD9):  # start of scan (no metadata after it), end of image
            return True
        length = (data[pos + 2] << 8) | data[pos + 3]
        if length < 2 or pos + 2 + length > end:
            return False
        if marker == 0xE1 and length >= 12:  # length, "Exif\0\0", byte order, then the mark
            data[pos + 12 : pos + 14] = b"\0\0"
        pos += 2 + length
    return False
