"""The fields route of an :class:`~fastloader.datasets.base.ImageDataset` made with ``fields=``: samples that
hold more than ``(image, label)`` (``fastloader.fields``).

:func:`sample` is one item as its layout asks: the image (through ``ImageDataset._decoded`` for a fused
transform, as any item), the fields the source reads, masks and boxes moved with the image's crop.
:func:`sample_batch` is a batch of them as one :class:`~fastloader.fields.batch.FieldBatch`, fixed-size
images decoded into one batch buffer, each sample under the error policy when there is one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from fastloader.datasets.item import check_index, item_tensor
from fastloader.fields.batch import FieldBatch
from fastloader.fields.reader import image_size
from fastloader.image.batching import allocate_batch
from fastloader.image.geometry import CropPlan
from fastloader.timing import timed

if TYPE_CHECKING:
    from fastloader.datasets.base import ImageDataset


def sample_batch(dataset: ImageDataset[Any], indices: Sequence[int]) -> FieldBatch:
    """Items ``indices`` as a :class:`FieldBatch`; fixed-size images decoded into one batch buffer."""
    layout, size, policy = dataset._layout, dataset.batch_buffer_size(), dataset._errors
    assert layout is not None
    buffer = allocate_batch(len(indices), *size) if size is not None else None
    pixels = None if buffer is None else buffer.numpy()
    samples, kept = [], []
    for slot, index in enumerate(indices):
        index = check_index(index, len(dataset.source))
        out = None if pixels is None else pixels[slot]
        if policy is None:
            item = sample(dataset, index, out)
        else:
            item = policy.fetch(index, dataset.source.key, functools.partial(sample, dataset, out=out))
        if item is not None:
            samples.append(item)
            kept.append(slot)
    if buffer is not None and len(kept) < len(indices):
        buffer = buffer[kept]  # skipped samples: a shorter batch
    return FieldBatch.collate(layout, samples, buffer)


def sample(dataset: ImageDataset[Any], index: int, out: np.ndarray | None = None) -> Any:
    """Item ``index`` as its layout asks; with ``out``, the image is decoded into it (and left out)."""
    layout, reader, fused = dataset._layout, dataset._fields, dataset._fused()
    assert layout is not None and reader is not None
    image: Any = None
    plan: CropPlan | None = None
    source_size: tuple[int, int] | None = None
    transforms: Sequence[Callable[[Any], Any]] = ()
    if fused is not None and (layout.wants_image or layout.annotations):
        pixels, plan = dataset._decoded(fused, index, out, pixels=layout.wants_image)
        if layout.annotations:  # the plan gives their geometry; the tail moves them with the image (below)
            image = None if out is not None else item_tensor(pixels)
            source_size, transforms = cast(CropPlan, plan).source_size, fused.tail
        elif out is None:
            image = dataset._finish(fused, pixels)
    elif layout.wants_image or layout.annotations:
        image = dataset._image(index)
        source_size = image_size(image)
        transforms = () if dataset.transform is None else (dataset.transform,)
        if not layout.annotations and dataset.transform is not None:
            with timed("transform"):  # with annotations, the transform moves them too (below)
                image = dataset.transform(image)
    with timed("read"):
        values = reader.read(index, source_size)
    if layout.annotations:
        with timed("transform"):
            image = reader.move(values, image, plan, transforms)
    for output in layout.outputs:
        if output.role == "image":
            values[output.name] = image
        elif output.role == "label":
            values[output.name] = dataset._label(index)
    return layout.assemble(values)
