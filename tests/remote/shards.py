"""Plain WebDataset tar shards made in memory for the S3 tests: each sample a real image and a label.

The images are PPMs of one size (raw pixels): two shards of the same keys and labels of one digit have
the same size whatever their pixels, the case where size says nothing about content.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

Sample = tuple[str, bytes, int]  # key, image bytes, label


def ppm(index: int, seed: int) -> bytes:
    """A 12x12 RGB image of noise, as a PPM (always the same number of bytes)."""
    pixels = np.random.default_rng([seed, index]).integers(0, 256, size=(12, 12, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PPM")
    return out.getvalue()


def samples(first: int, count: int, label: int, seed: int = 0) -> list[Sample]:
    """``count`` samples keyed ``first..``, images of ``seed``, all labelled ``label`` (one digit)."""
    return [(f"{i:05d}", ppm(i, seed), label) for i in range(first, first + count)]


def tar_bytes(items: Sequence[Sample]) -> bytes:
    """A tar of ``key.ppm`` and ``key.cls`` per sample, with fixed mtimes."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for key, data, label in items:
            for name, content in ((f"{key}.ppm", data), (f"{key}.cls", str(label).encode())):
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(content), 1_700_000_000
                tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


def put(client: Any, bucket: str, key: str, data: bytes) -> str:
    """Put an object; returns its ETag."""
    return str(client.put_object(Bucket=bucket, Key=key, Body=data)["ETag"])


def identity(data: bytes, key: str) -> bytes:
    """A decode that keeps the bytes: items compare as bytes."""
    return data


def read_all(dataset: Any) -> list[tuple[bytes, int]]:
    """(image bytes, label) of every sample, in order."""
    return [(bytes(image), int(label)) for image, label in (dataset[i] for i in range(len(dataset)))]
