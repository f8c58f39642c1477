"""How fast the dataset's storage gives its bytes: sequential and random reads (``fastloader doctor``).

Reads go through the dataset's source (``read(i)``), the same path the workers take. The figures
include the operating system's page cache: data read recently (a previous run) comes from memory.
Sequential reads take the first items, random reads items drawn from the rest, so the second
measurement is not served by the first. An item that cannot be read (a file deleted or unreadable since
it was indexed) is passed over and counted (``unreadable``): one bad file does not stop the doctor.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from fastloader.datasets.base import Source
from fastloader.errors import FormatError


def read_speed(source: Source, seconds: float = 1.5, limit: int = 2000) -> dict[str, Any]:
    """``{"sequential": {...}, "random": {...}}``: MB/s, files/s, files, bytes and seconds of each."""
    count = len(source)
    half = max(1, count // 2)
    sequential = np.arange(min(half, limit))
    rest = np.arange(half, count) if count > 1 else np.arange(count)
    random_order = np.random.default_rng(0).permutation(rest)[:limit]
    return {"sequential": _read(source, sequential, seconds), "random": _read(source, random_order, seconds)}


def _read(source: Source, indices: np.ndarray, seconds: float) -> dict[str, Any]:
    files = size = unreadable = 0
    start = time.perf_counter()
    elapsed = 0.0
    for index in indices:
        try:
            size += len(source.read(int(index)))
            files += 1
        except (OSError, FormatError):
            unreadable += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    return {
        "mb_per_s": size / 1e6 / elapsed if elapsed > 0 else None,
        "files_per_s": files / elapsed if elapsed > 0 else None,
        "files": files,
        "bytes": size,
        "seconds": elapsed,
        "unreadable": unreadable,
    }
