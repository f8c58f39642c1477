"""The one protocol every dataset is built on: a *source* of encoded images, decoded and transformed.

A source answers three questions about item ``i`` (``0 <= i < len(source)``): its encoded bytes
(JPEG, PNG, ... exactly as stored), its integer label, and a human-readable key (a path, an LMDB
key, a shard and member name) used in every error message. Plug in your own storage by writing
those four methods::

    class MySource:
        def __len__(self) -> int: ...
        def read(self, index: int) -> bytes: ...
        def label(self, index: int) -> int: ...
        def key(self, index: int) -> str: ...

    dataset = ImageDataset(MySource(...), transform=...)

With a fastloader transform (``fastloader.transforms``) and the default ``loader``, the transform
decodes the bytes itself, at the size it needs (items are uint8 C×H×W tensors), and
``__getitems__`` writes whole batches into one buffer (``fastloader.image.batching``). Two switches
work on any dataset: ``set_cache(path)`` keeps decoded images of a fixed transform for the next
epochs (``fastloader.image.decoded_cache``), and ``set_decode_device("cuda")`` leaves decoding to the
GPU (items are then ``EncodedImage`` with their crop plan).

Samples with more than a label: a source that also implements ``fastloader.fields.FieldSource``
gives its fields to a dataset created with ``fields=("jpg", "txt", "json")`` (items are tuples in
that order) or ``fields={"image": "jpg", "caption": "txt"}`` (items are dicts); masks and boxes
(``fastloader.fields.Mask`` / ``Boxes``) move with the image's crop (see ``fastloader.fields``).

Sources must hold no per-sample Python objects (at 10M samples each worker's refcount writes
would copy-on-write them into GBs): keep indexes in numpy arrays, ideally memory-mapped, and open
files / environments lazily in each process (see ``fastloader.datasets.handles``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar, cast, runtime_checkable

import numpy as np
import torch
from torch.utils.data import Dataset

from fastloader.datasets.error_policy import ErrorPolicy, read_exclusions
from fastloader.fields.batch import FieldBatch
from fastloader.fields.reader import FieldReader, image_size
from fastloader.fields.source import aliases, field_kinds
from fastloader.fields.specs import Layout, Spec, resolve
from fastloader.image.batching import EncodedImage, PrecollatedBatch, allocate_batch, decode_threads
from fastloader.image.decoded_cache import UNTRUSTED, CacheMeta, DecodedCache, item_identities, source_fingerprint
from fastloader.image.geometry import CropPlan
from fastloader.image.gpu_decode import check_filters
from fastloader.image.jpeg_ext import MAX_THREADS
from fastloader.image.pil import decode_pil
from fastloader.timing import timed
from fastloader.transforms.fused import FusedTransform

T = TypeVar("T")
# Encoded bytes a batch's decode holds at once: all of a batch of small images (256 x 20 KB), a few calls for
# large ones, so that a worker never holds a whole batch of 10 MB images beside their pixels.
_BATCH_BYTES = 16 << 20


@runtime_checkable
class Source(Protocol):
    """Random access to encoded images and their labels (see the module docstring)."""

    def __len__(self) -> int: ...

    def read(self, index: int) -> bytes: ...

    def label(self, index: int) -> int: ...

    def key(self, index: int) -> str: ...


def check_index(index: int, length: int) -> int:
    """Normalise a possibly negative index, raising IndexError outside ``[-length, length)``."""
    if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
        raise TypeError(f"dataset indices must be integers, got {type(index).__name__}")
    index = int(index)
    if index < 0:
        index += length
    if not 0 <= index < length:
        raise IndexError(f"index {index} out of range for a dataset of {length} items")
    return index


class ImageDataset(Dataset[tuple[Any, Any]], Generic[T]):
    """A map-style dataset over a :class:`Source`: item i is ``(transform(image), target_transform(label))``.

    ``decode(bytes, key)`` turns encoded bytes into an image (default: RGB ``PIL.Image``, as
    torchvision's ``ImageFolder``), so torchvision transforms work unchanged. A fastloader transform
    instead gets the encoded bytes and decodes them itself (see the module docstring); ``cache``, a
    path, is :meth:`set_cache`.

    ``fields``: what an item holds besides ``(image, label)`` (see the module docstring and
    ``fastloader.fields.specs``): a sequence gives tuple items, a mapping dict items.

    One route from bytes to pixels: with a fastloader transform, ``ds[i]``, the batch buffer of
    ``__getitems__``, samples with fields and GPU decode all get their image from ``_decoded()`` (the
    cache, else read -> header -> crop plan -> decode, timed there once); a batch buffer with no cache takes
    the same steps for the whole batch at once (``_decode_batch()``: the reads, then the headers and plans,
    then the decodes in one call of the JPEG extension), and under an error policy goes image by image when a
    sample of the batch fails (``_whole_batch()``). Without one, the image comes
    from ``_image()`` (the one override point: ImageFolder's ``loader(path)`` is one) and the transform.
    """

    def __init__(
        self,
        source: Source,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        decode: Callable[[bytes, str], Any] = decode_pil,
        *,
        cache: str | os.PathLike[str] | None = None,
        fields: Sequence[Spec] | Mapping[str, Spec] | None = None,
    ) -> None:
        if not isinstance(source, Source):
            raise TypeError(f"source must provide __len__, read, label and key; got {type(source).__name__}")
        self.source = source
        self.transform = transform
        self.target_transform = target_transform
        self.decode = decode
        # A source may offer a richer ``target(i)`` than the int ``label(i)`` (RecordIO multi-label).
        self._target: Callable[[int], Any] = getattr(source, "target", source.label)
        self._decode_device = "cpu"
        self._cache: DecodedCache | None = None
        self._cached_transform: FusedTransform | None = None
        self._errors: ErrorPolicy | None = None
        self._decode_threads: int | None = None  # None: fastloader.image.batching.decode_threads decides
        # The class names a source knows (a folder's, a pack's manifest), as torchvision's datasets name them.
        classes = getattr(source, "classes", None)
        self.classes: list[str] | None = None if classes is None else list(classes)
        self.class_to_idx = None if self.classes is None else {name: i for i, name in enumerate(self.classes)}
        self.fields = fields
        self._layout: Layout | None = None
        self._fields: FieldReader | None = None
        if fields is not None:
            self._layout = resolve(fields, field_kinds(source), aliases(source))
            self._fields = FieldReader(source, self._layout)
        if cache is not None:
            self.set_cache(cache)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        index = check_index(index, len(self.source))
        if self._errors is None:
            return self._item(index)
        # One item cannot be skipped: "skip" replaces it here (batches skip in __getitems__).
        return self._errors.fetch(index, self.source.key, self._item, allow_skip=False)  # type: ignore[return-value]

    def _item(self, index: int) -> Any:
        if self._layout is not None:
            return self._sample(index)
        fused = self._fused()
        if fused is not None:
            return self._finish(fused, self._decoded(fused, index)[0]), self._label(index)
        image = self._image(index)
        label = self._target(index)
        if self.transform is not None:
            with timed("transform"):
                image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, Any]]:
        """Items ``indices`` as one :class:`~fastloader.image.batching.PrecollatedBatch` when the transform
        is fused and of fixed size (decoded into one batch buffer); else a list of ``self[i]``."""
        if self._layout is not None:
            return self._sample_batch(indices)
        fused, size, policy = self._fused(), self.batch_buffer_size(), self._errors
        if fused is None or size is None:
            if policy is None:
                return [self[index] for index in indices]
            items = (policy.fetch(check_index(i, len(self)), self.source.key, self._item) for i in indices)
            return [item for item in items if item is not None]  # "skip" drops bad samples
        buffer = allocate_batch(len(indices), *size)
        pixels = buffer.numpy()
        positions = [check_index(index, len(self.source)) for index in indices]
        if policy is not None and policy.excludes_any(positions, self.source.key):
            labels = None  # image by image from the start: an excluded or found-bad sample is never read again
        elif self._cache is None:
            labels = self._whole_batch(fused, positions, pixels)
        else:
            labels = self._cached_batch(fused, positions, pixels)
        if labels is not None:  # the hot path: the whole batch at once
            return PrecollatedBatch(buffer, labels)
        targets, kept = [], []
        for slot, index in enumerate(positions):
            target = self._decode_slot(fused, index, pixels[slot])
            if target is not None:
                targets.append(target[0])
                kept.append(slot)
        if len(kept) < len(indices):
            buffer = buffer[kept]  # skipped samples: a shorter batch (rare: a copy is fine)
        return PrecollatedBatch(buffer, targets)

    def batch_buffer_size(self) -> tuple[int, int] | None:
        """``(height, width)`` of the uint8 batch buffer ``__getitems__`` decodes a batch into, or None when it
        makes none (no fused transform of fixed size, GPU decode, fields without an image). A DataLoaderX sizes
        its batch ring by it (``fastloader.image.batch_ring``)."""
        fused = self._fused()
        size = fused.output_size if fused is not None else None
        if size is None or self._decode_device != "cpu":
            return None
        if self._layout is not None and not self._layout.wants_image:
            return None
        return size

    def _whole_batch(self, fused: FusedTransform, indices: Sequence[int], pixels: np.ndarray) -> list[Any] | None:
        """Items ``indices`` decoded at once into ``pixels`` (:meth:`_decode_batch`): their labels, or None where
        the batch must go image by image. Under an error policy the batch is tried at once first (bad samples are
        rare) and given up at its first failure, torch's random state put back: image by image, the policy then
        handles each sample as it would have, with the same random draws. (A batch holding a sample the policy
        excludes never comes here: ``__getitems__`` sends it image by image from the start.)"""
        state = None if self._errors is None else torch.get_rng_state()
        try:
            self._decode_batch(fused, indices, pixels)
            return [self._label(index) for index in indices]
        except Exception:  # a bad sample's, whatever it raised: under a policy, the policy decides image by image
            if state is None:
                raise
            torch.set_rng_state(state)
            return None

    def _cached_batch(self, fused: FusedTransform, indices: Sequence[int], pixels: np.ndarray) -> list[Any] | None:
        """Items ``indices`` into ``pixels`` through the decoded cache: the cached ones copied from it, the rest
        decoded at once (:meth:`_whole_batch`) and stored; their labels, or None where the batch must go image by
        image (a bad sample under a policy)."""
        cache = self._checked_cache(fused)
        with timed("read"):  # decoded pixels from the cache, if the items are still the ones cached
            identities = item_identities(self.source, indices)  # before the reads of a decode (decoded_cache)
            cached = cache.read_batch(indices, pixels, identities)
        missing = np.flatnonzero(~cached)
        if len(missing):
            wanted = [indices[int(slot)] for slot in missing]
            decoded = np.empty((len(missing), *pixels.shape[1:]), dtype=np.uint8)
            if self._whole_batch(fused, wanted, decoded) is None:
                return None
            pixels[missing] = decoded
            cache.write_batch(wanted, decoded, identities[missing])
        return [self._label(index) for index in indices]

    def _checked_cache(self, fused: FusedTransform) -> DecodedCache:
        """The decoded cache, refused when the transform is not the one it was made for."""
        cache = self._cache
        assert cache is not None
        if fused is not self._cached_transform:
            raise ValueError("the transform changed after set_cache: call set_cache again (or set_cache(None))")
        return cache

    def _decode_batch(self, fused: FusedTransform, indices: Sequence[int], pixels: np.ndarray) -> None:
        """Items ``indices`` through the fused steps into ``pixels[i]``: reads, then decodes, the JPEGs in one
        call of the extension (``FusedTransform.decode_batch``); errors name the item's key. The encoded
        bytes held at once are bounded (``_BATCH_BYTES``: a batch of large images goes in several calls)."""
        source, start = self.source, 0
        while start < len(indices):
            blobs: list[bytes] = []
            held = 0
            with timed("read"):
                while start + len(blobs) < len(indices) and held < _BATCH_BYTES:
                    blobs.append(source.read(indices[start + len(blobs)]))
                    held += len(blobs[-1])
            end = start + len(blobs)
            keys = [source.key(index) for index in indices[start:end]]  # for errors; a fraction of a µs each
            with timed("decode"):
                fused.decode_batch(blobs, pixels[start:end], keys.__getitem__, decode_threads(self._decode_threads))
            start = end

    def _decode_slot(self, fused: FusedTransform, index: int, out: np.ndarray) -> tuple[Any] | None:
        """Decode item ``index`` into a batch slot under the error policy: ``(label,)``, or None when skipped."""

        if self._errors is None:  # the hot path: no closure per sample
            self._decoded(fused, index, out)
            return (self._label(index),)

        def produce(i: int) -> tuple[Any]:
            self._decoded(fused, i, out)
            return (self._label(i),)

        return self._errors.fetch(index, self.source.key, produce)

    def set_decode_threads(self, threads: int | None) -> None:
        """Threads a batch's JPEGs are decoded on, in each process that decodes (a worker, or the training
        process with ``num_workers=0``). None, the default: in a worker, the cores the process may run on less
        one, shared among the loader's workers, at most 4 (1 where there are no spare cores); 1 in the training
        process. The pixels are the same whatever the threads."""
        valid = isinstance(threads, int) and not isinstance(threads, bool) and 1 <= threads <= MAX_THREADS
        if threads is not None and not valid:
            raise ValueError(f"threads must be None or 1 to {MAX_THREADS}, got {threads!r}")
        self._decode_threads = threads

    def set_error_policy(
        self,
        on_error: str = "raise",
        *,
        max_errors: float | None = None,
        quarantine: str | os.PathLike[str] | None = None,
        exclude: str | os.PathLike[str] | Iterable[int] | None = None,
    ) -> None:
        """What a bad sample (unreadable, undecodable) does: ``"raise"``, ``"skip"`` or ``"replace"``;
        see ``fastloader.datasets.error_policy``. ``exclude``: a ``fastloader scan`` report, or
        positions, of samples never to read (replaced or skipped)."""
        if isinstance(exclude, (str, os.PathLike)):
            exclude = read_exclusions(exclude)
        self._errors = ErrorPolicy(on_error, len(self.source), max_errors, quarantine, exclude or ())

    @property
    def error_policy(self) -> ErrorPolicy | None:
        """The policy ``set_error_policy`` installed (None: errors raise); GPU decode applies it too."""
        return self._errors

    def error_stats(self) -> dict[str, Any]:
        """Bad samples found so far by every process using this dataset (see ``set_error_policy``)."""
        if self._errors is None:
            return {"on_error": "raise", "bad_samples": 0, "by_reason": {}, "excluded": 0, "quarantine": None}
        return self._errors.stats()

    @property
    def decode_device(self) -> str:
        """Where images are decoded: ``"cpu"``, or ``"cuda"`` (items are then encoded images)."""
        return self._decode_device

    def set_decode_device(self, device: str) -> None:
        """Decode on ``"cpu"`` (default) or leave it to the GPU (``"cuda"``): items are then
        ``(EncodedImage(bytes, crop plan, key), label)`` for ``fastloader.image.gpu_decode``."""
        kind = device.split(":")[0] if isinstance(device, str) else None
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        if kind == "cuda":
            fused = self._fused()
            if fused is None or fused.tail:
                raise ValueError(
                    f"device={device!r} needs a transform made only of fastloader.transforms (which plan the"
                    f" crop that the GPU applies), with the default decode; got transform={self.transform!r}"
                )
            if self._cache is not None:
                raise ValueError(f"device={device!r}: a dataset with a decoded cache decodes on the CPU")
            check_filters(fused.steps, device)
        self._decode_device = kind

    def set_cache(self, path: str | os.PathLike[str] | None) -> None:
        """Keep the decoded images of this fixed transform in the file ``path`` (None: no cache);
        see ``fastloader.image.decoded_cache``. Call it again after changing the transform."""
        if path is None:
            self._cache, self._cached_transform = None, None
            return
        fused = self._fused()
        if fused is None:
            raise ValueError(f"cache needs a fastloader transform with the default decode; got {self.transform!r}")
        if self._layout is not None and self._layout.annotations:
            raise ValueError("cache: a dataset whose masks or boxes follow the crop reads its images, not a cache")
        if fused.is_random:
            raise ValueError(
                f"cache needs a fixed transform, but {fused.describe()} draws random crops or flips:"
                " cache evaluation transforms such as Compose([Resize(256), CenterCrop(224)])"
            )
        size = fused.decoded_size
        if size is None:
            raise ValueError(f"cache needs a fixed output size (end with CenterCrop or Resize((h, w))); got {fused!r}")
        if self._decode_device != "cpu":
            raise ValueError("cache: a dataset that decodes on the GPU cannot cache decoded images")
        meta = CacheMeta(len(self.source), size[0], size[1], fused.describe(), source_fingerprint(self.source))
        self._cache = DecodedCache.open(path, meta)
        self._cached_transform = fused

    def _image(self, index: int) -> Any:
        """The image of item ``index`` for a transform that does not decode by itself."""
        with timed("read"):
            data = self.source.read(index)
        with timed("decode"):
            return self.decode(data, self.source.key(index))

    def _decodes_bytes(self) -> bool:
        """True when images come from the source's bytes through the default decode: a fastloader
        transform may then decode them itself (and a subclass with its own ``_image`` says False)."""
        return self.decode is decode_pil

    def _fused(self) -> FusedTransform | None:
        """The transform, when it decodes encoded bytes itself (a fastloader transform, default decode)."""
        transform = self.transform
        if isinstance(transform, FusedTransform) and transform.steps and self._decodes_bytes():
            return transform
        return None

    def _label(self, index: int) -> Any:
        label = self._target(index)
        return label if self.target_transform is None else self.target_transform(label)

    def _decoded(
        self, fused: FusedTransform, index: int, out: np.ndarray | None = None, pixels: bool = True
    ) -> tuple[Any, CropPlan | None]:
        """Item ``index`` through the fused steps: the one route from bytes to pixels, and its one timing.

        The dataset's configuration (transform, cache, decode device) chose the route; each item runs
        it: the cache when it holds the item, else read -> header -> crop plan -> decode
        (:meth:`~fastloader.transforms.FusedTransform.decode_planned`), into ``out`` when given. Decoding
        on the GPU, the image stays encoded, with its plan; ``pixels=False``: the plan only. Returns
        (H×W×3 uint8 pixels, an ``EncodedImage`` or None; the crop plan, None for pixels from the cache).
        """
        cache = None if self._cache is None else self._checked_cache(fused)
        identity = UNTRUSTED
        if cache is not None:
            size = cast(tuple[int, int], fused.decoded_size)  # fixed: set_cache checked it
            out = np.empty((*size, 3), dtype=np.uint8) if out is None else out
            with timed("read"):  # decoded pixels from the cache, if the item is still the one cached
                identity = int(item_identities(self.source, [index])[0])  # before the read below
                if cache.read_into(index, out, identity):
                    return out, None
        gpu = self._decode_device != "cpu"
        with timed("read"):
            data = self.source.read(index)
        with timed("decode"):  # fused with the crop and resize; for the GPU, only the header and the plan
            key = self.source.key(index)
            header, plan, decoded = fused.decode_planned(data, key, out, pixels=pixels and not gpu)
        if gpu:
            return EncodedImage(data, plan, key, header, index), plan
        if cache is not None and decoded is not None:
            cache.write(index, decoded, identity)
        return decoded, plan

    def _finish(self, fused: FusedTransform, image: Any) -> Any:
        """Decoded pixels as a C×H×W tensor, through the transform's tail; an encoded image as it is."""
        image = _tensor(image)
        if not fused.tail or not isinstance(image, torch.Tensor):
            return image
        with timed("transform"):
            return fused.finish(image)

    # -- samples with fields (fastloader.fields) ---------------------------------------------------

    def _sample_batch(self, indices: Sequence[int]) -> FieldBatch:
        """Items ``indices`` as a :class:`FieldBatch`; fixed-size images decoded into one batch buffer."""
        layout, size, policy = self._layout, self.batch_buffer_size(), self._errors
        assert layout is not None
        buffer = allocate_batch(len(indices), *size) if size is not None else None
        pixels = None if buffer is None else buffer.numpy()
        samples, kept = [], []
        for slot, index in enumerate(indices):
            index = check_index(index, len(self.source))
            out = None if pixels is None else pixels[slot]
            if policy is None:
                sample = self._sample(index, out)
            else:
                sample = policy.fetch(index, self.source.key, functools.partial(self._sample, out=out))
            if sample is not None:
                samples.append(sample)
                kept.append(slot)
        if buffer is not None and len(kept) < len(indices):
            buffer = buffer[kept]  # skipped samples: a shorter batch
        return FieldBatch.collate(layout, samples, buffer)

    def _sample(self, index: int, out: np.ndarray | None = None) -> Any:
        """Item ``index`` as its layout asks; with ``out``, the image is decoded into it (and left out)."""
        layout, reader, fused = self._layout, self._fields, self._fused()
        assert layout is not None and reader is not None
        image: Any = None
        plan: CropPlan | None = None
        source_size: tuple[int, int] | None = None
        transforms: Sequence[Callable[[Any], Any]] = ()
        if fused is not None and (layout.wants_image or layout.annotations):
            pixels, plan = self._decoded(fused, index, out, pixels=layout.wants_image)
            if layout.annotations:  # the plan gives their geometry; the tail moves them with the image (below)
                image = None if out is not None else _tensor(pixels)
                source_size, transforms = cast(CropPlan, plan).source_size, fused.tail
            elif out is None:
                image = self._finish(fused, pixels)
        elif layout.wants_image or layout.annotations:
            image = self._image(index)
            source_size = image_size(image)
            transforms = () if self.transform is None else (self.transform,)
            if not layout.annotations and self.transform is not None:
                with timed("transform"):  # with annotations, the transform moves them too (below)
                    image = self.transform(image)
        with timed("read"):
            values = reader.read(index, source_size)
        if layout.annotations:
            with timed("transform"):
                image = reader.move(values, image, plan, transforms)
        for output in layout.outputs:
            if output.role == "image":
                values[output.name] = image
            elif output.role == "label":
                values[output.name] = self._label(index)
        return layout.assemble(values)


def _tensor(image: Any) -> Any:
    """H×W×3 pixels as a C×H×W tensor (a view); anything else (an encoded image, None) as it is."""
    return torch.from_numpy(image).permute(2, 0, 1) if isinstance(image, np.ndarray) else image
