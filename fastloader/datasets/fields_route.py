"""The fields route of an :class:`~fastloader.datasets.base.ImageDataset` made with ``fields=``: samples that
hold more than ``(image, label)`` (``fastloader.fields``).

:func:`sample` is one item as its layout asks: the image (through ``Pipeline.decoded`` for a fused
transform, as any item; else the dataset's ``_image``, given as ``image_of``, and its transform), the fields the
source reads, masks and boxes moved with the image's crop. :func:`sample_batch` is a batch of them as one
:class:`~fastloader.fields.batch.FieldBatch`, fixed-size images decoded into one batch buffer, each sample under
the error policy when there is one. Both are given the dataset's :class:`~fastloader.datasets.pipeline.Pipeline`.
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
    from fastloader.datasets.pipeline import Pipeline


def sample_batch(pipeline: Pipeline, image_of: Callable[[int], Any], indices: Sequence[int]) -> FieldBatch:
    """Items ``indices`` as a :class:`FieldBatch`; fixed-size images decoded into one batch buffer."""
    layout, size, policy = pipeline.layout, pipeline.buffer_size, pipeline.errors
    assert layout is not None
    buffer = allocate_batch(len(indices), *size) if size is not None else None
    pixels = None if buffer is None else buffer.numpy()
    samples, kept = [], []
    for slot, index in enumerate(indices):
        index = check_index(index, len(pipeline.source))
        out = None if pixels is None else pixels[slot]
        if policy is None:
            item = sample(pipeline, image_of, index, out)
        else:
            item = policy.fetch(index, pipeline.source.key, functools.partial(sample, pipeline, image_of, out=out))
        if item is not None:
            samples.append(item)
            kept.append(slot)
    if buffer is not None and len(kept) < len(indices):
        buffer = buffer[kept]  # skipped samples: a shorter batch
    return FieldBatch.collate(layout, samples, buffer)


def sample(pipeline: Pipeline, image_of: Callable[[int], Any], index: int, out: np.ndarray | None = None) -> Any:
    """Item ``index`` as its layout asks; with ``out``, the image is decoded into it (and left out). ``image_of``:
    the dataset's image for a transform that does not decode by itself."""
    layout, reader, fused, transform = pipeline.layout, pipeline.fields, pipeline.fused, pipeline.transform
    assert layout is not None and reader is not None
    image: Any = None
    plan: CropPlan | None = None
    source_size: tuple[int, int] | None = None
    transforms: Sequence[Callable[[Any], Any]] = ()
    if fused is not None and (layout.wants_image or layout.annotations):
        pixels, plan = pipeline.decoded(index, out, pixels=layout.wants_image)
        if layout.annotations:  # the plan gives their geometry; the tail moves them with the image (below)
            image = None if out is not None else item_tensor(pixels)
            source_size, transforms = cast(CropPlan, plan).source_size, fused.tail
        elif out is None:
            image = pipeline.finish(pixels)
    elif layout.wants_image or layout.annotations:
        image = image_of(index)
        source_size = image_size(image)
        transforms = () if transform is None else (transform,)
        if not layout.annotations and transform is not None:
            with timed("transform"):  # with annotations, the transform moves them too (below)
                image = transform(image)
    with timed("read"):
        values = reader.read(index, source_size)
    if layout.annotations:
        with timed("transform"):
            image = reader.move(values, image, plan, transforms)
    for output in layout.outputs:
        if output.role == "image":
            values[output.name] = image
        elif output.role == "label":
            values[output.name] = pipeline.label(index)
    return layout.assemble(values)
