"""The batch route of an :class:`~fastloader.datasets.base.ImageDataset`: a batch of fixed-size images
decoded at once into its buffer, given the dataset's :class:`~fastloader.datasets.pipeline.Pipeline`.

``ImageDataset.__getitems__`` takes it for a fused transform of fixed size (with a decoded cache, the
cache's route, ``fastloader.datasets.cache_route``, decodes what it misses through here). The reads come
first, then the headers, the plans and the decodes, the JPEGs in one call of the extension
(``FusedTransform.decode_batch``), each stage timed once per call. Under an error policy the batch is
tried at once all the same (bad samples are rare) and given up at its first failure: the policy's route
(``fastloader.datasets.policy_route``) then goes image by image.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from fastloader import read_digests, sample_seeds
from fastloader.image.batching import decode_threads
from fastloader.timing import timed
from fastloader.transforms.fused import FusedTransform

if TYPE_CHECKING:
    from fastloader.datasets.base import Source
    from fastloader.datasets.pipeline import Pipeline

# Encoded bytes a batch's decode holds at once: all of a batch of small images (256 x 20 KB), a few calls for
# large ones, so that a worker never holds a whole batch of 10 MB images beside their pixels.
_BATCH_BYTES = 16 << 20


def whole_batch(pipeline: Pipeline, indices: Sequence[int], pixels: np.ndarray) -> list[Any] | None:
    """Items ``indices`` decoded at once into ``pixels`` (:func:`decode_batch`): their labels, or None where
    the batch must go image by image. Under an error policy the batch is tried at once first (bad samples are
    rare) and given up at its first failure, the random state put back (of the generator the plans draw from: a
    thread worker's own, else torch's global one): image by image, the policy then handles each sample as it would
    have, with the same random draws. (A batch holding a sample the policy excludes never comes here:
    ``__getitems__`` sends it image by image from the start.)"""
    generator = torch.random.thread_safe_generator()  # what the crop plans draw from (a thread worker's own)
    state = None if pipeline.errors is None else (generator or torch.default_generator).get_state()
    try:
        decode_batch(pipeline.source, cast(FusedTransform, pipeline.fused), indices, pixels, pipeline.decode_threads)
        return [pipeline.label(index) for index in indices]
    except Exception:  # a bad sample's, whatever it raised: under a policy, the policy decides image by image
        if state is None:
            raise
        (generator or torch.default_generator).set_state(state)
        return None


def decode_batch(
    source: Source, fused: FusedTransform, indices: Sequence[int], pixels: np.ndarray, threads: int | None
) -> None:
    """Items ``indices`` through the fused steps into ``pixels[i]``: reads, then decodes, the JPEGs in one
    call of the extension (``FusedTransform.decode_batch``) on ``threads`` (``decode_threads`` decides for
    None); errors name the item's key. The encoded bytes held at once are bounded (``_BATCH_BYTES``: a batch
    of large images goes in several calls). With ``seed=`` each image's crop is drawn from its own key
    (``fastloader.sample_seeds``)."""
    seeded = sample_seeds.current() is not None
    start = 0
    while start < len(indices):
        blobs: list[bytes] = []
        held = 0
        with timed("read"):
            while start + len(blobs) < len(indices) and held < _BATCH_BYTES:
                index = indices[start + len(blobs)]
                blobs.append(source.read(index))
                held += len(blobs[-1])
                read_digests.record(index, blobs[-1])  # the ledger's digest (off unless ledger=)
        end = start + len(blobs)
        keys = [source.key(index) for index in indices[start:end]]  # for errors; a fraction of a µs each
        generators = _generators(indices, start) if seeded else None
        with timed("decode"):
            fused.decode_batch(blobs, pixels[start:end], keys.__getitem__, decode_threads(threads), generators)
        start = end


def _generators(indices: Sequence[int], start: int) -> Any:
    """Image ``slot`` of the call starting at ``start``: the generator its sample draws from (seed=)."""
    return lambda slot: sample_seeds.generator(indices[start + slot])
