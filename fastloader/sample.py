"""A built-in sample: an ImageNet-like folder of JPEGs made from real photographs.

Synthetic noise or flat colours decode far faster than photos and flatter every figure, so the
sample is cut from public-domain / CC0 photographs shipped in ``sample_photos/`` (from
scikit-image's data set: NASA, SpaceX and CC0 photographers). Each image is a random crop of a
photo, resized to ImageNet's typical sizes (most 500x375 or 375x500), colour-jittered, given mild
sensor grain and saved at JPEG quality 75-95, so that sizes and decode cost resemble ImageNet's
(mean about 400x350 px). About 1% are the oddities real datasets contain: grayscale JPEGs, CMYK
JPEGs and PNG files named ``.jpg``.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from functools import cache
from pathlib import Path

import numpy as np

PHOTOS = Path(__file__).parent / "sample_photos"


@cache
def _photos() -> list[np.ndarray]:
    from PIL import Image

    paths = sorted(PHOTOS.glob("*.jpg"))
    if not paths:
        raise FileNotFoundError(f"no sample photographs in {PHOTOS}: the package is incomplete")
    return [np.asarray(Image.open(path).convert("RGB")) for path in paths]


def _target_size(rng: np.random.Generator) -> tuple[int, int]:
    """(width, height) drawn like ImageNet train: mostly 500x375 / 375x500, some other sizes."""
    draw = rng.random()
    if draw < 0.45:
        return 500, 375
    if draw < 0.60:
        return 375, 500
    if draw < 0.65:
        return 500, 333
    width = int(rng.integers(120, 560))
    return width, int(width * rng.uniform(0.6, 1.4))


def _render(rng: np.random.Generator) -> np.ndarray:
    return render_photo(rng)[0]


def photo_names() -> list[str]:
    """The sample photographs' names (``astronaut``, ...), in the order :func:`render_photo` numbers them."""
    return [path.stem for path in sorted(PHOTOS.glob("*.jpg"))]


def render_photo(rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """An ImageNet-like image cut from a sample photograph (see the module docstring), and the photograph's number."""
    from PIL import Image

    photos = _photos()
    number = int(rng.integers(len(photos)))
    photo = photos[number]
    width, height = _target_size(rng)
    ph, pw = photo.shape[:2]
    # The largest crop of the photo's area fraction `scale` with the target's aspect ratio.
    scale = rng.uniform(0.3, 1.0)
    aspect = width / height
    crop_w = min(pw, int(round(np.sqrt(scale * pw * ph * aspect))))
    crop_h = min(ph, int(round(crop_w / aspect)))
    x, y = int(rng.integers(0, pw - crop_w + 1)), int(rng.integers(0, ph - crop_h + 1))
    image = Image.fromarray(photo[y : y + crop_h, x : x + crop_w]).resize((width, height), Image.Resampling.BICUBIC)
    pixels = np.asarray(image).astype(np.float32)
    if rng.random() < 0.5:
        pixels = pixels[:, ::-1]
    # colour and brightness jitter
    pixels = pixels * rng.uniform(0.75, 1.25, size=3).astype(np.float32) + np.float32(rng.uniform(-20, 20))
    # Sensor grain, mostly in luminance as in real photos: it gives the sample a photo's entropy
    # (file size and decode cost), which smooth upscaled crops alone lack.
    grain = rng.normal(0.0, rng.uniform(5.0, 10.0), size=pixels.shape[:2])[..., None]
    pixels += (grain + rng.normal(0.0, 2.0, size=pixels.shape)).astype(np.float32)
    return np.clip(pixels, 0, 255).astype(np.uint8), number


def _write_one(job: tuple[str, int, int]) -> int:
    """Write image ``index`` (seeded by ``seed`` and ``index``) to ``path``; return its size in bytes."""
    from PIL import Image

    path, seed, index = job
    rng = np.random.default_rng([seed, index])
    image = Image.fromarray(_render(rng))
    quality = int(rng.choice([75, 80, 85, 90, 90, 92, 95, 95]))  # ImageNet leans to high quality
    oddity = rng.random()
    if oddity < 0.004:
        image.convert("L").save(path, format="JPEG", quality=quality)
    elif oddity < 0.007:
        image.convert("CMYK").save(path, format="JPEG", quality=quality)
    elif oddity < 0.010:
        image.save(path, format="PNG")  # a PNG named .jpg, as crawled datasets have
    else:
        image.save(path, format="JPEG", quality=quality)
    return os.path.getsize(path)


def make_sample_folder(
    root: str | os.PathLike[str],
    num_images: int = 2000,
    num_classes: int = 10,
    seed: int = 0,
    workers: int | None = None,
) -> Path:
    """Write an ImageFolder tree ``root/class_XX/NNNNNN.jpg`` of ``num_images`` photos; return ``root``.

    Deterministic for a seed. Images already present are kept, so a second call is instant.
    """
    if num_images < 1 or num_classes < 1:
        raise ValueError(f"num_images and num_classes must be >= 1, got {num_images}, {num_classes}")
    root = Path(root)
    jobs = []
    for index in range(num_images):
        folder = root / f"class_{index % num_classes:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{index:06d}.jpg"
        if not path.exists():
            jobs.append((str(path), seed, index))
    if jobs:
        with ProcessPoolExecutor(max_workers=workers or os.cpu_count()) as pool:
            for _ in pool.map(_write_one, jobs, chunksize=16):
                pass
    return root
