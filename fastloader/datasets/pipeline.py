"""What decides an :class:`~fastloader.datasets.base.ImageDataset` sample's route, in one small object: the
:class:`Pipeline` the routes (``batch_route``, ``cache_route``, ``policy_route``, ``fields_route``) are given.

The dataset builds it from its configuration (the source, the transform, the label's, the error policy, the
decoded cache, the decode device and threads, the fields' layout) and builds it again when that changes: its
setters drop it, and a transform or target transform reassigned (public attributes) is seen at the next item
(``ImageDataset._pipeline``). It holds the one route from bytes to pixels, :meth:`Pipeline.decoded`, timed
there once. It never refers back to the dataset: a copied or pickled dataset carries it along, and a subclass's
``_image`` (a transform that does not decode by itself) reaches the routes as an argument where they need it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from fastloader import read_digests, sample_seeds
from fastloader.datasets.cache_route import checked_cache
from fastloader.datasets.error_policy import ErrorPolicy
from fastloader.datasets.item import item_tensor
from fastloader.fields.reader import FieldReader
from fastloader.fields.specs import Layout
from fastloader.image.batching import EncodedImage
from fastloader.image.decoded_cache import UNTRUSTED, DecodedCache, item_identities
from fastloader.image.geometry import CropPlan
from fastloader.timing import timed
from fastloader.transforms.fused import FusedTransform

if TYPE_CHECKING:
    from fastloader.datasets.base import Source


@dataclass(frozen=True)
class Pipeline:
    """A dataset's route parts for one configuration (see the module docstring).

    ``fused``: the transform when it decodes the source's bytes itself (a fastloader transform with the
    default decode), else None and ``transform`` runs on the dataset's ``_image``. ``decodes_bytes`` is the
    dataset's ``_decodes_bytes()`` it was built with (with ``transform``, ``target_transform`` and ``source``,
    what tells a stale pipeline). ``cache`` and ``cached_transform``: the decoded cache and the transform
    ``set_cache`` made it for. ``decode_threads``: None lets ``fastloader.image.batching.decode_threads``
    decide. ``layout`` and ``fields``: the resolved ``fields=`` and its reader, None without fields.
    """

    source: Source
    transform: Callable[[Any], Any] | None
    target: Callable[[int], Any]
    target_transform: Callable[[Any], Any] | None
    decodes_bytes: bool
    fused: FusedTransform | None
    errors: ErrorPolicy | None
    cache: DecodedCache | None
    cached_transform: FusedTransform | None
    decode_device: str
    decode_threads: int | None
    layout: Layout | None
    fields: FieldReader | None

    def made_for(self, source: Source, transform: Any, target_transform: Any, decodes_bytes: bool) -> bool:
        """Whether this pipeline was built for these public parts of the dataset (by identity)."""
        return (
            transform is self.transform
            and target_transform is self.target_transform
            and source is self.source
            and decodes_bytes == self.decodes_bytes
        )

    @property
    def buffer_size(self) -> tuple[int, int] | None:
        """``(height, width)`` of the uint8 batch buffer a batch is decoded into, or None when there is none
        (no fused transform of fixed size, GPU decode, fields without an image)."""
        size = self.fused.output_size if self.fused is not None else None
        if size is None or self.decode_device != "cpu":
            return None
        if self.layout is not None and not self.layout.wants_image:
            return None
        return size

    def label(self, index: int) -> Any:
        """Item ``index``'s label, through the target transform."""
        label = self.target(index)
        return label if self.target_transform is None else self.target_transform(label)

    def decoded(self, index: int, out: np.ndarray | None = None, pixels: bool = True) -> tuple[Any, CropPlan | None]:
        """Item ``index`` through the fused steps: the one route from bytes to pixels, and its one timing.

        The configuration chose the route; each item runs it: the cache when it holds the item, else read ->
        header -> crop plan -> decode (:meth:`~fastloader.transforms.FusedTransform.decode_planned`), into
        ``out`` when given. Decoding on the GPU, the image stays encoded, with its plan; ``pixels=False``: the
        plan only. Returns (H×W×3 uint8 pixels, an ``EncodedImage`` or None; the crop plan, None for pixels from
        the cache). Only for a pipeline with a fused transform.
        """
        fused = self.fused
        if fused is None:
            raise TypeError("Pipeline.decoded needs a fused transform (a fastloader transform, default decode)")
        cache = None if self.cache is None else checked_cache(self)
        identity = UNTRUSTED
        if cache is not None:
            size = cast(tuple[int, int], fused.decoded_size)  # fixed: set_cache checked it
            out = np.empty((*size, 3), dtype=np.uint8) if out is None else out
            with timed("read"):  # decoded pixels from the cache, if the item is still the one cached
                identity = int(item_identities(self.source, [index])[0])  # before the read below
                if cache.read_into(index, out, identity):
                    return out, None
        gpu = self.decode_device != "cpu"
        with timed("read"):
            data = self.source.read(index)
        read_digests.record(index, data)  # the ledger's digest of the bytes as read (off unless ledger=)
        with timed("decode"):  # fused with the crop and resize; for the GPU, only the header and the plan
            key = self.source.key(index)
            generator = sample_seeds.generator(index)  # seed=: the sample's own draws; else torch's global generator
            header, plan, decoded = fused.decode_planned(data, key, out, pixels=pixels and not gpu, generator=generator)
        if gpu:
            return EncodedImage(data, plan, key, header, index), plan
        if cache is not None and decoded is not None:
            cache.write(index, decoded, identity)
        return decoded, plan

    def finish(self, image: Any) -> Any:
        """Decoded pixels as a C×H×W tensor, through the fused transform's tail; an encoded image as it is."""
        image = item_tensor(image)
        if self.fused is None or not self.fused.tail or not isinstance(image, torch.Tensor):
            return image
        with timed("transform"):
            return self.fused.finish(image)
