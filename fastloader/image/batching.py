"""Batches without per-sample tensors: decoded pixels go straight into one uint8 batch buffer.

torch's fetcher calls ``dataset.__getitems__(indices)`` when a dataset defines it. For a fused
transform with a fixed output size, :class:`~fastloader.datasets.base.ImageDataset` allocates
one uint8 ``(N, H, W, 3)`` buffer (:func:`allocate_batch`: a slot of the DataLoaderX's batch ring,
``fastloader.image.batch_ring``, else fresh memory, in a worker process directly in shared memory, as
``default_collate`` does, so handing it to the main process copies nothing), decodes each sample into
its row and returns a :class:`PrecollatedBatch`.

:func:`collate` turns that into ``[images, labels]`` without a copy — ``images`` is N×3×H×W uint8
in channels_last memory (the buffer, permuted), ``labels`` int64 — and is ``default_collate`` for
anything else. A plain DataLoader with ``default_collate`` still gets the same batch (one copy):
a PrecollatedBatch is a list of ``(image, label)`` pairs, each image a C×H×W view into the buffer.

With GPU decode (``ImageDataset.set_decode_device("cuda")``) items are ``(EncodedImage, label)``
and :func:`collate` makes ``[list of EncodedImage, labels]``.

Any batch that is already collated in the worker says so with a ``collated()`` method
(:class:`Collated`): a dataset given ``fields=`` returns one (``fastloader.fields.batch.FieldBatch``),
and :func:`collate` hands over what that method gives.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch.utils.data import default_collate, get_worker_info

from fastloader.image import batch_ring, pages
from fastloader.image.decode import ImageHeader
from fastloader.image.geometry import CropPlan
from fastloader.torch_internals import collate_with, default_collate_fn_map, shared_storage


@dataclass(frozen=True)
class EncodedImage:
    """An image still encoded, with the crop plan a GPU decoder applies to it; ``key`` names it in errors."""

    data: bytes
    plan: CropPlan
    key: str
    header: ImageHeader | None = None  # read in the worker: the GPU decoder does not parse it again
    index: int | None = None  # the dataset position: the error policy's substitutes start from it


def allocate_batch(count: int, height: int, width: int) -> torch.Tensor:
    """An uninitialised uint8 ``(count, height, width, 3)`` tensor: the fetch's batch ring slot when a DataLoaderX
    gave it one (``fastloader.image.batch_ring``), else fresh memory (in a DataLoader worker, shared memory)."""
    shape = (count, height, width, 3)
    slot = batch_ring.take(count * height * width * 3)
    if slot is not None:
        return slot.view(shape)
    info = get_worker_info()
    if info is None or info.worker_method == "thread":  # a thread worker's batch stays in this process
        buffer = torch.empty(shape, dtype=torch.uint8)
    else:
        # Shared from the start: the worker's queue then sends a handle to it instead of copying it.
        storage = shared_storage(count * height * width * 3)
        buffer = torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)
    if buffer.numel():
        pages.populate(buffer.data_ptr(), buffer.numel())  # fresh memory: its pages in one call
    return buffer


# Threads a worker's batch decode runs on by default at most: past a few, each worker's share of memory
# bandwidth and of the cores other workers also want is what grows, not its rate.
AUTO_DECODE_THREADS = 4


def decode_threads(setting: int | None = None) -> int:
    """Threads for one batch decode in this process (``jpeg_ext.decode_resized_batch``): ``setting`` when given;
    by default, in a DataLoader worker, the cores this process may run on less one (the training process's),
    shared among the loader's workers, at most ``AUTO_DECODE_THREADS``; 1 in the training process itself
    (``num_workers=0``), which is left to the training loop."""
    if setting is not None:
        return setting
    info = get_worker_info()
    if info is None:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(AUTO_DECODE_THREADS, (cores - 1) // max(1, info.num_workers)))


def collate_labels(targets: Sequence[Any]) -> Any:
    """int64 labels for int targets; anything else collated as ``default_collate`` would."""
    if all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in targets):
        return torch.tensor([int(t) for t in targets], dtype=torch.int64)
    return default_collate(list(targets))


class PrecollatedBatch(list[tuple[torch.Tensor, Any]]):
    """A list of ``(image, label)`` pairs that already holds its collated batch.

    ``images``: N×3×H×W uint8, channels_last memory (``buffer.permute(0, 3, 1, 2)``); item i's
    image is ``images[i]``, a view. ``labels``: int64 (``default_collate`` of non-int targets).
    """

    images: torch.Tensor
    labels: Any

    def __init__(self, buffer: torch.Tensor, targets: Sequence[Any]) -> None:
        if buffer.dim() != 4 or buffer.shape[-1] != 3 or buffer.dtype != torch.uint8:
            raise ValueError(f"buffer must be a uint8 (N, H, W, 3) tensor, got {buffer.dtype} {tuple(buffer.shape)}")
        if len(targets) != buffer.shape[0]:
            raise ValueError(f"{len(targets)} targets for a buffer of {buffer.shape[0]} images")
        images = buffer.permute(0, 3, 1, 2)
        super().__init__(zip(images.unbind(0), targets))
        self.images = images
        self.labels = collate_labels(targets)
        self._targets = list(targets)

    def collated(self) -> list[Any]:
        """``[images, labels]``: a list, as default_collate makes of (image, label) pairs."""
        return [self.images, self.labels]

    def __reduce__(self) -> tuple[Callable[..., PrecollatedBatch], tuple[torch.Tensor, list[Any]]]:
        # Pickle the buffer once, not N views of it (each view would share its storage again).
        return PrecollatedBatch, (self.images.permute(0, 2, 3, 1), self._targets)


@runtime_checkable
class Collated(Protocol):
    """A batch collated in the worker (:class:`PrecollatedBatch`, a dataset's batch of fields):
    ``collated()`` is what the loader receives."""

    def collated(self) -> Any: ...


def _collate_encoded(batch: Sequence[EncodedImage], *, collate_fn_map: Any = None) -> list[EncodedImage]:
    return list(batch)


_COLLATE_FN_MAP = {**default_collate_fn_map, EncodedImage: _collate_encoded}


def collate(batch: Any) -> Any:
    """``[images, labels]`` of a :class:`PrecollatedBatch` without a copy, what any other batch
    collated in the worker holds (``collated()``); else ``default_collate`` (which also keeps a batch's
    :class:`EncodedImage` items as a list, for the GPU decoder)."""
    if isinstance(batch, list) and isinstance(batch, Collated):
        return batch.collated()
    return collate_with(batch, collate_fn_map=_COLLATE_FN_MAP)
