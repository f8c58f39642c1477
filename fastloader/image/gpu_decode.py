"""GPU decode (``DataLoaderX(decode_on="cuda")``): workers send encoded bytes and crop plans, the
main process decodes whole batches with nvJPEG and crops / resizes / flips on the GPU.

Why: on a machine with few cores per GPU, JPEG decode is the CPU's whole budget; nvJPEG moves it
to the GPU, and workers only read bytes and draw crop boxes (microseconds per image).

How (all in the loader's producer thread, on its side stream, never in a worker):
1. ``torchvision.io.decode_jpeg(list_of_byte_tensors, device="cuda")`` decodes the batch's JPEGs
   in one batched call (RGB).
2. Each image is cropped to its plan's box and resized to the plan's size with antialiased
   bilinear interpolation (as torchvision's CPU path), flipped when the plan says so, and
   written into one N×3×H×W uint8 batch.
3. What nvJPEG refuses, or what is not a plain 3- or 1-channel JPEG (CMYK/YCCK JPEGs, PNG, WebP),
   is decoded on the CPU with the same plan (``fastloader.decode.decode_plan``) and copied in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

_JPEG_SOI = b"\xff\xd8"


def is_encoded_batch(value: Any) -> bool:
    """True for the list of ``EncodedImage`` that collate makes of a GPU-decode batch."""
    from fastloader.image.batching import EncodedImage

    return isinstance(value, list) and bool(value) and all(isinstance(item, EncodedImage) for item in value)


def decode_encoded(batch: Any, device: torch.device) -> Any:
    """``batch`` with its list of encoded images (top level of a tuple / list / dict) replaced by a uint8 tensor."""
    if is_encoded_batch(batch):
        return decode_batch(batch, device)
    if isinstance(batch, dict) and any(is_encoded_batch(part) for part in batch.values()):
        return {name: decode_batch(part, device) if is_encoded_batch(part) else part for name, part in batch.items()}
    if isinstance(batch, (tuple, list)) and any(is_encoded_batch(part) for part in batch):
        parts = [decode_batch(part, device) if is_encoded_batch(part) else part for part in batch]
        return type(batch)(parts) if isinstance(batch, tuple) and not hasattr(batch, "_fields") else parts
    return batch


def _nvjpeg_ok(data: bytes) -> bool:
    """Plain JPEGs nvJPEG decodes correctly to RGB (CMYK / YCCK and non-JPEGs go to the CPU)."""
    if not data.startswith(_JPEG_SOI):
        return False
    import io

    from PIL import Image

    try:
        return Image.open(io.BytesIO(data)).mode in ("RGB", "L")  # reads the header only
    except (OSError, ValueError):
        return False  # the CPU path reports what is wrong with it, naming the key


def decode_batch(images: Sequence[Any], device: torch.device) -> torch.Tensor:
    """Decode, crop, resize and flip ``images`` (``EncodedImage``) into one N×3×H×W uint8 tensor on ``device``."""
    from torchvision.io import ImageReadMode, decode_jpeg

    sizes = {item.plan.size for item in images}
    if len(sizes) != 1:
        raise ValueError(f"GPU decode needs one output size per batch, got {sorted(sizes)}")
    (height, width) = sizes.pop()
    out = torch.empty((len(images), 3, height, width), dtype=torch.uint8, device=device)
    on_gpu = [
        i
        for i, item in enumerate(images)
        if (item.header.plain_jpeg if item.header is not None else _nvjpeg_ok(item.data))
    ]
    decoded: list[torch.Tensor] = []
    if on_gpu:
        encoded = [torch.frombuffer(bytearray(images[i].data), dtype=torch.uint8) for i in on_gpu]
        try:
            decoded = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=device)
        except RuntimeError:
            on_gpu, decoded = [], []  # nvJPEG refused one of them: decode this batch on the CPU
    for i, image in zip(on_gpu, decoded):
        out[i] = _crop_resize(image, images[i].plan)
    for i in sorted(set(range(len(images))) - set(on_gpu)):
        out[i] = _decode_on_cpu(images[i]).to(device, non_blocking=True)
    return out


def _crop_resize(image: torch.Tensor, plan: Any) -> torch.Tensor:
    """Crop ``image`` (3×H×W uint8 on the GPU) to the plan's box, resize, flip; zero where the box
    extends past the image (CenterCrop larger than the image pads, as torchvision does).

    Antialiased bilinear interpolation, as torchvision's CPU path; the result differs from the CPU
    decode by a level or two on average (IDCT and resampler implementations differ).
    """
    from fastloader.image.geometry import visible_region

    height, width = image.shape[1:]
    out = torch.zeros((3, *plan.size), dtype=torch.uint8, device=image.device)
    region = visible_region(plan, width, height)
    if region is None:
        return out
    (sx0, sy0, sx1, sy1), (u0, v0, u1, v1) = region
    if all(float(v).is_integer() for v in (sx0, sy0, sx1, sy1)):
        # A whole-pixel box (RandomResizedCrop): crop, then resize the crop, as torchvision does.
        crop = image[:, int(sy0) : int(sy1), int(sx0) : int(sx1)].unsqueeze(0).float()
        pixels = _resize(crop, (v1 - v0, u1 - u0))
    else:
        # A fractional box comes from Resize + CenterCrop: resize the whole image, then crop whole pixels.
        scale_x, scale_y = (u1 - u0) / (sx1 - sx0), (v1 - v0) / (sy1 - sy0)
        full = _resize(image.unsqueeze(0).float(), (round(height * scale_y), round(width * scale_x)))
        top, left = round(sy0 * scale_y), round(sx0 * scale_x)
        pixels = full[:, :, top : top + v1 - v0, left : left + u1 - u0]
    out[:, v0:v1, u0:u1] = pixels.round_().clamp_(0, 255).to(torch.uint8)[0]
    return out.flip(-1) if plan.flip else out


def _resize(batch: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    return torch.nn.functional.interpolate(batch, size=size, mode="bilinear", antialias=True, align_corners=False)


def _decode_on_cpu(item: Any) -> torch.Tensor:
    from fastloader.image.decode import decode_plan

    pixels: np.ndarray = decode_plan(item.data, item.plan, item.key)
    tensor = torch.from_numpy(np.ascontiguousarray(pixels)).permute(2, 0, 1)
    return tensor.pin_memory() if torch.cuda.is_available() else tensor
