"""Crop geometry: torchvision's crop boxes and output sizes, computed from an image's size alone.

Everything here works on sizes, not pixels, so a crop can be planned from a JPEG header before
anything is decoded. The functions reproduce torchvision exactly (same formulas, same rounding,
same random draws from torch's RNG, so DataLoader worker seeding and ``torch.manual_seed`` apply):

* :func:`random_resized_crop_box` is ``RandomResizedCrop.get_params``;
* :func:`resize_size` is the output size of ``Resize``;
* :func:`center_crop_box` is ``CenterCrop``, including its zero padding of a crop larger than the
  image: the box then extends past the image, and the pixels outside it are 0.

A chain of geometric transforms folds into one :class:`CropPlan` through a :class:`Frame`: the
affine map from the current (virtual) image's pixel coordinates back to source pixels.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

Box = tuple[int, int, int, int]
FloatBox = tuple[float, float, float, float]
# One geometric step as torchvision applies it, in order: ("crop", (x0, y0, x1, y1)) in the current
# image's pixels (may extend past it: zero padding), ("center_crop", box) likewise, ("resize",
# (width, height)), ("flip", ()).
# Masks and boxes replay these steps one by one (fastloader.image.annotations), which is what makes
# them equal torchvision's; pixels take the folded box, one resampling instead of several.
Step = tuple[str, tuple[int, ...]]

# A box coordinate closer than this to an integer is that integer (float noise of the fold).
_EPSILON = 1e-6


@dataclass(frozen=True)
class CropPlan:
    """How to make one output image from a source image: crop ``box``, resize to ``size``, flip.

    ``box`` is ``(x0, y0, x1, y1)`` in source pixels (x1, y1 exclusive). It may extend past the
    image (a ``CenterCrop`` larger than the image): the pixels outside the image are 0, as in
    torchvision (``visible_region()`` splits it). ``size`` is the output ``(height, width)``;
    ``flip`` mirrors the output left-right. ``exact_box`` is the box torchvision's resampling
    really samples when it does not fall on whole pixels (``Resize(256)`` then ``CenterCrop(224)``
    crops at fractional source coordinates); ``box`` is then its rounding. ``interpolation`` names
    the resampling filter (torchvision's ``InterpolationMode`` values: "bilinear", "bicubic", ...).
    """

    box: Box
    size: tuple[int, int]
    flip: bool
    exact_box: FloatBox | None = None
    interpolation: str = "bilinear"
    # The source image's (width, height) and the steps that made the plan (see ``Step``): empty for a
    # plan built by hand, which then holds only the folded box.
    source_size: tuple[int, int] | None = field(default=None, compare=False)
    steps: tuple[Step, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        x0, y0, x1, y1 = self.box
        if x1 <= x0 or y1 <= y0:
            raise ValueError(f"CropPlan box must have x1 > x0 and y1 > y0, got {self.box}")
        if min(self.size) < 1:
            raise ValueError(f"CropPlan size must be positive, got {self.size}")

    @property
    def source_box(self) -> FloatBox:
        """The box in (possibly fractional) source pixels: ``exact_box`` when set, else ``box``."""
        if self.exact_box is not None:
            return self.exact_box
        x0, y0, x1, y1 = self.box
        return float(x0), float(y0), float(x1), float(y1)


def random_resized_crop_box(
    width: int,
    height: int,
    scale: Sequence[float] = (0.08, 1.0),
    ratio: Sequence[float] = (3 / 4, 4 / 3),
    generator: torch.Generator | None = None,
) -> Box:
    """torchvision's ``RandomResizedCrop.get_params`` as a box ``(x0, y0, x1, y1)``.

    torchvision returns ``(i, j, h, w)``: here ``x0 = j``, ``y0 = i``, ``x1 = j + w``, ``y1 = i + h``.
    The random draws are torchvision's, one for one, so the same seed gives the same box.
    """
    area = height * width
    # float32 logs and exps, as torchvision computes them: the boxes must match bit for bit.
    log_lo, log_hi = _log_ratio(ratio[0], ratio[1])
    # One scratch tensor of each dtype, drawn into in place: the same kernels and the same draws as
    # torchvision's torch.empty(1).uniform_, torch.exp and torch.randint (which is empty().random_),
    # for half the time (this runs once per image, and the tensor allocations dominated it).
    draw, index = torch.empty(1), torch.empty(1, dtype=torch.int64)
    for _ in range(10):
        target_area = area * draw.uniform_(scale[0], scale[1], generator=generator).item()
        aspect = draw.uniform_(log_lo, log_hi, generator=generator).exp_().item()
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            i = int(index.random_(0, height - h + 1, generator=generator).item())
            j = int(index.random_(0, width - w + 1, generator=generator).item())
            return j, i, j + w, i + h
    # Fallback to a central crop of the nearest allowed aspect ratio.
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    i, j = (height - h) // 2, (width - w) // 2
    return j, i, j + w, i + h


@functools.lru_cache(maxsize=64, typed=True)  # typed: torch.tensor makes float64 of numpy float64s
def _log_ratio(low: float, high: float) -> tuple[float, float]:
    """torchvision's ``torch.log(torch.tensor(ratio))`` as Python floats: a constant of each transform."""
    log_lo, log_hi = torch.log(torch.tensor([low, high])).tolist()
    return log_lo, log_hi


def resize_size(width: int, height: int, size: int | Sequence[int], max_size: int | None = None) -> tuple[int, int]:
    """The ``(height, width)`` torchvision's ``Resize(size, max_size=max_size)`` makes of an image.

    An int (or a 1-sequence) sets the shorter side, keeping the aspect ratio (truncated, as
    torchvision); ``(h, w)`` is taken as is.
    """
    if isinstance(size, int) or len(size) == 1:
        requested = size if isinstance(size, int) else int(size[0])
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = requested, int(requested * long / short)
        if max_size is not None:
            if max_size <= requested:
                raise ValueError(f"max_size = {max_size} must be strictly greater than the requested size {requested}")
            if new_long > max_size:
                new_short, new_long = int(max_size * new_short / new_long), max_size
        new_w, new_h = (new_short, new_long) if width <= height else (new_long, new_short)
        return new_h, new_w
    if len(size) != 2:
        raise ValueError(f"size must be an int or a 1- or 2-sequence, got {size!r}")
    if max_size is not None:
        raise ValueError("max_size is only allowed when size gives the shorter side (an int)")
    return int(size[0]), int(size[1])


def center_crop_box(width: int, height: int, size: tuple[int, int]) -> Box:
    """torchvision's ``CenterCrop(size)`` (``size`` is ``(height, width)``) as a box in image pixels.

    A crop larger than the image is padded with 0 the way torchvision pads it (left/top gets the
    smaller half), so the box then extends past the image: negative x0, or x1 > width.
    """
    crop_h, crop_w = size
    pad_left = (crop_w - width) // 2 if crop_w > width else 0
    pad_top = (crop_h - height) // 2 if crop_h > height else 0
    padded_w = width + pad_left + ((crop_w - width + 1) // 2 if crop_w > width else 0)
    padded_h = height + pad_top + ((crop_h - height + 1) // 2 if crop_h > height else 0)
    # int(round(...)) is Python's round-half-to-even, as torchvision's.
    top = int(round((padded_h - crop_h) / 2.0)) - pad_top
    left = int(round((padded_w - crop_w) / 2.0)) - pad_left
    return left, top, left + crop_w, top + crop_h


@dataclass(frozen=True)
class Frame:
    """The image a chain of transforms has made so far, as a map back to the source image.

    The current image is ``width`` x ``height`` pixels; its continuous coordinate x (pixel edges
    at integers) is source coordinate ``ax * x + bx`` (likewise y). A flip makes ``ax`` negative.
    """

    width: int
    height: int
    ax: float = 1.0
    bx: float = 0.0
    ay: float = 1.0
    by: float = 0.0
    interpolation: str = "bilinear"
    source: tuple[int, int] | None = None  # the source image's (width, height); None: this frame's own
    steps: tuple[Step, ...] = ()

    def _source(self) -> tuple[int, int]:
        return self.source if self.source is not None else (self.width, self.height)

    def resized(self, width: int, height: int, interpolation: str) -> Frame:
        if (width, height) == (self.width, self.height):
            return self  # torchvision returns the image unchanged: no resampling
        ax, ay = self.ax * self.width / width, self.ay * self.height / height
        steps = (*self.steps, ("resize", (width, height)))
        return Frame(width, height, ax, self.bx, ay, self.by, interpolation, self._source(), steps)

    def cropped(self, box: Box, step: str = "crop") -> Frame:
        x0, y0, x1, y1 = box
        bx, by = self.bx + self.ax * x0, self.by + self.ay * y0
        steps = (*self.steps, (step, tuple(box)))
        return Frame(x1 - x0, y1 - y0, self.ax, bx, self.ay, by, self.interpolation, self._source(), steps)

    def flipped(self) -> Frame:
        bx = self.bx + self.ax * self.width
        steps = (*self.steps, ("flip", ()))
        return Frame(self.width, self.height, -self.ax, bx, self.ay, self.by, self.interpolation, self._source(), steps)

    def to_plan(self) -> CropPlan:
        xa, xb = self.bx, self.bx + self.ax * self.width
        ya, yb = self.by, self.by + self.ay * self.height
        exact = (min(xa, xb), min(ya, yb), max(xa, xb), max(ya, yb))
        box = (_nearest(exact[0]), _nearest(exact[1]), _nearest(exact[2]), _nearest(exact[3]))
        fractional = any(abs(value - rounded) > _EPSILON for value, rounded in zip(exact, box))
        return CropPlan(
            box=box,
            size=(self.height, self.width),
            flip=self.ax < 0,
            exact_box=exact if fractional else None,
            interpolation=self.interpolation,
            source_size=self._source(),
            steps=self.steps,
        )


def _nearest(value: float) -> int:
    return math.floor(value + 0.5)


def whole_box(box: FloatBox) -> Box | None:
    """``box`` as whole pixels when every edge is within float noise of an integer, else None.

    Float noise (1010.9999999999999) is not a fractional box: both decoders (CPU and GPU) must take the
    crop-then-resize path for it, as torchvision does for RandomResizedCrop's integer boxes.
    """
    whole = (round(box[0]), round(box[1]), round(box[2]), round(box[3]))
    if all(abs(value - rounded) < _EPSILON for value, rounded in zip(box, whole)):
        return whole
    return None


def visible_region(plan: CropPlan, width: int, height: int) -> tuple[FloatBox, Box] | None:
    """Split a plan on a ``width`` x ``height`` image into what the image covers and the zero padding.

    Returns ``(source_box, out_rect)``: the part of the plan's box inside the image (fractional
    source pixels) and the output rectangle ``(u0, v0, u1, v1)`` it is resized to, before any flip;
    the rest of the output is 0. None when the box misses the image entirely.
    """
    x0, y0, x1, y1 = plan.source_box
    out_h, out_w = plan.size
    span_x, span_y = _clip_span(x0, x1, width, out_w), _clip_span(y0, y1, height, out_h)
    if span_x is None or span_y is None:
        return None
    (sx0, sx1, u0, u1), (sy0, sy1, v0, v1) = span_x, span_y
    return (sx0, sy0, sx1, sy1), (u0, v0, u1, v1)


def _clip_span(lo: float, hi: float, limit: int, out: int) -> tuple[float, float, int, int] | None:
    """The source span ``[lo, hi]`` clipped to ``[0, limit]``, and the output pixels it maps to."""
    step = (hi - lo) / out
    first = _nearest((max(lo, 0.0) - lo) / step)
    last = _nearest((min(hi, float(limit)) - lo) / step)
    if last <= first:
        return None
    # Recompute the source span from whole output pixels (padding ends on output pixel edges).
    return max(0.0, lo + first * step), min(float(limit), lo + last * step), first, last
