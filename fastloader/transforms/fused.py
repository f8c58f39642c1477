"""torchvision's geometric transforms, fused with decoding: ``T.RandomResizedCrop(224)(jpeg_bytes)``.

Called on **encoded bytes** (what every fastloader dataset hands them), a transform — or a
:class:`Compose` of them — folds its whole geometric chain into one :class:`CropPlan` drawn from
the image header (``Resize(256)`` + ``CenterCrop(224)`` is one source box resized once;
``RandomResizedCrop`` + ``RandomHorizontalFlip`` is a box and a flip), decodes only what the plan
needs (:func:`fastloader.image.decode.decode_plan`), and returns a uint8 C×H×W tensor (a view of H×W×C
memory, as torchvision's ``pil_to_tensor`` returns).

Called on a ``PIL.Image`` or a tensor, each transform is torchvision's (same parameters, same
random draws, torchvision's functional ops), so they also work in torchvision's own datasets.

A :class:`Compose` may end with any callables (torchvision v1 / v2 transforms on uint8 tensors,
``v2.ColorJitter``, ...): the leading fastloader transforms are fused, the rest are applied to the
tensor they produce. torchvision's ``ToTensor`` there becomes a uint8 -> float/255 conversion and
``PILToTensor`` is dropped, since the image already is a tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

import numpy as np
import torch

# A module import: fastloader.image.decode imports this package's geometry, so names are looked up at call time.
from fastloader.image import decode
from fastloader.image.geometry import (
    CropPlan,
    Frame,
    center_crop_box,
    random_resized_crop_box,
    resize_size,
)

Size = tuple[int, int]


class Decoded(NamedTuple):
    """What :meth:`fastloader.transforms.FusedTransform.decode_planned` made of one encoded image."""

    header: decode.ImageHeader
    plan: CropPlan
    pixels: np.ndarray | None  # H×W×3 uint8; None when only the plan was asked for


_ENCODED = (bytes, bytearray, memoryview)
_PIL_FILTERS = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


class FusedTransform:
    """Base of fastloader's transforms: fused decode on bytes, torchvision on images and tensors.

    Subclasses are single geometric steps (they define ``_fold``, ``_apply`` and ``_size_after``)
    or :class:`Compose`, which chains them (``steps``) and ends with user callables (``tail``).
    """

    _random = False
    # The step's plan is a function of the image size alone and draws nothing from torch's RNG (Resize,
    # CenterCrop; not RandomHorizontalFlip(p=1), which still draws): a batch plans each size once.
    _size_only = False
    # libjpeg's fast integer IDCT and plain chroma upsampling (FFCV decodes the same way), and the
    # resize done in the JPEG extension, into the batch slot: pixels within about one level of the
    # exact decode on average. Compose's ``exact_decode=True`` gives torchvision's pixels exactly.
    exact_decode = False

    @property
    def steps(self) -> tuple[FusedTransform, ...]:
        """The geometric steps fused into one plan."""
        return (self,)

    @property
    def tail(self) -> tuple[Callable[[Any], Any], ...]:
        """Callables applied to the decoded uint8 tensor, in order."""
        return ()

    @property
    def decoded_size(self) -> Size | None:
        """``(height, width)`` the fused steps always produce, or None when it depends on the image."""
        size: Size | None = None
        for step in self.steps:
            size = step._size_after(size)
        return size

    @property
    def output_size(self) -> Size | None:
        """``(height, width)`` of every output when fixed and known (no tail), else None."""
        return None if self.tail else self.decoded_size

    @property
    def is_random(self) -> bool:
        """Whether the plan depends on random draws (a cache of decoded images needs it fixed)."""
        return any(step._random for step in self.steps)

    def describe(self) -> str:
        """The fused steps with all their parameters: what a cache of decoded images is keyed by."""
        return "; ".join(repr(step) for step in self.steps)

    def plan(self, width: int, height: int, generator: torch.Generator | None = None) -> CropPlan:
        """Draw the crop plan of the fused steps for a ``width`` x ``height`` source image; by default from the
        worker's generator: a thread worker's own (``torch.random.thread_safe_generator()``, the same draws as a
        worker process's global one), else the global one."""
        if generator is None:
            generator = torch.random.thread_safe_generator()
        frame = Frame(width, height)
        for step in self.steps:
            frame = step._fold(frame, generator)
        return frame.to_plan()

    def decode_planned(
        self,
        data: bytes,
        key: str = "<bytes>",
        out: np.ndarray | None = None,
        *,
        pixels: bool = True,
        generator: torch.Generator | None = None,
    ) -> Decoded:
        """Header -> crop plan -> decode: the fused steps on encoded ``data``, the one place they run.

        Pixels are H×W×3 uint8, written into ``out`` when given; ``pixels=False`` stops at the plan (a
        GPU decodes, or only the plan is wanted). The plan draws from ``generator`` (None: torch's global
        generator, as torchvision). Errors name ``key``."""
        header = decode.read_header(data, key)
        plan = self.plan(header.width, header.height, generator)
        if not pixels:
            return Decoded(header, plan, None)
        return Decoded(
            header, plan, decode.decode_plan(data, plan, key, out, fast=not self.exact_decode, header=header)
        )

    def decode_batch(
        self,
        blobs: Sequence[bytes],
        out: np.ndarray,
        keys: Callable[[int], str],
        threads: int = 1,
        generators: Callable[[int], torch.Generator | None] | None = None,
    ) -> None:
        """:meth:`decode_planned` for a batch: image i of ``blobs`` into ``out[i]`` (uint8 N×H×W×3), the JPEGs
        in one call of the extension on ``threads`` threads (``fastloader.image.decode.decode_plans``).

        Headers are read and plans drawn image after image, as one call per image would draw them (the same
        random crops; image i's from ``generators(i)`` when given, drawn right before its plan); a plan that
        depends only on the size is made once per size. Errors name ``keys(i)``."""
        images: list[tuple[bytes, decode.ImageHeader, CropPlan]] = []
        by_size: dict[tuple[int, int], CropPlan] | None = {} if all(s._size_only for s in self.steps) else None
        for slot, data in enumerate(blobs):
            header = decode.read_header(data, keys(slot))
            size = header.width, header.height
            if by_size is None:
                plan = self.plan(*size, generators(slot) if generators is not None else None)
            else:
                plan = by_size.get(size) or by_size.setdefault(size, self.plan(*size))
            images.append((data, header, plan))
        decode.decode_plans(images, out, not self.exact_decode, keys, threads)

    def decode_into(self, data: bytes, out: np.ndarray | None = None, key: str = "<bytes>") -> np.ndarray:
        """The fused steps on encoded ``data``: H×W×3 uint8 pixels, written into ``out`` when given."""
        return cast(np.ndarray, self.decode_planned(data, key, out).pixels)  # pixels asked for: never None

    def finish(self, image: torch.Tensor) -> Any:
        """Apply the tail to a C×H×W uint8 tensor made by the fused steps."""
        result: Any = image
        for transform in self.tail:
            result = transform(result)
        return result

    def decode(self, data: bytes, key: str = "<bytes>") -> Any:
        """The whole transform on encoded ``data`` (errors name ``key``): a C×H×W uint8 tensor, then the tail."""
        pixels = self.decode_into(data, None, key)
        return self.finish(torch.from_numpy(pixels).permute(2, 0, 1))

    def __call__(self, image: Any) -> Any:
        if isinstance(image, _ENCODED):
            return self.decode(bytes(image))
        return self._apply(image)

    def _fold(self, frame: Frame, generator: torch.Generator | None) -> Frame:
        raise NotImplementedError

    def _apply(self, image: Any) -> Any:
        raise NotImplementedError

    def _size_after(self, size: Size | None) -> Size | None:
        raise NotImplementedError


class Compose(FusedTransform):
    """torchvision's ``Compose``; leading fastloader transforms fuse with decoding (module docstring)."""

    def __init__(self, transforms: Sequence[Callable[[Any], Any]], *, exact_decode: bool = False) -> None:
        self.transforms = list(transforms)
        self.exact_decode = exact_decode
        flat: list[Callable[[Any], Any]] = []
        for transform in self.transforms:
            flat.extend(transform.transforms if isinstance(transform, Compose) else [transform])
        count = 0
        while count < len(flat) and isinstance(flat[count], FusedTransform):
            count += 1
        self._steps: tuple[FusedTransform, ...] = tuple(flat[:count])  # type: ignore[arg-type]
        self._tail = tuple(adapted for adapted in map(_adapt_to_tensor, flat[count:]) if adapted is not None)

    @property
    def steps(self) -> tuple[FusedTransform, ...]:
        return self._steps

    @property
    def tail(self) -> tuple[Callable[[Any], Any], ...]:
        return self._tail

    def _apply(self, image: Any) -> Any:
        for transform in self.transforms:
            image = transform(image)
        return image

    def __repr__(self) -> str:
        lines = "".join(f"\n    {transform}" for transform in self.transforms)
        return f"{type(self).__name__}({lines}\n)"


class RandomResizedCrop(FusedTransform):
    """torchvision's ``RandomResizedCrop``: a random box of area ``scale`` and aspect ``ratio``, resized."""

    _random = True

    def __init__(
        self,
        size: int | Sequence[int],
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
        interpolation: Any = "bilinear",
        antialias: bool | None = True,
    ) -> None:
        self.size = _pair(size, "size")
        if len(scale) != 2 or len(ratio) != 2:
            raise ValueError(f"scale and ratio must be (min, max) pairs, got {scale!r} and {ratio!r}")
        if scale[0] > scale[1] or ratio[0] > ratio[1] or min(scale) <= 0 or min(ratio) <= 0:
            raise ValueError(f"scale and ratio must be positive (min, max) ranges, got {scale!r} and {ratio!r}")
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.interpolation = _interpolation_name(interpolation)
        self.antialias = antialias

    def _fold(self, frame: Frame, generator: torch.Generator | None) -> Frame:
        box = random_resized_crop_box(frame.width, frame.height, self.scale, self.ratio, generator)
        return frame.cropped(box).resized(self.size[1], self.size[0], self.interpolation)

    def _apply(self, image: Any) -> Any:
        functional, mode = _torchvision(self.interpolation)
        width, height = _image_size(image)
        x0, y0, x1, y1 = random_resized_crop_box(width, height, self.scale, self.ratio)
        return functional.resized_crop(image, y0, x0, y1 - y0, x1 - x0, list(self.size), mode, self.antialias)

    def _size_after(self, size: Size | None) -> Size | None:
        return self.size

    def __repr__(self) -> str:
        return (
            f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio},"
            f" interpolation={self.interpolation}, antialias={self.antialias})"
        )


class Resize(FusedTransform):
    """torchvision's ``Resize``: an int sets the shorter side (at most ``max_size`` long), ``(h, w)`` both."""

    _size_only = True

    def __init__(
        self,
        size: int | Sequence[int],
        interpolation: Any = "bilinear",
        max_size: int | None = None,
        antialias: bool | None = True,
    ) -> None:
        if isinstance(size, Sequence) and len(size) == 1:
            size = int(size[0])
        if isinstance(size, int):
            if size < 1:
                raise ValueError(f"size must be positive, got {size}")
            resize_size(size, size, size, max_size)  # validates max_size against size
            self.size: int | tuple[int, int] = size
        else:
            if max_size is not None:
                raise ValueError("max_size is only allowed when size is an int (the shorter side)")
            self.size = _pair(size, "size")
        self.interpolation = _interpolation_name(interpolation)
        self.max_size = max_size
        self.antialias = antialias

    def _fold(self, frame: Frame, generator: torch.Generator | None) -> Frame:
        height, width = resize_size(frame.width, frame.height, self.size, self.max_size)
        return frame.resized(width, height, self.interpolation)

    def _apply(self, image: Any) -> Any:
        functional, mode = _torchvision(self.interpolation)
        size = [self.size] if isinstance(self.size, int) else list(self.size)
        return functional.resize(image, size, mode, self.max_size, self.antialias)

    def _size_after(self, size: Size | None) -> Size | None:
        if not isinstance(self.size, int):
            return self.size
        return None if size is None else resize_size(size[1], size[0], self.size, self.max_size)

    def __repr__(self) -> str:
        return (
            f"Resize(size={self.size}, interpolation={self.interpolation}, max_size={self.max_size},"
            f" antialias={self.antialias})"
        )


class CenterCrop(FusedTransform):
    """torchvision's ``CenterCrop``; a crop larger than the image is padded with 0, as torchvision pads."""

    _size_only = True

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = _pair(size, "size")

    def _fold(self, frame: Frame, generator: torch.Generator | None) -> Frame:
        return frame.cropped(center_crop_box(frame.width, frame.height, self.size), "center_crop")

    def _apply(self, image: Any) -> Any:
        functional, _ = _torchvision("bilinear")
        return functional.center_crop(image, list(self.size))

    def _size_after(self, size: Size | None) -> Size | None:
        return self.size

    def __repr__(self) -> str:
        return f"CenterCrop(size={self.size})"


class RandomHorizontalFlip(FusedTransform):
    """torchvision's ``RandomHorizontalFlip``: mirror left-right with probability ``p``."""

    def __init__(self, p: float = 0.5) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be a probability in [0, 1], got {p}")
        self.p = p
        self._random = 0.0 < p < 1.0

    def _fold(self, frame: Frame, generator: torch.Generator | None) -> Frame:
        # One draw per call, whatever p is, as torchvision: the RNG stream stays in step with it.
        return frame.flipped() if torch.rand(1, generator=generator).item() < self.p else frame

    def _apply(self, image: Any) -> Any:
        functional, _ = _torchvision("bilinear")
        return (
            functional.hflip(image)
            if torch.rand(1, generator=torch.random.thread_safe_generator()).item() < self.p
            else image
        )

    def _size_after(self, size: Size | None) -> Size | None:
        return size

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"


def _pair(size: int | Sequence[int], name: str) -> Size:
    """torchvision's size argument: an int (square) or a 1- or 2-sequence, as ``(height, width)``."""
    values = [size] if isinstance(size, int) else list(size)
    if len(values) == 1:
        values = values * 2
    if len(values) != 2 or not all(isinstance(v, (int, np.integer)) and v > 0 for v in values):
        raise ValueError(f"{name} must be a positive int or a (height, width) pair, got {size!r}")
    return int(values[0]), int(values[1])


def _interpolation_name(value: Any) -> str:
    """torchvision's ``InterpolationMode``, its name, or a PIL resampling constant, as a name."""
    name = getattr(value, "value", value)  # InterpolationMode.BILINEAR.value == "bilinear"
    if isinstance(name, (int, np.integer)) and not isinstance(name, bool):
        name = _PIL_FILTERS.get(int(name), name)
    if not isinstance(name, str) or name.lower() not in decode.INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {sorted(decode.INTERPOLATIONS)}, got {value!r}")
    return name.lower()


def _torchvision(interpolation: str) -> tuple[Any, Any]:
    """torchvision's functional module and the InterpolationMode (PIL / tensor inputs only)."""
    try:
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms import functional as functional_module
    except ImportError as error:
        raise ImportError(
            "fastloader transforms need torchvision for PIL images and tensors (bytes need only PIL)"
        ) from error
    return functional_module, InterpolationMode(interpolation)


def _image_size(image: Any) -> tuple[int, int]:
    """``(width, height)`` of a PIL image or a [..., H, W] tensor."""
    if isinstance(image, torch.Tensor):
        return int(image.shape[-1]), int(image.shape[-2])
    width, height = image.size
    return int(width), int(height)


def _adapt_to_tensor(transform: Callable[[Any], Any]) -> Callable[[Any], Any] | None:
    """A tail transform as it must run on our uint8 tensor (None: drop it)."""
    cls = type(transform)
    if cls.__module__.startswith("torchvision.transforms"):
        if cls.__name__ == "ToTensor":
            return _to_float  # PIL -> float in [0, 1]: the same on our uint8 tensor
        if cls.__name__ == "PILToTensor":
            return None  # the image already is a uint8 tensor
    return transform


def _to_float(image: torch.Tensor) -> torch.Tensor:
    return image.contiguous().float().div_(255)
