"""TFRecordDataset: ``tf.train.Example`` records of encoded images in TFRecord shards, read without
TensorFlow.

Each record is an Example with the encoded image in a bytes feature (``image/encoded``) and the
class in an int64 feature (``image/class/label``), as TensorFlow's ImageNet conversion scripts
write them; both names are configurable. The label is returned as stored (those scripts store
1..1000, keeping 0 for "background"). ``label_key=None`` reads Examples without a label (image and
text pairs, say): every label is -1.

Every other feature is a *field* (``fastloader.fields``), by its name. Unless ``field_kinds`` names
them and their kinds, the fields are the features of the first record (item 0), each of the kind
its list decides: a bytes list is ``bytes`` (its one value), an int64 list an int64 ``array``, a
float list a float32 ``array`` (its values, of any length, zero included); a feature with no list
set is left out. ``field_kinds={"image/object/class/text": "json", "image/height": "int", ...}`` reads
exactly those features as those kinds instead: ``bytes``/``image`` (the one value of a bytes list),
``text`` (that value as UTF-8), ``int``/``float`` (the one value of a numeric list), ``array``
(a numeric list) or ``json`` (any list as a JSON list; a bytes list's values as UTF-8 strings).

A record whose feature lacks a value (an empty list where one value is wanted, or no list set)
lacks the field (:class:`~fastloader.errors.MissingField`). A list of several values where
one is wanted is a FormatError naming the record and feature: a list of bytes is no field kind,
so a multi-valued bytes feature (``image/object/class/text`` of a detection dataset) is read as
``json`` (``field_kinds=...``) or not at all.

Items are numbered through the shards in pattern order (braces, then sorted globs): item ``i`` is
record ``i - starts[f]`` of shard ``f``, found with ``np.searchsorted`` over the cumulative record
counts. Each shard gets a memory-mapped sidecar index (offsets, lengths), built once when missing.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, cast

import numpy as np

from fastloader.datasets.base import ImageDataset, check_index
from fastloader.datasets.handles import OpenHandles, ProcessLocal
from fastloader.errors import FormatError, MissingField
from fastloader.fields.specs import Spec
from fastloader.formats.field_values import check_kind
from fastloader.formats.index_file import read_index
from fastloader.formats.patterns import expand_pattern
from fastloader.formats.protobuf import Feature, parse_example
from fastloader.formats.tfrecord import INDEX_KIND, INDEX_VERSION, default_index_path, load_index, read_record
from fastloader.image.pil import decode_pil
from fastloader.storage import open_regular

# Each open shard costs a data descriptor and two index mmaps (each holds a descriptor): bound them,
# so that thousands of shards do not exhaust a worker's descriptor limit (often 1024).
_MAX_OPEN_SHARDS = 64


class _OpenShard:
    def __init__(self, path: str, index_path: str) -> None:
        self.fd = open_regular(path)
        self.close = weakref.finalize(self, os.close, self.fd)  # called when evicted, or when collected
        self.size = os.fstat(self.fd).st_size
        arrays = read_index(index_path, INDEX_KIND, INDEX_VERSION).arrays
        self.offsets, self.lengths = arrays["offsets"], arrays["lengths"]


class _OpenShards:
    """Per process: the most recently used shards, open; the label and bytes of the last record
    read (so that ``label(i)`` and ``read_field(i, ...)`` right after ``read(i)`` read nothing) and
    the features of the last record whose fields were read (parsed once for all its fields)."""

    def __init__(self, paths: Sequence[str], index_paths: Sequence[str]) -> None:
        self._paths, self._index_paths = paths, index_paths
        self.open = OpenHandles(self._open, _close, _MAX_OPEN_SHARDS)
        self.last: tuple[int, int, memoryview] | None = None
        self.parsed: tuple[int, dict[str, Feature]] | None = None

    def get(self, shard: int) -> _OpenShard:
        return self.open.get(shard)

    def _open(self, shard: int) -> _OpenShard:
        return _OpenShard(self._paths[shard], self._index_paths[shard])


def _close(shard: _OpenShard) -> None:
    shard.close()


class TFRecordSource:
    """A :class:`~fastloader.datasets.base.Source` over TFRecord shards, and a
    :class:`~fastloader.fields.source.FieldSource` of their other features (see the module docstring).

    ``pattern``: a path, ``train-{00000..01023}.tfrecord``, ``train-*.tfrecord`` or a list.
    ``index_paths``: where each shard's index lives (default: beside it, or in the cache directory).
    ``label_key=None``: Examples without a label (every label is -1). ``field_kinds``: the features
    to read as fields and their kinds (default: those of the first record).
    A record without the image or label feature raises FormatError naming the file and record.
    """

    def __init__(
        self,
        pattern: str | os.PathLike[str] | list[str],
        *,
        image_key: str = "image/encoded",
        label_key: str | None = "image/class/label",
        index_paths: Sequence[str | os.PathLike[str]] | None = None,
        field_kinds: Mapping[str, str] | None = None,
    ) -> None:
        self.paths = expand_pattern(pattern)
        if index_paths is None:
            self.index_paths = [default_index_path(path) for path in self.paths]
        elif len(index_paths) != len(self.paths):
            raise ValueError(f"index_paths: {len(index_paths)} paths given for {len(self.paths)} TFRecord files")
        else:
            self.index_paths = [os.fspath(path) for path in index_paths]
        self.image_key, self.label_key = image_key, label_key
        self._wanted = (image_key,) if label_key is None else (image_key, label_key)
        self._fields: dict[str, str] | None = None
        if field_kinds is not None:
            self._fields = {name: check_kind(kind, name) for name, kind in field_kinds.items()}
            taken = set(self._fields) & set(self._wanted)
            if taken:
                raise ValueError(f"field_kinds: {sorted(taken)} are the image or label, not fields")
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

    def _record(self, index: int, shards: _OpenShards) -> tuple[str, memoryview]:
        """Where item ``index`` is (for errors) and its serialized Example: one read, both CRCs checked."""
        shard, record = self.locate(index)
        opened = shards.get(shard)
        path, offset = self.paths[shard], int(opened.offsets[record])
        data = read_record(opened.fd, offset, int(opened.lengths[record]), opened.size, path)
        return f"{path}: record {record} (offset {offset})", data

    def example(self, index: int) -> tuple[bytes, int]:
        """The encoded image and label of item ``index``: one read, both CRCs checked."""
        index = check_index(index, len(self))
        shards = self._local.get()
        where, data = self._record(index, shards)
        try:
            features = parse_example(data, self._wanted)
        except FormatError as error:
            raise FormatError(f"{where}: not a tf.train.Example ({error})") from error
        image = cast(bytes, _feature(features, self.image_key, "bytes", where, data).values[0])
        label = -1
        if self.label_key is not None:
            label = cast(int, _feature(features, self.label_key, "int64", where, data).values[0])
        shards.last = (index, label, data)
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

    def field_kinds(self) -> dict[str, str]:
        """The features read as fields, and their kinds (see the module docstring)."""
        if self._fields is None:
            self._fields = self._kinds_of_first_record()
        return dict(self._fields)

    def _kinds_of_first_record(self) -> dict[str, str]:
        if not len(self):
            return {}
        where, data = self._record(0, self._local.get())
        try:
            features = parse_example(data)
        except FormatError as error:
            raise FormatError(f"{where}: not a tf.train.Example ({error})") from error
        kinds = {name: _DEFAULT_KINDS.get(feature.kind) for name, feature in features.items()}
        return {name: kind for name, kind in sorted(kinds.items()) if kind is not None and name not in self._wanted}

    def field_aliases(self) -> dict[str, str]:
        """The features holding the image and the label."""
        aliases = {self.image_key: "image"}
        if self.label_key is not None:
            aliases[self.label_key] = "label"
        return aliases

    def read_field(self, index: int, name: str) -> Any:
        """Item ``index``'s feature ``name`` as the kind :meth:`field_kinds` gives it; MissingField
        when the record has no value for it."""
        index = check_index(index, len(self))
        kind = self.field_kinds().get(name)
        if kind is None:
            raise MissingField(f"{self.key(index)}: no field {name!r} (the fields: {', '.join(self.field_kinds())})")
        feature = self._features(index).get(name)
        where = f"{self.key(index)}: field {name!r}"
        if feature is None or feature.kind == "empty":
            raise MissingField(f"{where}: the record has no such feature")
        return _field_value(feature, kind, where)

    def _features(self, index: int) -> dict[str, Feature]:
        """Every feature of item ``index``, parsed once while its fields are read."""
        shards = self._local.get()
        parsed = shards.parsed
        if parsed is not None and parsed[0] == index:
            return parsed[1]
        last = shards.last
        if last is not None and last[0] == index:
            where, data = self.key(index), last[2]
        else:
            where, data = self._record(index, shards)
        try:
            features = parse_example(data)
        except FormatError as error:
            raise FormatError(f"{where}: not a tf.train.Example ({error})") from error
        shards.parsed = (index, features)
        return features


# The kind of a field by the list its feature holds in the first record, unless ``field_kinds`` says.
_DEFAULT_KINDS = {"bytes": "bytes", "int64": "array", "float": "array"}
_NUMERIC_DTYPES: dict[str, np.dtype[Any]] = {"int64": np.dtype(np.int64), "float": np.dtype(np.float32)}


def _field_value(feature: Feature, kind: str, where: str) -> Any:
    """The value of ``feature`` as a field of ``kind`` (see the module docstring)."""
    values = feature.values
    if kind == "json":
        if feature.kind == "bytes":
            try:
                return [cast(bytes, value).decode("utf-8") for value in values]
            except UnicodeDecodeError as error:
                raise FormatError(f"{where}: a bytes value is not UTF-8 text ({error})") from None
        return list(values)
    if kind == "array":
        if feature.kind not in _NUMERIC_DTYPES:
            raise FormatError(f"{where}: holds a {feature.kind} list, not numbers")
        return np.array(values, dtype=_NUMERIC_DTYPES[feature.kind])
    wanted = "bytes" if kind in ("bytes", "image", "text") else "int64" if kind == "int" else "float"
    if feature.kind != wanted and not (kind == "float" and feature.kind == "int64"):
        raise FormatError(f"{where}: holds a {feature.kind} list, a {kind} field is read from a {wanted} list")
    if not values:
        raise MissingField(f"{where}: the {feature.kind} list is empty")
    if len(values) > 1:
        raise FormatError(
            f"{where}: holds {len(values)} {feature.kind} values, a {kind} field is one "
            "(a list of several is read as json or array: see TFRecordSource's field_kinds)"
        )
    value = values[0]
    if kind == "text":
        try:
            return cast(bytes, value).decode("utf-8")
        except UnicodeDecodeError as error:
            raise FormatError(f"{where}: not UTF-8 text ({error})") from None
    if kind == "float":
        return float(value)
    return value


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

    Keyword arguments ``image_key``, ``label_key``, ``index_paths`` and ``field_kinds`` are those of
    :class:`TFRecordSource`; ``decode`` turns encoded bytes into an image (default: RGB
    ``PIL.Image``), so torchvision transforms work unchanged. ``fields``: samples with more than a
    label, by feature name (``fields=("image", "image/class/text", "label")``: tuple items; a
    mapping: dict items; see ``fastloader.fields``).
    """

    def __init__(
        self,
        pattern: str | os.PathLike[str] | list[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        *,
        image_key: str = "image/encoded",
        label_key: str | None = "image/class/label",
        index_paths: Sequence[str | os.PathLike[str]] | None = None,
        decode: Callable[[bytes, str], Any] = decode_pil,
        field_kinds: Mapping[str, str] | None = None,
        fields: Sequence[Spec] | Mapping[str, Spec] | None = None,
    ) -> None:
        source = TFRecordSource(
            pattern, image_key=image_key, label_key=label_key, index_paths=index_paths, field_kinds=field_kinds
        )
        super().__init__(source, transform, target_transform, decode, fields=fields)
