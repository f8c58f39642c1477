"""The error-policy route of an :class:`~fastloader.datasets.base.ImageDataset`: image by image, each
sample through the policy (``fastloader.datasets.error_policy``: raise, skip, replace).

A batch comes here when it holds a sample the policy excludes (a ``fastloader scan`` report, or found bad
before and quarantined: never read again) or when its decode at once failed (``batch_route.whole_batch``):
:func:`image_by_image` decodes each sample into its slot of the batch buffer, a skipped one leaving the batch
one shorter. Without a batch buffer, :func:`policed_items` gives the items themselves under the policy.
Both are given the dataset's :class:`~fastloader.datasets.pipeline.Pipeline`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fastloader.datasets.error_policy import ErrorPolicy
from fastloader.datasets.item import check_index
from fastloader.image.batching import PrecollatedBatch

if TYPE_CHECKING:
    from fastloader.datasets.pipeline import Pipeline


def policed_items(
    pipeline: Pipeline, policy: ErrorPolicy, indices: Sequence[int], item: Callable[[int], Any]
) -> list[Any]:
    """Items ``indices`` (``item(i)``: the dataset's) one by one under ``policy``: "skip" drops bad samples,
    "replace" substitutes them."""
    source = pipeline.source
    items = (policy.fetch(check_index(i, len(source)), source.key, item) for i in indices)
    return [item for item in items if item is not None]  # "skip" drops bad samples


def image_by_image(pipeline: Pipeline, buffer: torch.Tensor, indices: Sequence[int]) -> PrecollatedBatch:
    """Items ``indices`` (checked positions) decoded one by one into their slots of ``buffer`` under the
    policy; the batch of the samples kept (a shorter one where some were skipped)."""
    pixels = buffer.numpy()
    targets, kept = [], []
    for slot, index in enumerate(indices):
        target = _decode_slot(pipeline, index, pixels[slot])
        if target is not None:
            targets.append(target[0])
            kept.append(slot)
    if len(kept) < len(indices):
        buffer = buffer[kept]  # skipped samples: a shorter batch (rare: a copy is fine)
    return PrecollatedBatch(buffer, targets)


def _decode_slot(pipeline: Pipeline, index: int, out: np.ndarray) -> tuple[Any] | None:
    """Decode item ``index`` into a batch slot under the error policy: ``(label,)``, or None when skipped."""
    policy = pipeline.errors
    if policy is None:  # the hot path: no closure per sample
        pipeline.decoded(index, out)
        return (pipeline.label(index),)

    def produce(i: int) -> tuple[Any]:
        pipeline.decoded(i, out)
        return (pipeline.label(i),)

    return policy.fetch(index, pipeline.source.key, produce)
