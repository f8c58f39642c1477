"""Masks and boxes follow the pixels: the steps of a crop plan replayed as torchvision v2 applies them.

A fused transform folds its steps into one crop box so that the image is resampled once
(``fastloader.image.geometry``); it also keeps the steps themselves (``CropPlan.steps``). Annotations
replay those steps one by one, with torchvision v2's arithmetic, so that a mask or a box after our
``RandomResizedCrop`` / ``Resize`` / ``CenterCrop`` / ``RandomHorizontalFlip`` equals torchvision's
``tv_tensors.Mask`` / ``tv_tensors.BoundingBoxes`` after the same transforms with the same parameters:

* **masks** (class ids, not colours) are resampled nearest-neighbour, as torchvision's ``resize_mask``:
  each step maps output pixels to source pixels on each axis (``torch.nn.functional.interpolate``'s
  own nearest indices, computed on a 1-D ramp), and the mask is gathered once at the end; pixels
  outside the image (a ``CenterCrop`` larger than it) are 0;
* **boxes** (float32, XYXY in pixels) are shifted and clamped to the canvas by a crop, scaled by a
  resize and mirrored by a flip, as ``crop_bounding_boxes`` / ``resize_bounding_boxes`` /
  ``horizontal_flip_bounding_boxes`` do. A box the crop leaves empty keeps zero width or height;
  :func:`keep_boxes` says which to keep (torchvision's ``SanitizeBoundingBoxes`` rule).
"""

from __future__ import annotations

import numpy as np
import torch

from fastloader.image.geometry import CropPlan

BOX_FORMATS = ("xyxy", "xywh", "cxcywh")


def _nearest(indices: np.ndarray, size: int) -> np.ndarray:
    """``indices`` resampled to ``size`` entries with torch's nearest rule (what ``resize_mask`` uses)."""
    if size == len(indices):
        return indices
    # float32, as the uint8 mask kernel computes its scale (a float64 ramp would round some indices differently)
    ramp = torch.from_numpy(indices.astype(np.float32)).view(1, 1, -1)
    return torch.nn.functional.interpolate(ramp, size=size, mode="nearest").view(-1).numpy().astype(np.int64)


def _cropped(indices: np.ndarray, low: int, high: int) -> np.ndarray:
    """Entries ``low .. high - 1`` of ``indices``; -1 (padding) outside it."""
    positions = np.arange(low, high)
    inside = (positions >= 0) & (positions < len(indices))
    return np.where(inside, indices[np.clip(positions, 0, max(len(indices) - 1, 0))], -1)


def _steps(plan: CropPlan, what: str) -> CropPlan:
    if plan.source_size is None:
        raise ValueError(f"a {what} follows a crop plan made by a fastloader transform (this one has no steps)")
    return plan


def follow_mask(mask: np.ndarray, plan: CropPlan) -> np.ndarray:
    """``mask`` (H×W or H×W×C, any dtype) after the plan's steps: ``plan.size`` pixels, nearest."""
    width, height = _steps(plan, "mask").source_size  # type: ignore[misc]
    if mask.shape[:2] != (height, width):
        raise ValueError(f"the mask is {mask.shape[1]}x{mask.shape[0]} pixels, the image {width}x{height}")
    xs, ys = np.arange(width), np.arange(height)
    for kind, args in plan.steps:
        if kind in ("crop", "center_crop"):
            x0, y0, x1, y1 = args[:4]
            xs, ys = _cropped(xs, x0, x1), _cropped(ys, y0, y1)
        elif kind == "resize":
            xs, ys = _nearest(xs, args[0]), _nearest(ys, args[1])
        elif kind == "flip":
            xs = xs[::-1]
    out = mask[np.ix_(np.maximum(ys, 0), np.maximum(xs, 0))]
    outside = (ys < 0)[:, None] | (xs < 0)[None, :]
    if outside.any():
        out[outside] = 0
    return out


def to_xyxy(boxes: torch.Tensor, format: str) -> torch.Tensor:
    """``boxes`` (N×4 float32) from ``format`` to XYXY."""
    if format == "xyxy":
        return boxes
    if format == "xywh":
        return torch.cat([boxes[:, :2], boxes[:, :2] + boxes[:, 2:]], dim=1)
    if format == "cxcywh":
        half = boxes[:, 2:] / 2
        return torch.cat([boxes[:, :2] - half, boxes[:, :2] + half], dim=1)
    raise ValueError(f"box format must be one of {', '.join(BOX_FORMATS)}, got {format!r}")


def follow_boxes(boxes: torch.Tensor, plan: CropPlan) -> torch.Tensor:
    """XYXY ``boxes`` (N×4 float32, source pixels) after the plan's steps, as torchvision v2 moves them."""
    width, height = _steps(plan, "box").source_size  # type: ignore[misc]
    boxes = boxes.to(torch.float32)
    for kind, args in plan.steps:
        if kind in ("crop", "center_crop"):
            x0, y0, x1, y1 = args
            if kind == "center_crop":
                # torchvision centres boxes with its own rounding, which differs from the image's by a
                # pixel when the crop pads: boxes follow torchvision's boxes, not its pixels.
                x0, y0 = int(round((width - (x1 - x0)) / 2.0)), int(round((height - (y1 - y0)) / 2.0))
                x1, y1 = x0 + args[2] - args[0], y0 + args[3] - args[1]
            boxes = boxes - torch.tensor([x0, y0, x0, y0], dtype=torch.float32)
            width, height = x1 - x0, y1 - y0
            boxes[:, 0::2].clamp_(min=0, max=width)
            boxes[:, 1::2].clamp_(min=0, max=height)
        elif kind == "resize":
            new_width, new_height = args
            ratios = torch.tensor([new_width / width, new_height / height] * 2)
            boxes = boxes.mul(ratios)
            width, height = new_width, new_height
        elif kind == "flip":
            boxes = boxes.clone()
            boxes[:, [2, 0]] = boxes[:, [0, 2]].sub(width).neg()
    return boxes


def keep_boxes(boxes: torch.Tensor, min_size: float = 1.0) -> torch.Tensor:
    """Which XYXY boxes to keep: width and height at least ``min_size`` (``SanitizeBoundingBoxes``'s rule)."""
    sizes = boxes[:, 2:] - boxes[:, :2]
    return (sizes >= min_size).all(dim=1)
