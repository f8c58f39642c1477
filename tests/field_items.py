"""A source of real images with fields of every kind, as other formats name them (module level: picklable)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image

from fastloader.errors import MissingField
from tests.images import image_bytes

LONG_NAME = "deeply/" * 16 + "Nested"  # its member's name needs a pax header (over 100 bytes)

# Names no tar extension can hold as they are: a TFRecord feature, Parquet columns, an image extension.
FIELDS = {
    "image/object/bbox/xmin": "array",
    "TEXT": "text",
    "Caption": "text",
    "txt": "text",
    "meta": "json",
    "score": "float",
    "count": "int",
    "raw": "bytes",
    "png": "image",
    "mask": "image",
    LONG_NAME: "json",
}


def mask_bytes(index: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((6, 5), index % 256, dtype=np.uint8), mode="L").save(out, format="PNG")
    return out.getvalue()


def field_values(index: int) -> dict[str, Any]:
    """Item ``index``'s fields: every kind, with values that only an exact encoding keeps; some missing."""
    values: dict[str, Any] = {
        "image/object/bbox/xmin": np.array([0.1 * index, 1 / 3, -0.0], dtype=np.float32),
        "TEXT": f"Ünïcödé {index}\n\ttabs and  spaces ",
        "Caption": f"a caption, number {index}",
        "txt": "" if index % 2 else "short",  # an empty member
        "meta": {"i": index, "tags": ["a", "ß"], "nested": {"none": None, "f": 1.5, "big": 2**60}},
        "score": 0.1 + 0.2 * index,
        "count": -(2**62) + index,
        "raw": bytes([0xFF, 0x00, index % 256, 0x80]),  # not UTF-8
        "png": image_bytes(index + 100),
        "mask": mask_bytes(index),
        LONG_NAME: [index, "long"],
    }
    if index % 3 == 2:
        del values["Caption"]
    if index % 4 == 1:
        del values["image/object/bbox/xmin"], values["mask"]
    return values


class FieldItems:
    """``count`` real images (``tests.images.image_bytes``), labels ``i % 3``, and :func:`field_values`.

    Subclasses change the fields by overriding ``kinds`` and ``values``."""

    kinds = FIELDS

    def __init__(self, count: int = 12) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def read(self, index: int) -> bytes:
        return image_bytes(index)

    def label(self, index: int) -> int:
        return index % 3

    def key(self, index: int) -> str:
        return f"items/{index:03d}"

    def values(self, index: int) -> dict[str, Any]:
        return field_values(index)

    def field_kinds(self) -> dict[str, str]:
        return dict(self.kinds)

    def read_field(self, index: int, name: str) -> Any:
        values = self.values(index)
        if name not in values:
            raise MissingField(f"{self.key(index)}: no field {name!r}")
        return values[name]


def assert_same_value(got: Any, expected: Any, where: str) -> None:
    """Exactly equal: arrays with their dtype and shape, floats bit for bit, bytes and text byte for byte."""
    assert type(got) is type(expected), where
    if isinstance(expected, np.ndarray):
        assert got.dtype == expected.dtype and got.shape == expected.shape, where
        assert got.tobytes() == expected.tobytes(), where
    elif isinstance(expected, float):
        assert got.hex() == expected.hex(), where
    else:
        assert got == expected, where
