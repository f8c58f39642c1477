"""Built-in samples with more than a label: WebDataset tar shards of the kinds people train on.

* :func:`make_caption_shards`: image-text pairs as LAION / CC12M / DataComp shards hold them (and as
  img2dataset writes them): ``KEY.jpg``, ``KEY.txt`` (the caption), ``KEY.json`` (metadata) and
  ``KEY.cls``. Images are cut from the sample photographs (``fastloader.sample``), so decode costs
  are a photo's; captions describe the photograph and the edit made to it.
* :func:`make_detection_shards`: detection / segmentation scenes: ``KEY.jpg``, ``KEY.json`` with
  COCO-style ``annotations`` (``bbox`` as ``[x, y, w, h]`` in pixels, ``category_id``) and
  ``KEY.seg.png``, a class-id mask of the same size.

Both are deterministic for a seed and write plain POSIX tars any WebDataset reader opens.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from fastloader.sample import photo_names, render_photo

SUBJECTS = {
    "astronaut": "an astronaut in a white space suit",
    "chelsea": "a tabby cat",
    "coffee": "a cup of coffee on a saucer",
    "grass": "green grass",
    "gravel": "grey gravel",
    "hubble_deep_field": "distant galaxies in deep space",
    "retina": "a photograph of a human retina",
    "rocket": "a rocket on its launch pad",
}
CATEGORIES = ("background", "red box", "green box", "blue box", "yellow box")
_COLOURS = ((0, 0, 0), (220, 40, 40), (40, 200, 60), (50, 80, 230), (235, 215, 40))


def _jpeg(pixels: np.ndarray, quality: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def _write_shards(
    root: Path, prefix: str, count: int, shard_size: int, sample: Callable[[int], dict[str, bytes]]
) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for shard, start in enumerate(range(0, count, shard_size)):
        path = root / f"{prefix}-{shard:06d}.tar"
        paths.append(path)
        if path.exists():
            continue  # deterministic: a second call is instant
        temporary = path.with_suffix(".tar.partial")
        with tarfile.open(temporary, "w", format=tarfile.USTAR_FORMAT) as tar:
            for index in range(start, min(start + shard_size, count)):
                for extension, data in sample(index).items():
                    info = tarfile.TarInfo(f"{index:09d}.{extension}")
                    info.size, info.mode = len(data), 0o644
                    tar.addfile(info, io.BytesIO(data))
        os.replace(temporary, path)
    return paths


def caption_sample(index: int, seed: int = 0) -> dict[str, bytes]:
    """The members of caption sample ``index``: jpg, txt, json, cls."""
    rng = np.random.default_rng([seed, index])
    pixels, photo = render_photo(rng)
    name = photo_names()[photo]
    tone = ("a bright", "a dark", "a grainy", "a washed-out")[int(rng.integers(4))]
    caption = f"{tone} close-up of {SUBJECTS.get(name, name)}"
    height, width = pixels.shape[:2]
    quality = int(rng.choice([80, 90, 95]))
    meta = {"key": f"{index:09d}", "width": width, "height": height, "photo": name, "quality": quality}
    return {
        "jpg": _jpeg(pixels, quality),
        "txt": caption.encode(),
        "json": json.dumps(meta).encode(),
        "cls": str(photo).encode(),
    }


def detection_sample(index: int, seed: int = 0) -> dict[str, bytes]:
    """The members of detection sample ``index``: jpg, json (COCO-style annotations), seg.png."""
    from PIL import Image

    rng = np.random.default_rng([seed, index, 1])
    pixels, _ = render_photo(rng)
    height, width = pixels.shape[:2]
    mask = np.zeros((height, width), dtype=np.uint8)
    annotations = []
    for _ in range(int(rng.integers(1, 6))):
        w, h = int(rng.integers(width // 10, width // 2)), int(rng.integers(height // 10, height // 2))
        x, y = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
        category = int(rng.integers(1, len(CATEGORIES)))
        pixels[y : y + h, x : x + w] = _COLOURS[category]
        mask[y : y + h, x : x + w] = category
        annotations.append({"bbox": [x, y, w, h], "category_id": category})
    # Later boxes cover earlier ones: the mask says what is visible, the boxes what was placed.
    png = io.BytesIO()
    Image.fromarray(mask, mode="L").save(png, format="PNG")
    meta = {"width": width, "height": height, "annotations": annotations}
    return {"jpg": _jpeg(pixels, 90), "json": json.dumps(meta).encode(), "seg.png": png.getvalue()}


def make_caption_shards(
    root: str | os.PathLike[str], num_images: int = 1000, shard_size: int = 250, seed: int = 0
) -> list[Path]:
    """Write image-text shards ``root/captions-NNNNNN.tar`` (see the module docstring); return their paths."""
    return _write_shards(Path(root), "captions", num_images, shard_size, lambda i: caption_sample(i, seed))


def make_detection_shards(
    root: str | os.PathLike[str], num_images: int = 200, shard_size: int = 100, seed: int = 0
) -> list[Path]:
    """Write detection shards ``root/scenes-NNNNNN.tar`` (see the module docstring); return their paths."""
    return _write_shards(Path(root), "scenes", num_images, shard_size, lambda i: detection_sample(i, seed))


def iter_members(path: str | os.PathLike[str]) -> Iterator[tuple[str, bytes]]:
    """``(member name, bytes)`` of a shard, in order (for tests and checks)."""
    with tarfile.open(path) as tar:
        for member in tar:
            file = tar.extractfile(member)
            if file is not None:
                yield member.name, file.read()
