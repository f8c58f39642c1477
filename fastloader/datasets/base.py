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

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from torch.utils.data import Dataset

from fastloader import read_digests, sample_seeds
from fastloader.datasets.batch_route import whole_batch
from fastloader.datasets.cache_route import cached_batch, open_cache
from fastloader.datasets.error_policy import ErrorPolicy, read_exclusions
from fastloader.datasets.fields_route import sample, sample_batch
from fastloader.datasets.item import check_index
from fastloader.datasets.pipeline import Pipeline
from fastloader.datasets.policy_route import image_by_image, policed_items
from fastloader.fields.reader import FieldReader
from fastloader.fields.source import aliases, field_kinds
from fastloader.fields.specs import Layout, Spec, resolve
from fastloader.image.batching import PrecollatedBatch, allocate_batch
from fastloader.image.decoded_cache import DecodedCache
from fastloader.image.gpu_decode import check_filters
from fastloader.image.jpeg_ext import MAX_THREADS
from fastloader.image.pil import decode_pil
from fastloader.timing import timed
from fastloader.transforms.fused import FusedTransform

T = TypeVar("T")


@runtime_checkable
class Source(Protocol):
    """Random access to encoded images and their labels (see the module docstring)."""

    def __len__(self) -> int: ...

    def read(self, index: int) -> bytes: ...

    def label(self, index: int) -> int: ...

    def key(self, index: int) -> str: ...


class ImageDataset(Dataset[tuple[Any, Any]], Generic[T]):
    """A map-style dataset over a :class:`Source`: item i is ``(transform(image), target_transform(label))``.

    ``decode(bytes, key)`` turns encoded bytes into an image (default: RGB ``PIL.Image``, as
    torchvision's ``ImageFolder``), so torchvision transforms work unchanged. A fastloader transform
    instead gets the encoded bytes and decodes them itself (see the module docstring); ``cache``, a
    path, is :meth:`set_cache`.

    ``fields``: what an item holds besides ``(image, label)`` (see the module docstring and
    ``fastloader.fields.specs``): a sequence gives tuple items, a mapping dict items.

    What decides a sample's route is one small object built from this configuration, a
    ``fastloader.datasets.pipeline.Pipeline`` (``_pipeline()``), and the routes are given it, never the
    dataset. One route from bytes to pixels: with a fastloader transform, ``ds[i]``, the batch buffer of
    ``__getitems__``, samples with fields and GPU decode all get their image from ``Pipeline.decoded`` (the
    cache, else read -> header -> crop plan -> decode, timed there once); a batch buffer with no cache takes
    the same steps for the whole batch at once (``fastloader.datasets.batch_route``: the reads, then the
    headers and plans, then the decodes in one call of the JPEG extension), one with a cache copies what it
    holds and decodes the rest so (``fastloader.datasets.cache_route``), and under an error policy a batch
    goes image by image when a sample of it fails or is excluded (``fastloader.datasets.policy_route``);
    samples with fields take ``fastloader.datasets.fields_route``. Without one, the image comes
    from ``_image()`` (the one override point: ImageFolder's ``loader(path)`` is one) and the transform.

    Under a DataLoaderX with ``seed=`` each sample draws from its own key (``fastloader.sample_seeds``): the
    fused steps' crops from a generator seeded by it, and a transform of the user's (or the fused transform's
    tail) from the global generators, seeded for the sample right before it runs (``seeds_each_sample``).
    """

    # The loader's fetch leaves the per-sample seeding of a batch to this dataset (fastloader.sample_seeds).
    seeds_each_sample = True

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
        self._built: Pipeline | None = None  # _pipeline() builds it; a setter that changes what it holds drops it
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
        pipeline = self._pipeline()
        if pipeline.layout is not None:
            return sample(pipeline, self._image, index)
        fused = pipeline.fused
        if fused is None or fused.tail:  # a transform of the user's draws from the global generators
            sample_seeds.seed_for(index)
        if fused is not None:
            return pipeline.finish(pipeline.decoded(index)[0]), pipeline.label(index)
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
        pipeline = self._pipeline()
        if pipeline.layout is not None:
            return sample_batch(pipeline, self._image, indices)
        size, policy = pipeline.buffer_size, pipeline.errors
        if size is None:  # no fused transform of fixed size, or GPU decode
            if policy is None:
                return [self[index] for index in indices]
            return policed_items(pipeline, policy, indices, self._item)
        buffer = allocate_batch(len(indices), *size)
        pixels = buffer.numpy()
        positions = [check_index(index, len(pipeline.source)) for index in indices]
        if policy is not None and policy.excludes_any(positions, pipeline.source.key):
            labels = None  # image by image from the start: an excluded or found-bad sample is never read again
        elif pipeline.cache is None:
            labels = whole_batch(pipeline, positions, pixels)
        else:
            labels = cached_batch(pipeline, positions, pixels)
        if labels is not None:  # the hot path: the whole batch at once
            return PrecollatedBatch(buffer, labels)
        return image_by_image(pipeline, buffer, positions)

    def batch_buffer_size(self) -> tuple[int, int] | None:
        """``(height, width)`` of the uint8 batch buffer ``__getitems__`` decodes a batch into, or None when it
        makes none (no fused transform of fixed size, GPU decode, fields without an image). A DataLoaderX sizes
        its batch ring by it (``fastloader.image.batch_ring``)."""
        return self._pipeline().buffer_size

    def set_decode_threads(self, threads: int | None) -> None:
        """Threads a batch's JPEGs are decoded on, in each process that decodes (a worker, or the training
        process with ``num_workers=0``). None, the default: in a worker, the cores the process may run on less
        one, shared among the loader's workers, at most 4 (1 where there are no spare cores); 1 in the training
        process. The pixels are the same whatever the threads."""
        valid = isinstance(threads, int) and not isinstance(threads, bool) and 1 <= threads <= MAX_THREADS
        if threads is not None and not valid:
            raise ValueError(f"threads must be None or 1 to {MAX_THREADS}, got {threads!r}")
        self._decode_threads = threads
        self._built = None

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
        self._built = None

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
        self._built = None

    def set_cache(self, path: str | os.PathLike[str] | None) -> None:
        """Keep the decoded images of this fixed transform in the file ``path`` (None: no cache);
        see ``fastloader.image.decoded_cache``. Call it again after changing the transform."""
        if path is None:
            self._cache, self._cached_transform = None, None
        else:
            self._cache, self._cached_transform = open_cache(self._pipeline(), path)
        self._built = None

    def _image(self, index: int) -> Any:
        """The image of item ``index`` for a transform that does not decode by itself."""
        with timed("read"):
            data = self.source.read(index)
        read_digests.record(index, data)  # the ledger's digest of the bytes as read (off unless ledger=)
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

    def _pipeline(self) -> Pipeline:
        """What decides a sample's route now: the pipeline built from this configuration, built again when a
        setter dropped it or a public attribute it was built from (the transform, the target transform, the
        source, the decode) was reassigned."""
        built = self._built
        decodes_bytes = self._decodes_bytes()
        if built is None or not built.made_for(self.source, self.transform, self.target_transform, decodes_bytes):
            built = self._built = Pipeline(
                source=self.source,
                transform=self.transform,
                target=self._target,
                target_transform=self.target_transform,
                decodes_bytes=decodes_bytes,
                fused=self._fused(),
                errors=self._errors,
                cache=self._cache,
                cached_transform=self._cached_transform,
                decode_device=self._decode_device,
                decode_threads=self._decode_threads,
                layout=self._layout,
                fields=self._fields,
            )
        return built
