"""Small generated scenes for tests of fields: a JPEG with coloured rectangles, its class-id mask
(PNG), its boxes and labels (COCO-style JSON), a caption and a score. Real encoded bytes, made by PIL."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np

from fastloader.errors import MissingField


def scene(index: int, width: int = 96, height: int = 72) -> dict[str, Any]:
    """Sample ``index``: ``jpg``, ``seg.png`` (class ids), ``json`` (COCO boxes), ``txt``, ``score``."""
    from PIL import Image

    rng = np.random.default_rng(index)
    pixels = np.full((height, width, 3), 40, dtype=np.uint8)
    mask = np.zeros((height, width), dtype=np.uint8)
    annotations = []
    for _ in range(int(rng.integers(1, 4))):
        w, h = int(rng.integers(8, width // 2)), int(rng.integers(8, height // 2))
        x, y = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
        category = int(rng.integers(1, 5))
        pixels[y : y + h, x : x + w] = (60 * category) % 256, 200, 255 - 50 * category
        mask[y : y + h, x : x + w] = category
        annotations.append({"bbox": [x, y, w, h], "category_id": category})
    jpeg, png = io.BytesIO(), io.BytesIO()
    Image.fromarray(pixels).save(jpeg, format="JPEG", quality=95)
    Image.fromarray(mask, mode="L").save(png, format="PNG")
    return {
        "jpg": jpeg.getvalue(),
        "seg.png": png.getvalue(),
        "json": {"annotations": annotations, "id": index},
        "txt": f"a picture with {len(annotations)} boxes, number {index}",
        "score": float(rng.random()),
        "label": len(annotations),
    }


class SceneSource:
    """A Source and FieldSource over generated scenes (a user's own source, as base.py documents);
    ``missing``: items without a caption."""

    KINDS = {"json": "json", "score": "float", "seg.png": "image", "txt": "text"}

    def __init__(self, count: int = 12, missing: tuple[int, ...] = ()) -> None:
        self.count, self.missing = count, missing

    def __len__(self) -> int:
        return self.count

    def read(self, index: int) -> bytes:
        return scene(index)["jpg"]

    def label(self, index: int) -> int:
        return int(scene(index)["label"])

    def key(self, index: int) -> str:
        return f"scene-{index:03d}"

    def field_kinds(self) -> dict[str, str]:
        return dict(self.KINDS)

    def field_aliases(self) -> dict[str, str]:
        return {"jpg": "image", "cls": "label"}

    def read_field(self, index: int, name: str) -> Any:
        if name == "txt" and index in self.missing:
            raise MissingField(f"{self.key(index)}: no field 'txt'")
        return scene(index)[name]


def encode_json(value: Any) -> bytes:
    return json.dumps(value).encode()
