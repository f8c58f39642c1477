"""The decoded-cache route of an :class:`~fastloader.datasets.base.ImageDataset`: pixels of a fixed
transform kept for the next epochs (``fastloader.image.decoded_cache``). Its functions are given the
dataset's :class:`~fastloader.datasets.pipeline.Pipeline`.

:func:`open_cache` is ``set_cache``'s part (what a cache needs of the pipeline, then the file);
:func:`checked_cache` refuses a cache made for another transform, before each use; one item goes through
the cache in ``Pipeline.decoded``, a batch in :func:`cached_batch`: the cached images copied from it,
the rest decoded at once (``fastloader.datasets.batch_route``) and stored.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fastloader.datasets.batch_route import whole_batch
from fastloader.image.decode import pixels_made_by
from fastloader.image.decoded_cache import CacheMeta, DecodedCache, item_identities, source_fingerprint
from fastloader.timing import timed
from fastloader.transforms.fused import FusedTransform

if TYPE_CHECKING:
    from fastloader.datasets.pipeline import Pipeline


def open_cache(pipeline: Pipeline, path: str | os.PathLike[str]) -> tuple[DecodedCache, FusedTransform]:
    """The decoded cache at ``path`` for the pipeline's transform, and that transform; ValueError where the
    dataset cannot have one (no fixed fastloader transform, annotations that follow the crop, GPU decode)."""
    fused = pipeline.fused
    if fused is None:
        raise ValueError(f"cache needs a fastloader transform with the default decode; got {pipeline.transform!r}")
    if pipeline.layout is not None and pipeline.layout.annotations:
        raise ValueError("cache: a dataset whose masks or boxes follow the crop reads its images, not a cache")
    if fused.is_random:
        raise ValueError(
            f"cache needs a fixed transform, but {fused.describe()} draws random crops or flips:"
            " cache evaluation transforms such as Compose([Resize(256), CenterCrop(224)])"
        )
    size = fused.decoded_size
    if size is None:
        raise ValueError(f"cache needs a fixed output size (end with CenterCrop or Resize((h, w))); got {fused!r}")
    if pipeline.decode_device != "cpu":
        raise ValueError("cache: a dataset that decodes on the GPU cannot cache decoded images")
    source = pipeline.source
    # Keyed by everything that changes the pixels: the steps, and how they decode (the mode, the decoders).
    made = f"{fused.describe()} | {pixels_made_by(fast=not fused.exact_decode)}"
    meta = CacheMeta(len(source), size[0], size[1], made, source_fingerprint(source))
    return DecodedCache.open(path, meta), fused


def checked_cache(pipeline: Pipeline) -> DecodedCache:
    """The decoded cache, refused when the transform is not the one it was made for."""
    cache = pipeline.cache
    assert cache is not None
    if pipeline.fused is not pipeline.cached_transform:
        raise ValueError("the transform changed after set_cache: call set_cache again (or set_cache(None))")
    return cache


def cached_batch(pipeline: Pipeline, indices: Sequence[int], pixels: np.ndarray) -> list[Any] | None:
    """Items ``indices`` into ``pixels`` through the decoded cache: the cached ones copied from it, the rest
    decoded at once (``batch_route.whole_batch``) and stored; their labels, or None where the batch must go
    image by image (a bad sample under a policy)."""
    cache = checked_cache(pipeline)
    with timed("read"):  # decoded pixels from the cache, if the items are still the ones cached
        identities = item_identities(pipeline.source, indices)  # before the reads of a decode (decoded_cache)
        cached = cache.read_batch(indices, pixels, identities)
    missing = np.flatnonzero(~cached)
    if len(missing):
        wanted = [indices[int(slot)] for slot in missing]
        decoded = np.empty((len(missing), *pixels.shape[1:]), dtype=np.uint8)
        if whole_batch(pipeline, wanted, decoded) is None:
            return None
        pixels[missing] = decoded
        cache.write_batch(wanted, decoded, identities[missing])
    return [pipeline.label(index) for index in indices]
