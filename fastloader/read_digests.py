"""The delivery ledger's worker half: the CRC32C of each sample's encoded bytes, taken where a dataset reads them.

A DataLoaderX with ``ledger=`` asks each fetch for digests (``fastloader.loader.stage_clock`` turns them on
when the worker unpickles the batch's indices: :func:`begin`); fastloader's datasets call :func:`record` right
after ``Source.read`` (``fastloader.datasets.base``, ``batch_route``), and the worker's stateful fetcher
:func:`take` s them once the batch is made, to travel with it (``fastloader.loader.worker_state.Delivery``):
12 bytes a sample. The training process writes them to the ledger (``fastloader.loader.ledger_writer``).

Digests are taken only when asked: without ``ledger=`` :func:`record` is one attribute read. The list is
this thread's, as the stage clock's tally is (``fastloader.timing``): with ``num_workers=0`` the loader's
producer thread fetches, and another thread reading the same dataset records nothing into its batch.

This module is low in the package, beside ``fastloader.timing``, so that the datasets (workers) record
without importing the loader (the training process).
"""

from __future__ import annotations

import threading

import crc32c
import numpy as np

# One sample read: the dataset's index and the CRC32C of its encoded bytes as the source returned them.
DIGEST = np.dtype([("index", "<i8"), ("crc", "<u4")])


class _Taken(threading.local):
    def __init__(self) -> None:
        self.digests: list[tuple[int, int]] | None = None  # None: this fetch takes no digests


_TAKEN = _Taken()


def begin(on: bool) -> None:
    """A fetch begins in this thread: take digests of what it reads (``on``), or none."""
    _TAKEN.digests = [] if on else None


def record(index: int, data: bytes | bytearray | memoryview) -> None:
    """Sample ``index``'s encoded bytes were read as ``data`` (a no-op unless this fetch takes digests)."""
    digests = _TAKEN.digests
    if digests is not None:
        digests.append((int(index), crc32c.crc32c(data)))


def take() -> np.ndarray | None:
    """The digests of the fetch that just ended, in the order read (None: none taken); stops taking."""
    digests, _TAKEN.digests = _TAKEN.digests, None
    if not digests:
        return None
    return np.array(digests, dtype=DIGEST)
