"""Read one sample's fields, masks and boxes, and move the masks and boxes with the image.

Used by ``ImageDataset`` for datasets given ``fields=``: the image and label come from the dataset's
own path (fused decode, error policy, cache), everything else from here. Annotations are read in
the source image's geometry (:meth:`FieldReader.read`), then follow the image's crop plan
(:meth:`FieldReader.follow`) or a torchvision v2 transform (the dataset hands them over as
``tv_tensors``), then lose the boxes the crop emptied (:meth:`FieldReader.finish`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fastloader.errors import FormatError
from fastloader.fields.specs import Boxes, Layout, Output
from fastloader.image.annotations import follow_boxes, follow_mask, keep_boxes, to_xyxy
from fastloader.image.geometry import CropPlan
from fastloader.image.pil import check_pixels, decode_errors, open_image


def decode_mask(data: bytes, key: str) -> np.ndarray:
    """A mask image's values as stored: palette indices, 8 / 16-bit levels or channels; never converted."""
    with decode_errors(key, "the mask"):
        image = open_image(data)
        width, height = image.size
        check_pixels(width, height, key)
        image.load()
    if image.mode == "1":
        image = image.convert("L")
    return np.array(image)  # writable: torch tensors are made of it


def _walk(value: Any, parts: list[str], where: str) -> Any:
    """``value`` at the dotted ``parts`` of a JSON path; ``*`` maps over a list."""
    if not parts:
        return value
    head, rest = parts[0], parts[1:]
    if head == "*":
        if not isinstance(value, list):
            raise FormatError(f"{where}: expected a list at '*', found {type(value).__name__}")
        return [_walk(item, rest, where) for item in value]
    if not isinstance(value, dict) or head not in value:
        raise FormatError(f"{where}: no key {head!r} in the JSON")
    return _walk(value[head], rest, where)


class FieldReader:
    """The non-image outputs of a :class:`~fastloader.fields.specs.Layout` over a field source."""

    def __init__(self, source: Any, layout: Layout) -> None:
        self.source = source
        self.layout = layout
        self._outputs = tuple(output for output in layout.outputs if output.role in ("field", "mask", "boxes"))

    def read(self, index: int, source_size: tuple[int, int] | None) -> dict[str, Any]:
        """The fields of item ``index``; masks (numpy) and boxes (XYXY float32) in source pixels.

        ``source_size``: the image's (width, height), needed by normalized boxes."""
        values: dict[str, Any] = {}
        for output in self._outputs:
            if output.role == "field":
                values[output.name] = self.source.read_field(index, output.spec)
            elif output.role == "mask":
                where = f"{self.source.key(index)}: field {output.spec.name!r}"  # type: ignore[union-attr]
                mask = decode_mask(self.source.read_field(index, output.spec.name), where)  # type: ignore[union-attr]
                if source_size is not None and mask.shape[:2] != source_size[::-1]:
                    width, height = source_size
                    raise FormatError(
                        f"{where}: the mask is {mask.shape[1]}x{mask.shape[0]} pixels, its image {width}x{height}"
                    )
                values[output.name] = mask
            else:
                values[output.name] = self._boxes(index, output, source_size)
        return values

    def follow(self, values: dict[str, Any], plan: CropPlan) -> None:
        """Move the masks and boxes of ``values`` (in place) with the image's crop plan."""
        for output in self.layout.annotations:
            value = values[output.name]
            if output.role == "mask":
                values[output.name] = follow_mask(value, plan)
            else:
                value["boxes"] = follow_boxes(value["boxes"], plan)

    def finish(self, values: dict[str, Any]) -> None:
        """Final types (in place): masks as tensors, boxes without those the crop emptied."""
        for output in self.layout.annotations:
            value = values[output.name]
            if output.role == "mask":
                if isinstance(value, np.ndarray):
                    values[output.name] = torch.from_numpy(np.ascontiguousarray(value))
                else:
                    values[output.name] = value.as_subclass(torch.Tensor)  # a tv_tensors.Mask: plain again
                continue
            spec: Boxes = output.spec  # type: ignore[assignment]
            boxes = (
                value["boxes"].as_subclass(torch.Tensor) if isinstance(value["boxes"], torch.Tensor) else value["boxes"]
            )
            labels = value.get("labels")
            if spec.min_size is not None:
                keep = keep_boxes(boxes, spec.min_size)
                boxes = boxes[keep]
                labels = None if labels is None else labels.as_subclass(torch.Tensor)[keep]
            values[output.name] = boxes if spec.labels is None else {"boxes": boxes, "labels": labels}

    def move(
        self, values: dict[str, Any], image: Any, plan: CropPlan | None, transforms: Sequence[Callable[[Any], Any]]
    ) -> Any:
        """Move the masks and boxes of ``values`` with the image (in place): along its crop plan when the
        image went through fused steps, then through ``transforms`` (torchvision v2 ones move them with
        the image; see :func:`transform_with`), then :meth:`finish`. Returns the image after ``transforms``."""
        if plan is not None:
            self.follow(values, plan)
        image = transform_with(transforms, image, values, self.layout)
        self.finish(values)
        return image

    def _boxes(self, index: int, output: Output, source_size: tuple[int, int] | None) -> dict[str, torch.Tensor]:
        spec: Boxes = output.spec  # type: ignore[assignment]
        where = f"{self.source.key(index)}: field {spec.name!r}"
        labels: Any = None
        if len(spec.sources) == 4:
            columns = [_numbers(self.source.read_field(index, name), np.float64, where) for name in spec.sources]
            if len({len(column) for column in columns}) != 1:
                raise FormatError(f"{where}: the four box fields hold {[len(c) for c in columns]} values")
            numbers: Any = np.stack(columns, axis=1)
        else:
            stored = self.source.read_field(index, spec.name)
            numbers = stored if spec.path is None else _walk(stored, spec.path.split("."), where)
            if spec.labels is not None:
                labels = (
                    self.source.read_field(index, spec.labels)
                    if output.kind == "array"
                    else _walk(stored, spec.labels.split("."), where)
                )
        array = _numbers(numbers, np.float32, where)
        if len(array) % 4:
            raise FormatError(f"{where}: boxes must be groups of 4 numbers, got {str(numbers)[:80]}")
        boxes = to_xyxy(torch.from_numpy(array.reshape(-1, 4).copy()), spec.format)
        if spec.normalized:
            if source_size is None:
                raise ValueError(f"{where}: normalized boxes need the image's size")
            width, height = source_size
            boxes = boxes * torch.tensor([width, height, width, height], dtype=torch.float32)
        value = {"boxes": boxes}
        if spec.labels is not None:
            try:
                label_array = np.asarray(labels, dtype=np.int64).reshape(-1)
            except (TypeError, ValueError, OverflowError):  # 10**400 does not fit an int64
                raise FormatError(f"{where}: box labels must be integers (int64), got {str(labels)[:80]}") from None
            if len(label_array) != len(boxes):
                raise FormatError(f"{where}: {len(boxes)} boxes but {len(label_array)} labels")
            value["labels"] = torch.from_numpy(label_array)
        return value


def _numbers(value: Any, dtype: type, where: str) -> np.ndarray:
    """``value`` (nested lists of numbers, an array) as a flat array of finite ``dtype`` numbers; FormatError
    naming ``where`` otherwise (a JSON ``1e400`` is infinite, a ``10**400`` does not fit a float)."""
    finite = f"box coordinates must be finite {np.dtype(dtype).name} numbers"
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # out of range: refused below, not warned about
            array: np.ndarray = np.asarray(value, dtype=dtype).reshape(-1)
    except (TypeError, ValueError, OverflowError) as error:
        problem = finite if isinstance(error, OverflowError) else "boxes must be groups of 4 numbers"
        raise FormatError(f"{where}: {problem}, got {str(value)[:80]}") from None
    if not np.isfinite(array).all():
        raise FormatError(f"{where}: {finite}, got {str(value)[:80]}")
    return array


def to_tv_tensors(values: Mapping[str, Any], layout: Layout, canvas: tuple[int, int]) -> dict[str, Any]:
    """Masks and boxes of ``values`` as torchvision ``tv_tensors`` (``canvas``: the image's (height, width)),
    for a torchvision v2 transform to move them with the image."""
    from torchvision import tv_tensors

    wrapped: dict[str, Any] = {}
    for output in layout.annotations:
        value = values[output.name]
        if output.role == "mask":
            mask = torch.from_numpy(np.ascontiguousarray(value)) if isinstance(value, np.ndarray) else value
            wrapped[output.name] = tv_tensors.Mask(mask)
        else:
            boxes = tv_tensors.BoundingBoxes(value["boxes"], format="XYXY", canvas_size=canvas)
            wrapped[output.name] = {**value, "boxes": boxes}
    return wrapped


def transform_with(
    transforms: Sequence[Callable[[Any], Any]], image: Any, values: dict[str, Any], layout: Layout
) -> Any:
    """Apply ``transforms`` to the image; torchvision v2 ones also to the masks and boxes of ``values``
    (as ``tv_tensors``), which they move with it. Others see the image only."""
    if not transforms:
        return image
    if image is None:
        raise ValueError(f"{list(transforms)!r}: masks or boxes with this transform need the image in fields")
    geometric = [t for t in transforms if not _is_v2(t)]
    if not isinstance(image, torch.Tensor) and geometric:
        raise ValueError(
            f"masks and boxes move with the image through fastloader transforms or torchvision.transforms.v2 ones;"
            f" {geometric[0]!r} is neither (it would move the pixels and leave the annotations behind)"
        )
    annotations = to_tv_tensors(values, layout, _canvas(image))
    for transform in transforms:
        if _is_v2(transform):
            image, annotations = transform(image, annotations)  # type: ignore[call-arg]
        else:
            image = transform(image)
    for name, value in annotations.items():
        values[name] = value
    return image


def _is_v2(transform: Any) -> bool:
    """A torchvision v2 transform (it moves tv_tensors masks and boxes with the image)."""
    return type(transform).__module__.startswith("torchvision.transforms.v2")


def image_size(image: Any) -> tuple[int, int] | None:
    """(width, height) of a PIL image or a [..., H, W] tensor; None for anything else."""
    if isinstance(image, torch.Tensor):
        return int(image.shape[-1]), int(image.shape[-2])
    size = getattr(image, "size", None)
    return (int(size[0]), int(size[1])) if isinstance(size, tuple) and len(size) == 2 else None


def _canvas(image: Any) -> tuple[int, int]:
    size = image_size(image)
    if size is None:
        raise ValueError(f"cannot tell the size of {type(image).__name__} to move masks and boxes with it")
    return size[1], size[0]
