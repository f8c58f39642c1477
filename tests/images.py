"""Real image files for tests: small, unique, and in the modes and formats real datasets hold."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from fastloader.datasets.lmdb import LMDBSource
from fastloader.sample import PHOTOS

# Pillow >= 11.2 exports an image's pixels as an Arrow array (what fastloader's one-pass slot copy reads).
needs_arrow = pytest.mark.skipif(
    not hasattr(Image.Image, "__arrow_c_array__"), reason="Pillow < 11.2 exports no Arrow array"
)

# The oddities real datasets hold, in turn: PIL mode and file format of image i is KINDS[i % 6].
KINDS = [("RGB", "JPEG"), ("RGB", "PNG"), ("L", "JPEG"), ("CMYK", "JPEG"), ("RGBA", "PNG"), ("P", "PNG")]


def image_bytes(index: int, seed: int = 0) -> bytes:
    """A small, unique, real image: noise of varied size, mode and format."""
    rng = np.random.default_rng([seed, index])
    mode, fmt = KINDS[index % len(KINDS)]
    width, height = int(rng.integers(20, 72)), int(rng.integers(20, 72))
    image = Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)).convert(mode)
    out = io.BytesIO()
    image.save(out, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()


def write_image_folder(root: Path, count: int = 36, classes: int = 3, seed: int = 0) -> list[tuple[str, int, bytes]]:
    """``root/class_K/NNNN.jpg`` (PNGs named .jpg included, as crawled data has them).

    Returns ``(key, label, bytes)`` in the order a packed folder holds them: classes sorted, then files.
    """
    items = []
    for index in range(count):
        label = index % classes
        key = f"class_{label}/{index:04d}.jpg"
        data = image_bytes(index, seed)
        (root / f"class_{label}").mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(data)
        items.append((key, label, data))
    return sorted(items, key=lambda item: (item[1], item[0]))


def packed_items(path: Path) -> list[tuple[str | None, int, bytes]]:
    """``(source key, label, bytes)`` of every record of a pack, in record order."""
    source = LMDBSource(path)
    return [(source.source_key(i), source.label(i), source.read(i)) for i in range(len(source))]


def pack_contents(path: Path) -> list[tuple[str | None, int, bytes]]:
    """``(source key, label, bytes)`` of every sample of a pack of any format (LMDB, tar, Parquet), in order."""
    from fastloader.datasets.sources import open_source

    source, _ = open_source(str(path))
    key = getattr(source, "source_key", source.key)  # tar and LMDB keep the source's key beside their own
    return [(key(i), source.label(i), source.read(i)) for i in range(len(source))]


def photo(width: int = 500, height: int = 375, seed: int = 0, **options: Any) -> bytes:
    image = Image.open(sorted(PHOTOS.glob("*.jpg"))[seed % 3]).convert("RGB").resize((width, height))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90, **options)
    return out.getvalue()


def cut(data: bytes, fraction: float) -> bytes:
    """A download cut short, then closed with an end-of-image marker (as some tools and servers do)."""
    return data[: int(len(data) * fraction)] + b"\xff\xd9"


def many_scans(copies: int) -> bytes:
    """A progressive JPEG whose smallest scan is repeated ``copies`` times: each repeat a full pass of the
    decoder over the image, as in the "thousands of scans" denial of service."""
    data = photo(320, 240, progressive=True)
    end = data.rindex(b"\xff\xd9")
    starts = [match.start() for match in re.finditer(b"\xff\xda", data)]
    scans = []
    for start in starts:  # a scan runs to the next table (DHT), the next scan or the end
        ends = [p for p in (data.find(b"\xff\xc4", start + 2), data.find(b"\xff\xda", start + 2)) if p > 0]
        scans.append(data[start : min(ends + [end])])
    smallest = min(scans, key=len)
    return data[:end] + smallest * copies + b"\xff\xd9"


def distinct_photo(index: int, width: int = 64, height: int = 48) -> bytes:
    """A real JPEG of photographic content, ``width`` x ``height``, whose pixels differ for every ``index``
    (a window moved across a larger photograph)."""
    image = Image.open(io.BytesIO(photo(width * 2, height * 2, seed=index)))
    left, top = (index * 7) % width, (index * 5) % height
    out = io.BytesIO()
    image.crop((left, top, left + width, top + height)).save(out, "JPEG", quality=90)
    return out.getvalue()


def write_hf_by_path(directory: Path, count: int = 12, classes: int = 3) -> list[tuple[str, int, bytes]]:
    """A Hugging Face image dataset built from file paths, as its users build one: ``directory/images/NNNN.jpg``
    and ``directory/train.parquet``, written by the real ``datasets``
    (``Dataset.from_dict(...).cast_column("image", Image())``, then ``to_parquet``), which stores each image
    as ``{bytes: null, path: "images/NNNN.jpg"}``: relative to ``directory``, the current directory it is
    built from. Returns ``(path, label, bytes)`` per row."""
    import datasets

    (directory / "images").mkdir(parents=True)
    items = []
    for index in range(count):
        relative = f"images/{index:04d}.jpg"
        data = distinct_photo(index)
        (directory / relative).write_bytes(data)
        items.append((relative, index % classes, data))
    names = [f"class_{label}" for label in range(classes)]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})
    table = datasets.Dataset.from_dict(
        {"image": [path for path, _, _ in items], "label": [label for _, label, _ in items]}, features=features
    )
    here = os.getcwd()
    os.chdir(directory)  # the relative paths are taken from here, as a user's script run in `directory` does
    try:
        table.to_parquet("train.parquet")
    finally:
        os.chdir(here)
    return items
