"""The geometry of a region decode (``fastloader.image.decode``): what part of a JPEG a crop plan decodes, at
which DCT scale, and where its pixels go in the output.

The resampling filters and how far each reaches (:data:`FILTERS`: the margin a region decode must include),
the DCT scale a crop allows (:func:`dct_scale`), the window of the JPEG to decode (:func:`window`), the
region's box in the scaled image (:func:`scaled_source`) and the output rectangle it is resized into
(:func:`target_rect`); for a batch, the extension's arguments for one plan (:func:`batch_job`). Pure
functions of the plan and the image's size: no pixels here.
"""

from __future__ import annotations

import math
from typing import Any

from fastloader.image.geometry import CropPlan, FloatBox, visible_region, whole_box

# PIL resampling filter per torchvision interpolation name, and the filter's support radius in
# input pixels (scaled by the downscale factor): the margin a region decode must include.
FILTERS = {
    "nearest": ("NEAREST", 0.0),
    "nearest-exact": ("NEAREST", 0.0),
    "box": ("BOX", 0.5),
    "bilinear": ("BILINEAR", 1.0),
    "hamming": ("HAMMING", 1.0),
    "bicubic": ("BICUBIC", 2.0),
    "lanczos": ("LANCZOS", 3.0),
}
INTERPOLATIONS = frozenset(FILTERS)
# The filters jpeg_ext's own resize knows (PIL's convolutions, by its codes); nearest stays PIL's.
RESAMPLERS = {"box": 0, "bilinear": 1, "hamming": 2, "bicubic": 3, "lanczos": 4}
# DCT scaling averages blocks more crudely than an antialiased resize: scale only while the reduced
# image keeps 1.5x the output resolution, so the final resize still smooths. On the sample photos
# (RandomResizedCrop(128), Resize(146)+CenterCrop(128); 1024x768 re-encodes at 224) the mean
# |difference| from torchvision is <= 0.6 levels (worst image 1.5) against <= 1.1 (worst 3.6) when
# scaling right down to the output resolution, for 3-8% less speed-up.
DCT_ROOM = 1.5


def batch_job(plan: CropPlan, width: int, height: int) -> tuple[Any, ...] | None:
    """``decode_resized_batch``'s arguments for ``plan`` on a plain ``width`` x ``height`` JPEG, less the data,
    the slot and the flip (the window, the scale, the scaled box, crop, the output rectangle, the filter) and
    whether the output is padded; None where ``decode_plan`` must do it (nearest neighbour, a box that misses
    the image)."""
    if plan.interpolation not in RESAMPLERS:
        return None
    region = visible_region(plan, width, height)
    if region is None:
        return None
    wanted, scale = window(plan, region, width, height)
    source, crop = scaled_source(region, scale)
    rect, padded = target_rect(plan, region)
    return wanted, scale, source, crop, rect, RESAMPLERS[plan.interpolation], padded


def dct_scale(plan: CropPlan, region: tuple[FloatBox, tuple[int, int, int, int]]) -> int:
    """The largest DCT scale denominator whose reduced image keeps ``DCT_ROOM`` x the output resolution."""
    if FILTERS[plan.interpolation][1] < 0.5:
        return 1  # nearest neighbour picks pixels: an averaged reduced image would not match
    (x0, y0, x1, y1), (u0, v0, u1, v1) = region
    room = min((x1 - x0) / (u1 - u0), (y1 - y0) / (v1 - v0))
    for scale in (8, 4, 2):
        if room >= DCT_ROOM * scale:
            return scale
    return 1


def window(
    plan: CropPlan, region: tuple[FloatBox, tuple[int, int, int, int]], width: int, height: int
) -> tuple[tuple[int, int, int, int], int]:
    """The pixels to decode for ``region`` of a ``width`` x ``height`` JPEG, and the DCT scale to decode them at.

    The resampling filter reaches past the box: a margin is decoded too, so that the edge pixels are
    computed from the same neighbours as in a full decode."""
    scale = dct_scale(plan, region)
    (x0, y0, x1, y1), (u0, v0, u1, v1) = region
    reach = FILTERS[plan.interpolation][1] * max(1.0, (x1 - x0) / scale / (u1 - u0), (y1 - y0) / scale / (v1 - v0))
    margin = (math.ceil(reach) + 1) * scale
    wanted = (
        max(0, math.floor(x0) - margin),
        max(0, math.floor(y0) - margin),
        min(width, math.ceil(x1) + margin),
        min(height, math.ceil(y1) + margin),
    )
    return wanted, scale


def scaled_source(region: tuple[FloatBox, tuple[int, int, int, int]], scale: int) -> tuple[FloatBox, bool]:
    """The region's box in the image decoded at 1/``scale``, and whether it is whole pixels (crop, then resize)."""
    factor = 1.0 / scale
    x0, y0, x1, y1 = region[0]
    box = (x0 * factor, y0 * factor, x1 * factor, y1 * factor)
    return box, whole_box(box) is not None


def target_rect(
    plan: CropPlan, region: tuple[FloatBox, tuple[int, int, int, int]]
) -> tuple[tuple[int, int, int, int], bool]:
    """The output rectangle ``(u0, v0, u1, v1)`` the visible region goes to, mirrored for a flip, and whether
    the output has padding around it (zeros)."""
    out_h, out_w = plan.size
    u0, v0, u1, v1 = region[1]
    padded = (u1 - u0, v1 - v0) != (out_w, out_h)
    if plan.flip:
        u0, u1 = out_w - u1, out_w - u0
    return (u0, v0, u1, v1), padded
