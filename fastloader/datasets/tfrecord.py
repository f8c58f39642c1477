"""TFRecordDataset: ``tf.train.Example`` records of encoded images in TFRecord shards, read without
TensorFlow.

Each record is an Example with the encoded image in a bytes feature (``image/encoded``) and the
class in an int64 feature (``image/class/label``), as TensorFlow's ImageNet conversion scripts
write them; both names are configurable. The label is returned as stored (those scripts store
1..1000, keeping 0 for "background").

Items are numbered through the shards in pattern order (braces, then sorted globs): item ``i`` is
record ``i - starts[f]`` of shard ``f``, found with ``np.searchsorted`` over the cumulative record
counts. Each shard gets a memory-mapped sidecar index (offsets, lengths), built once when missing.
"""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, cast

import numpy as np

from fastloader.datasets.base import ImageDataset, ProcessLocal, check_index, decode_pil
from fastloader.errors import FormatError
from fastloader.formats.index_file import read_index
from fastloader.formats.patterns import expand_pattern
from fastloader.formats.protobuf import Feature, parse_example
from fastloader.formats.tfrecord import INDEX_KIND, INDEX_VERSION, default_index_path, load_index, read_record

# Each open shard costs a data descriptor and two index mmaps (each holds a descriptor): bound them,
# so that thousands of shards do not exhaust a worker's descriptor limit (often 1024).
_MAX_OPEN_SHARDS = 64


class _OpenShard:
    def __init__(self, path: str, index_path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        weakref.finalize(self, os.close, self.fd)
        self.size = os.fstat(self.fd).st_size
        arrays = read_index(index_path, INDEX_KIND, INDEX_VERSION).arrays
        self.offsets, self.lengths = arrays["offsets"], arrays["lengths"]


class _OpenShards:
    """Per process: the most recently used shards, open, and the label of the last record read
    (so that ``label(i)`` right after ``read(i)`` reads nothing)."""

    def __init__(self, paths: Sequence[str], index_paths: Sequence[str]) -> None:
        self._paths, self._index_paths = paths, index_paths
        self._open: OrderedDict[int, _OpenShard] = OrderedDict()
        self.last: tuple[int, int] | None = None

    def get(self, shard: int) -> _OpenShard:
        opened = self._open.get(shard)
        if opened is None:
            if len(self._open) >= _MAX_OPEN_SHARDS:
                self._open.popitem(last=False)  # its finalizer closes the descriptor
            opened = self._open[shard] = _OpenShard(self._paths[shard], self._index_paths[shard])
        else:
            self._open.move_to_end(shard)
        return opened


class TFRecordSource:
    """A :class:`~fastloader.datasets.base.Source` over TFRecord shards (see the module docstring).

    ``pattern``: a path, ``train-{00000..01023}.tfrecord``, ``train-*.tfrecord`` or a list.
    ``index_paths``: where each shard's index lives (default: beside it, or in the cache directory).
    A record without the image or label feature raises FormatError naming the file and record.
    """

    def __init__(
        self,
        pattern: str | os.PathLike[str] | list[str],
        *,
        image_key: str = "image/encoded",
        label_key: str = "image/class/label",
        index_paths: Sequence[str | os.PathLike[str]] | None = None,
    ) -> None:
        self.paths = expand_pattern(pattern)
        if index_paths is None:
            self.index_paths = [default_index_path(path) for path in self.paths]
        elif len(index_paths) != len(self.paths):
            raise ValueError(f"index_paths: {len(index_paths)} paths given for {len(self.paths)} TFRecord files")
        else:
            self.index_paths = [os.fspath(path) for path in index_paths]
        self.image_key, self.label_key = image_key, label_key
        counts = [len(load_index(p, ip).arrays["offsets"]) for p, ip in zip(self.paths, self.index_paths)]
        self.starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self._local = ProcessLocal(partial(_OpenShards, self.paths, self.index_paths))

    def __len__(self) -> int:
        return int(self.starts[-1])

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard, record within the shard)`` of item ``index``."""
        index = check_index(index, len(self))
        shard = int(np.searchsorted(self.starts, index, side="right")) - 1
        return shard, index - int(self.starts[shard])

    def example(self, index: int) -> tuple[bytes, int]:
        """The encoded image and label of item ``index``: one read, both CRCs checked."""
        index = check_index(index, len(self))
        shard, record = self.locate(index)
        shards = self._local.get()
        opened = shards.get(shard)
        path, offset = self.paths[shard], int(opened.offsets[record])
        where = f"{path}: record {record} (offset {offset})"
        data = read_record(opened.fd, offset, int(opened.lengths[record]), opened.size, path)
        try:
            features = parse_example(data, (self.image_key, self.label_key))
        except FormatError as error:
            raise FormatError(f"{where}: not a tf.train.Example ({error})") from error
        image = cast(bytes, _feature(features, self.image_key, "bytes", where, data).values[0])
        label = cast(int, _feature(features, self.label_key, "int64", where, data).values[0])
        shards.last = (index, label)
        return image, label

    def read(self, index: int) -> bytes:
        return self.example(index)[0]

    def label(self, index: int) -> int:
        last = self._local.get().last
        if last is not None and last[0] == check_index(index, len(self)):
            return last[1]
        return self.example(index)[1]

    def key(self, index: int) -> str:
        shard, record = self.locate(index)
        return f"{self.paths[shard]}#{record}"


def _feature(features: dict[str, Feature], name: str, kind: str, where: str, data: memoryview) -> Feature:
    """The feature ``name``, checked to hold at least one ``kind`` value."""
    feature = features.get(name)
    if feature is None:
        present = sorted(parse_example(data))  # only on this error path: list what the record has
        raise FormatError(f"{where}: no feature {name!r} (the record has {present})")
    if feature.kind != kind or not feature.values:
        raise FormatError(
            f"{where}: feature {name!r} holds {len(feature.values)} {feature.kind} values, expected a {kind} value"
        )
    return feature


class TFRecordDataset(ImageDataset[Any]):
    """``(transform(image), target_transform(label))`` for each Example in TFRecord shards.

    Keyword arguments ``image_key``, ``label_key`` and ``index_paths`` are those of
    :class:`TFRecordSource`; ``decode`` turns encoded bytes into an image (default: RGB
    ``PIL.Image``), so torchvision transforms work unchanged.
    """

    def __init__(
        self,
        pattern: str | os.PathLike[str] | list[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        *,
        image_key: str = "image/encoded",
        label_key: str = "image/class/label",
        index_paths: Sequence[str | os.PathLike[str]] | None = None,
        decode: Callable[[bytes, str], Any] = decode_pil,
    ) -> None:
        source = TFRecordSource(pattern, image_key=image_key, label_key=label_key, index_paths=index_paths)
        super().__init__(source, transform, target_transform, decode)
