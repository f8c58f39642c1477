"""The delivery ledger's worker half: the CRC32C of each sample's encoded bytes, taken where a dataset reads them.

A DataLoaderX with ``ledger=`` asks each fetch for digests (``fastloader.loader.stage_clock`` turns them on
when the worker unpickles the batch's indices: :func:`begin`); fastloader's datasets call :func:`record` right
after ``Source.read`` (``fastloader.datasets.base``, ``batch_route``), and the worker's stateful fetcher
:func:`take` s them once the batch is made, to travel with it (``fastloader.loader.worker_state.Delivery``):
12 bytes a sample. The training process writes them to the ledger (``fastloader.loader.ledger_writer``).

Under an error policy (``fastloader.datasets.error_policy``) the batch is not what was asked: the policy
notes each sample it left out (:func:`skipped`) or gave a substitute for (:func:`replaced`), and these
outcomes travel with the digests, so that the ledger records what was delivered. A batch rebuilt in the
loader's process around a sample that kills workers (``fastloader.loader.worker_restart``) starts its fetch
with the outcomes of that rebuild (:func:`begin`). A batch without a bad sample carries none.

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
# One sample not delivered as asked: the index asked for and the one delivered in its place (SKIPPED: none).
OUTCOME = np.dtype([("asked", "<i8"), ("given", "<i8")])
SKIPPED = -1


class _Taken(threading.local):
    def __init__(self) -> None:
        self.digests: list[tuple[int, int]] | None = None  # None: this fetch takes no digests
        self.outcomes: list[tuple[int, int]] = []  # the policy's, only while digests are taken


_TAKEN = _Taken()


def begin(on: bool, outcomes: tuple[tuple[int, int], ...] = ()) -> None:
    """A fetch begins in this thread: take digests of what it reads (``on``), or none; ``outcomes``: samples
    the batch's indices already leave out or replace (``(asked, given)``, as :func:`replaced` notes them)."""
    _TAKEN.digests = [] if on else None
    _TAKEN.outcomes = list(outcomes) if on else []


def record(index: int, data: bytes | bytearray | memoryview) -> None:
    """Sample ``index``'s encoded bytes were read as ``data`` (a no-op unless this fetch takes digests)."""
    digests = _TAKEN.digests
    if digests is not None:
        digests.append((int(index), crc32c.crc32c(data)))


def skipped(index: int) -> None:
    """Sample ``index`` is left out of this fetch's batch (an error policy's "skip")."""
    if _TAKEN.digests is not None:
        _TAKEN.outcomes.append((int(index), SKIPPED))


def replaced(index: int, substitute: int) -> None:
    """Sample ``substitute`` is delivered in place of ``index`` in this fetch's batch (an error policy's
    "replace")."""
    if _TAKEN.digests is not None:
        _TAKEN.outcomes.append((int(index), int(substitute)))


def take() -> tuple[np.ndarray | None, np.ndarray | None]:
    """The digests of the fetch that just ended, in the order read, and its outcomes (:data:`OUTCOME`,
    in the order made; None: none); stops taking."""
    digests, _TAKEN.digests = _TAKEN.digests, None
    outcomes = None
    if _TAKEN.outcomes:
        outcomes, _TAKEN.outcomes = np.array(_TAKEN.outcomes, dtype=OUTCOME), []
    return (np.array(digests, dtype=DIGEST) if digests else None), outcomes
