"""What a user asks a dataset for: ``fields=("jpg", "txt", "json")`` or ``fields={"image": "jpg", ...}``.

Each entry is a name in the format's own naming (a tar member's extension, a TFRecord feature, a
Parquet column, a field of a fastloader pack) or one of these specs:

* :class:`Mask` — an image field (a segmentation mask, class ids) decoded without conversion and moved
  with the image's crop, flip and resize (nearest-neighbour): it stays aligned with the pixels;
* :class:`Boxes` — boxes from a JSON field (``path`` into it) or numeric fields, moved and clipped
  with the image, empty ones dropped (``min_size``), with their per-box labels when ``labels`` is set.

A name resolves to the transformed image (``"image"`` or the format's name for it: ``"jpg"``,
``"image/encoded"``), the label (``"label"``, ``"cls"``, ...; ``target_transform`` applies), or a field
read as stored (its kind's Python value, see ``fastloader.formats.field_values``; an image field other than
the main image is its encoded bytes unless asked for as a :class:`Mask`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastloader.image.annotations import BOX_FORMATS


@dataclass(frozen=True)
class Mask:
    """The image field ``name`` as a mask: decoded as stored (palette indices, 8 or 16 bits, channels
    kept) and moved with the image by the fused transform (nearest-neighbour), a uint8 / uint16 H×W
    (or H×W×C) tensor."""

    name: str


@dataclass(frozen=True)
class Boxes:
    """Boxes moved with the image: an N×4 float32 tensor, XYXY in output pixels.

    ``name``: a JSON field (``path`` then says where in it: dotted keys, ``*`` for every element of a
    list, e.g. ``"annotations.*.bbox"`` for COCO) or an array field of N×4 (or 4N) numbers; or four
    array fields ``(xmin, ymin, xmax, ymax)`` (TensorFlow's object detection layout). ``format``:
    how they are stored (``xyxy``, ``xywh`` as COCO, ``cxcywh``); ``normalized``: in [0, 1] of the
    source image's size. After the crop, boxes narrower or lower than ``min_size`` pixels are dropped
    (torchvision's ``SanitizeBoundingBoxes`` rule; None keeps them, empty ones then have zero width or
    height). ``labels``: where each box's label is (a path in the same JSON, or an array field); the
    value is then ``{"boxes": N×4, "labels": N int64}``, labels dropped with their boxes.
    """

    name: str | tuple[str, str, str, str]
    path: str | None = None
    format: str = "xyxy"
    normalized: bool = False
    labels: str | None = None
    min_size: float | None = 1.0

    def __post_init__(self) -> None:
        if self.format not in BOX_FORMATS:
            raise ValueError(f"Boxes format must be one of {', '.join(BOX_FORMATS)}, got {self.format!r}")
        if not isinstance(self.name, str) and (len(self.name) != 4 or self.path is not None):
            raise ValueError(
                f"Boxes name must be a field name or 4 array fields (xmin, ymin, xmax, ymax), got {self.name!r}"
            )

    @property
    def sources(self) -> tuple[str, ...]:
        return (self.name,) if isinstance(self.name, str) else tuple(self.name)


Spec = str | Mask | Boxes


@dataclass(frozen=True)
class Output:
    """One entry of a sample: ``role`` is image, label, field, mask or boxes; ``kind`` the field's kind."""

    name: str  # the key of a dict sample, the spec's name in a tuple sample
    role: str
    spec: Spec
    kind: str = ""


@dataclass(frozen=True)
class Layout:
    """The resolved ``fields=`` of a dataset: its outputs, in order, and whether samples are dicts."""

    outputs: tuple[Output, ...]
    as_dict: bool

    @property
    def annotations(self) -> tuple[Output, ...]:
        """The outputs that follow the image's geometry (masks and boxes)."""
        return tuple(output for output in self.outputs if output.role in ("mask", "boxes"))

    @property
    def wants_image(self) -> bool:
        return any(output.role == "image" for output in self.outputs)

    def assemble(self, values: Mapping[str, Any]) -> Any:
        """The sample: a tuple in the order asked, or a dict."""
        if self.as_dict:
            return {output.name: values[output.name] for output in self.outputs}
        return tuple(values[output.name] for output in self.outputs)


def resolve(
    fields: Sequence[Spec] | Mapping[str, Spec], kinds: Mapping[str, str], aliases: Mapping[str, str]
) -> Layout:
    """Check ``fields`` against what a source carries (``kinds``, ``aliases``): a :class:`Layout`."""
    if isinstance(fields, (str, Mask, Boxes)):
        raise TypeError(f"fields must be a sequence or a mapping of field names, got {fields!r}: write ({fields!r},)")
    as_dict = isinstance(fields, Mapping)
    entries = list(fields.items()) if isinstance(fields, Mapping) else [(_name(spec), spec) for spec in fields]
    if not entries:
        raise ValueError("fields must name at least one field")
    names = [name for name, _ in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"fields names an output twice: {names}")
    known = sorted({*kinds, *aliases})

    def field_kind(name: str, wanted: tuple[str, ...], what: str) -> str:
        if name not in kinds:
            raise ValueError(f"no field {name!r} in this dataset; it has {known}")
        if kinds[name] not in wanted:
            raise ValueError(f"{what} needs a field of kind {' or '.join(wanted)}; {name!r} is {kinds[name]}")
        return kinds[name]

    outputs = []
    for name, spec in entries:
        if isinstance(spec, Mask):
            outputs.append(Output(name, "mask", spec, field_kind(spec.name, ("image", "bytes"), "Mask")))
        elif isinstance(spec, Boxes):
            stored = [field_kind(source, ("json", "array"), "Boxes") for source in spec.sources]
            if len(stored) == 4 and set(stored) != {"array"}:
                raise ValueError(f"Boxes from four fields needs four array fields, got {spec.sources}")
            if spec.labels is not None and stored[0] == "array":
                field_kind(spec.labels, ("array",), "Boxes labels")
            outputs.append(Output(name, "boxes", spec, stored[0]))
        elif isinstance(spec, str):
            if spec in aliases:
                outputs.append(Output(name, aliases[spec], spec))
            elif spec in kinds:
                outputs.append(Output(name, "field", spec, kinds[spec]))
            else:
                raise ValueError(f"no field {spec!r} in this dataset; it has {known}")
        else:
            raise TypeError(f"a field is a name, Mask(name) or Boxes(...), got {spec!r}")
    if sum(output.role == "image" for output in outputs) > 1:
        raise ValueError(f"fields asks for the image twice: {names}")
    return Layout(tuple(outputs), as_dict)


def _name(spec: Spec) -> str:
    if isinstance(spec, str):
        return spec
    if isinstance(spec, Boxes):
        return spec.name if isinstance(spec.name, str) else "boxes"
    if isinstance(spec, Mask):
        return spec.name
    raise TypeError(f"a field is a name, Mask(name) or Boxes(...), got {spec!r}")
