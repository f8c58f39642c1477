"""Map-style access to images in Parquet files: ``ParquetDataset("data/train-*.parquet")``.

The layout most large image sets are published in (Hugging Face Hub image datasets, LAION-style
metadata): one row per sample, an image-bytes column, and caption / label / metadata columns.
Files are read with pyarrow (``pip install fastloader[parquet]``), memory-mapped.

Items are numbered through the files in pattern order (braces, then sorted globs; the sorted
``*.parquet`` of a directory; the files of a ``fastloader pack --format parquet`` directory, from
its manifest), and through each file's row groups. Only the footers are read to build the index: a
numpy array of where each row group starts, so item ``i`` is found with ``np.searchsorted`` and no
per-sample Python object is kept.

Costs: Parquet decodes a column a row group at a time, so reading one row reads its row group's
column chunk. Each process keeps the last ``cache_row_groups`` row groups it read (the columns asked
for: image, label, a field), so sequential and shard-aware access read each row group once, while
uniformly random access over a large dataset reads a whole row group per item. Shuffle with
``fastloader.samplers.ShardWindowSampler(dataset, window=cache_row_groups)``: ``shard_starts()``
gives it the row groups, which it then reads in windows. At most ``_MAX_OPEN_FILES`` files are open
per process.

Columns:

* the image: ``image_column``, else the one our own packs name, else a Hugging Face ``Image``
  feature (``struct<bytes: binary, path: string>``: its ``bytes``), else a binary column named
  ``image``, ``jpg``, ``jpeg``, ``png``, ``webp`` or ``img``.
* the label: ``label_column``, else an integer column named ``label``, ``labels``, ``cls`` or
  ``class``; without one (or for a null) ``label(i)`` is -1. Class names come from a Hugging Face
  ``ClassLabel`` or a pack's manifest.
* the key: ``key_column``, else a string column named ``key``, ``__key__`` or ``id``; without one
  ``key(i)`` is ``"<file>#<row in file>"`` (``location(i)`` always is).
* every other column is a field (``fastloader.fields``), of the kind its Arrow type says: binary ->
  bytes (a second Hugging Face image -> image), string -> text, integers and bool -> int, floats ->
  float, lists of numbers -> array (1-D, of the list's value type), structs, maps and other lists ->
  json, dates / times / decimals -> text (``str`` of the value). Columns of other types (null,
  union) are not fields. A null is a :class:`~fastloader.fields.values.MissingField` naming the key
  and column. Files written by ``fastloader pack --format parquet`` say in their schema metadata
  what each column holds (``fastloader.formats.parquet_pack``), which wins: names, kinds and values
  read back exactly as packed.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from fastloader.datasets.base import ImageDataset, ProcessLocal, check_index, decode_pil
from fastloader.errors import FormatError
from fastloader.fields.specs import Spec
from fastloader.fields.values import MissingField, decode_value
from fastloader.formats.parquet_pack import PACK_FORMAT, SCHEMA_META_KEY, ParquetPackState, import_pyarrow
from fastloader.formats.patterns import expand_pattern

_MAX_OPEN_FILES = 64  # memory maps (each holds a descriptor) per process; others are reopened as needed
DEFAULT_CACHE_ROW_GROUPS = 4  # ShardWindowSampler's default window
_CACHE_BYTES = 512 << 20  # decoded row groups kept per process, at most (the latest one always)
_IMAGE_NAMES = ("image", "jpg", "jpeg", "png", "webp", "img")
_LABEL_NAMES = ("label", "labels", "cls", "class")
_KEY_NAMES = ("key", "__key__", "id")
_NULL: Any = object()  # a null cell (JSON's null is a value: None)


@dataclass(frozen=True)
class _Column:
    """How one field (or the image, label or key) is read from its top-level column.

    ``how``: ``binary``, ``hf_image`` (the ``bytes`` of a struct), ``text``, ``int``, ``float``,
    ``list`` (a numpy array of ``dtype``), ``npy`` (binary ``.npy``), ``json_text`` (JSON in a
    string), ``json`` (a nested Arrow value) or ``str`` (``str`` of a scalar: dates, decimals).
    """

    name: str
    column: str
    kind: str
    how: str
    dtype: str | None = None


@dataclass(frozen=True)
class _Layout:
    """What the columns of one file hold."""

    image: _Column
    label: _Column | None
    key: _Column | None
    fields: dict[str, _Column]
    classes: list[str] | None


def _is_hf_image(pa: Any, arrow_type: Any) -> bool:
    """A Hugging Face ``Image`` feature: ``struct<bytes: binary, path: string>``."""
    if not pa.types.is_struct(arrow_type):
        return False
    names = [arrow_type.field(i).name for i in range(arrow_type.num_fields)]
    return "bytes" in names and _is_binary(pa, arrow_type.field("bytes").type) and set(names) <= {"bytes", "path"}


def _is_binary(pa: Any, arrow_type: Any) -> bool:
    types = pa.types
    return bool(
        types.is_binary(arrow_type) or types.is_large_binary(arrow_type) or types.is_fixed_size_binary(arrow_type)
    )


def _is_string(pa: Any, arrow_type: Any) -> bool:
    return bool(pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type))


def _is_number(pa: Any, arrow_type: Any) -> bool:
    types = pa.types
    return bool(types.is_integer(arrow_type) or types.is_floating(arrow_type) or types.is_boolean(arrow_type))


def _infer(pa: Any, name: str, arrow_type: Any) -> _Column | None:
    """The field a column of a foreign file is, from its Arrow type (None: not a field)."""
    types = pa.types
    if types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type  # read back decoded: the dictionary is an encoding
    if _is_hf_image(pa, arrow_type):
        return _Column(name, name, "image", "hf_image")
    if _is_binary(pa, arrow_type):
        return _Column(name, name, "bytes", "binary")
    if _is_string(pa, arrow_type):
        return _Column(name, name, "text", "text")
    if types.is_integer(arrow_type) or types.is_boolean(arrow_type):
        return _Column(name, name, "int", "int")
    if types.is_floating(arrow_type):
        return _Column(name, name, "float", "float")
    if types.is_list(arrow_type) or types.is_large_list(arrow_type) or types.is_fixed_size_list(arrow_type):
        value_type = arrow_type.value_type
        if _is_number(pa, value_type):
            return _Column(name, name, "array", "list", np.dtype(value_type.to_pandas_dtype()).str)
        return _Column(name, name, "json", "json")
    if types.is_struct(arrow_type) or types.is_map(arrow_type):
        return _Column(name, name, "json", "json")
    if types.is_temporal(arrow_type) or types.is_decimal(arrow_type):
        return _Column(name, name, "text", "str")
    return None


def _hf_features(metadata: Mapping[bytes, bytes]) -> dict[str, Any]:
    """The ``features`` of the schema metadata Hugging Face ``datasets`` writes (``{}`` without)."""
    try:
        features = json.loads(metadata[b"huggingface"])["info"]["features"]
    except (KeyError, TypeError, ValueError):
        return {}
    return features if isinstance(features, dict) else {}


def _own_meta(metadata: Mapping[bytes, bytes], path: str) -> dict[str, Any] | None:
    """The schema metadata ``fastloader pack --format parquet`` wrote, None for a foreign file."""
    raw = metadata.get(SCHEMA_META_KEY)
    if raw is None:
        return None
    try:
        meta = json.loads(raw)
        if meta.get("format") != PACK_FORMAT or not isinstance(meta.get("fields"), list):
            raise ValueError(f"format {meta.get('format')!r}")
        return dict(meta)
    except (ValueError, AttributeError) as error:
        raise FormatError(f"{path}: unreadable fastloader schema metadata ({error})") from None


def _own_column(entry: Mapping[str, Any], path: str) -> _Column:
    """A field as a pack described it (see ``fastloader.formats.parquet_pack``)."""
    kind, encoding = entry["kind"], entry.get("encoding")
    how = {"image": "binary", "bytes": "binary", "text": "text", "json": "json_text", "int": "int", "float": "float"}
    if kind == "array":
        if encoding not in ("list", "npy"):
            raise FormatError(f"{path}: field {entry['name']!r}: unknown array encoding {encoding!r}")
        return _Column(entry["name"], entry["column"], kind, encoding, entry.get("dtype"))
    if kind not in how:
        raise FormatError(f"{path}: field {entry['name']!r}: unknown kind {kind!r}")
    return _Column(entry["name"], entry["column"], kind, how[kind])


def _layout(
    path: str, schema: Any, image_column: str | None, label_column: str | None, key_column: str | None
) -> _Layout:
    """What the columns of the file at ``path`` (its Arrow ``schema``) hold: see the module docstring."""
    pa, _ = import_pyarrow()
    names = list(schema.names)
    if len(set(names)) != len(names):
        raise FormatError(f"{path}: duplicate column names ({names})")
    types = {name: schema.field(name).type for name in names}
    metadata = schema.metadata or {}
    own, hf = _own_meta(metadata, path), _hf_features(metadata)

    def given(column: str | None, what: str) -> str | None:
        if column is not None and column not in types:
            raise FormatError(f"{path}: no column {column!r} for the {what} (columns: {names})")
        return column

    image = given(image_column, "image") or (own or {}).get("image")
    if image is None:
        hf_images = [n for n in names if hf.get(n, {}).get("_type") == "Image" and _is_hf_image(pa, types[n])]
        binaries = [name for name in _IMAGE_NAMES if name in types and _is_binary(pa, types[name])]
        structs = [name for name in names if _is_hf_image(pa, types[name])]
        image = next(iter(hf_images + binaries + structs), None)
    if image is None:
        raise FormatError(f"{path}: no image column found: pass image_column= (columns: {names})")
    image_type = types[image]
    if _is_hf_image(pa, image_type):
        image_spec = _Column("image", image, "image", "hf_image")
    elif _is_binary(pa, image_type):
        image_spec = _Column("image", image, "image", "binary")
    else:
        raise FormatError(f"{path}: image column {image!r} holds {image_type}, not binary image bytes")

    label = given(label_column, "label")
    if label is None and own is not None:
        label = own.get("label")
    elif label is None:
        label = next((n for n in _LABEL_NAMES if n in types and pa.types.is_integer(types[n])), None)
    if label is not None and not pa.types.is_integer(types[label]):
        raise FormatError(f"{path}: label column {label!r} holds {types[label]}, not integers")
    key = given(key_column, "key")
    if key is None and own is not None:
        key = own.get("key")
    elif key is None:
        key = next((n for n in _KEY_NAMES if n in types and _is_string(pa, types[n])), None)
    if key is not None and key in (image, label):
        raise FormatError(f"{path}: column {key!r} cannot be both the key and the image or label")

    described = {entry["column"]: _own_column(entry, path) for entry in (own or {}).get("fields", [])}
    fields: dict[str, _Column] = {}
    for name in names:
        if name in (image, label, key):
            continue
        spec = described.get(name) or _infer(pa, name, types[name])
        if spec is not None:
            if spec.name in fields:
                raise FormatError(f"{path}: two columns hold field {spec.name!r}")
            fields[spec.name] = spec
    classes = None
    if label is not None:
        names_of = hf.get(label, {}).get("names")
        if isinstance(names_of, list) and all(isinstance(n, str) for n in names_of):
            classes = list(names_of)
    return _Layout(
        image_spec,
        None if label is None else _Column("label", label, "int", "int"),
        None if key is None else _Column("key", key, "text", "text"),
        fields,
        classes,
    )


def _file_list(pattern: str | os.PathLike[str] | list[str]) -> tuple[list[str], list[str] | None, dict[str, str]]:
    """The files a pattern names, the class names and fields a pack's manifest records."""
    if not isinstance(pattern, list) and os.path.isdir(pattern):
        directory = os.fspath(pattern)
        if ParquetPackState.found_in(directory):
            state = ParquetPackState.read_manifest(directory)
            return [os.path.join(directory, shard.name) for shard in state.shards], state.classes, state.fields
        # As pyarrow and Spark do, names starting with "." or "_" are not data (temporaries, _SUCCESS).
        files = sorted(n for n in os.listdir(directory) if n.endswith(".parquet") and not n.startswith((".", "_")))
        if not files:
            raise FileNotFoundError(f"{directory}: no *.parquet file in this directory")
        return [os.path.join(directory, name) for name in files], None, {}
    return expand_pattern(pattern), None, {}


class _OpenFiles:
    """Per process: the memory-mapped files and the row groups last read (see the module docstring)."""

    def __init__(self, paths: list[str], cache_row_groups: int, verify_checksums: bool) -> None:
        self._paths, self._keep, self._verify = paths, cache_row_groups, verify_checksums
        self._files: OrderedDict[int, tuple[Any, Any]] = OrderedDict()  # file -> (ParquetFile, memory map)
        self._groups: OrderedDict[tuple[int, int], dict[str, Any]] = OrderedDict()  # -> column -> Array
        self.reads = 0  # column chunks read (row group x column), for cache_info()

    def parquet_file(self, file: int) -> Any:
        opened = self._files.get(file)
        if opened is not None:
            self._files.move_to_end(file)
            return opened[0]
        pa, pq = import_pyarrow()
        mapped = pa.memory_map(self._paths[file])
        try:
            parquet = pq.ParquetFile(mapped, page_checksum_verification=self._verify)
        except BaseException:
            mapped.close()
            raise
        self._files[file] = (parquet, mapped)
        if len(self._files) > _MAX_OPEN_FILES:
            self._files.popitem(last=False)[1][1].close()  # buffers still in use keep their mapping
        return parquet

    def column(self, file: int, group: int, spec: _Column) -> Any:
        """The column of ``spec`` in row group ``group`` of ``file``, one Arrow array (read once)."""
        entry = self._groups.get((file, group))
        if entry is not None:
            self._groups.move_to_end((file, group))
            if spec.column in entry:
                return entry[spec.column]
        table = self.parquet_file(file).read_row_group(group, columns=[spec.column])
        array = table.column(spec.column).combine_chunks()  # "a.b" may also bring a nested "a": by name
        if spec.how == "hf_image":
            array = array.flatten()[array.type.get_field_index("bytes")]  # nulls of the struct kept
        self.reads += 1
        if entry is None:
            entry = self._groups[(file, group)] = {}
        entry[spec.column] = array
        self._evict()
        return array

    def _evict(self) -> None:
        total = sum(array.nbytes for entry in self._groups.values() for array in entry.values())
        while len(self._groups) > 1 and (len(self._groups) > self._keep or total > _CACHE_BYTES):
            _, entry = self._groups.popitem(last=False)
            total -= sum(array.nbytes for array in entry.values())

    def info(self) -> dict[str, int]:
        return {"column_reads": self.reads, "cached_row_groups": len(self._groups), "open_files": len(self._files)}


def _value(spec: _Column, array: Any, row: int, where: Callable[[], str]) -> Any:
    """The Python value of ``array[row]`` (``_NULL`` for a null) as the field kind of ``spec`` has it;
    ``where()`` names it in errors (called only then: a key may cost a read)."""
    scalar = array[row]
    if not scalar.is_valid:
        return _NULL
    how = spec.how
    if how in ("binary", "hf_image", "text", "json"):
        if how == "json":
            return scalar.as_py(maps_as_pydicts="strict")
        return scalar.as_py()
    if how == "int":
        return int(scalar.as_py())
    if how == "float":
        return float(scalar.as_py())
    if how == "list":
        values = scalar.values
        if values.null_count:
            raise FormatError(f"{where()}: the list holds nulls: not an array of numbers")
        return np.asarray(values.to_numpy(zero_copy_only=False), dtype=spec.dtype)
    if how == "npy":
        return decode_value("array", scalar.as_py(), where())
    if how == "json_text":
        text = scalar.as_py()
        try:
            return json.loads(text)
        except ValueError:
            return decode_value("json", text.encode("utf-8"), where())  # raises, naming the field
    return str(scalar.as_py())  # "str": dates, times, decimals


class ParquetSource:
    """A :class:`~fastloader.datasets.base.Source` and :class:`~fastloader.fields.values.FieldSource`
    over Parquet files (see the module docstring for the columns and the costs).

    ``pattern``: a file, a directory (its sorted ``*.parquet``, or a ``fastloader pack --format
    parquet`` output), a brace / glob pattern or a list. ``image_column`` / ``label_column`` /
    ``key_column``: which columns hold them (default: found as the module docstring says).
    ``cache_row_groups``: row groups each process keeps decoded. ``verify_checksums``: check the
    page checksums of files that have them (``fastloader verify`` does).
    """

    def __init__(
        self,
        pattern: str | os.PathLike[str] | list[str],
        *,
        image_column: str | None = None,
        label_column: str | None = None,
        key_column: str | None = None,
        cache_row_groups: int = DEFAULT_CACHE_ROW_GROUPS,
        verify_checksums: bool = False,
    ) -> None:
        if not isinstance(cache_row_groups, int) or cache_row_groups < 1:
            raise ValueError(f"cache_row_groups must be a positive integer, got {cache_row_groups!r}")
        _, pq = import_pyarrow()
        self.paths, pack_classes, pack_fields = _file_list(pattern)
        layouts: list[_Layout] = []
        group_rows: list[int] = []
        first_group = [0]
        for path in self.paths:
            try:
                metadata = pq.read_metadata(path)
                schema = metadata.schema.to_arrow_schema()
            except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
                raise FormatError(f"{path}: not a readable Parquet file ({type(error).__name__}: {error})") from None
            layouts.append(_layout(path, schema, image_column, label_column, key_column))
            group_rows.extend(metadata.row_group(g).num_rows for g in range(metadata.num_row_groups))
            first_group.append(len(group_rows))
        for path, layout in zip(self.paths[1:], layouts[1:]):
            _check_same(self.paths[0], layouts[0], path, layout)
        self._layouts = layouts
        self._kinds = {n: c.kind for n, c in layouts[0].fields.items()} if layouts else dict(pack_fields)
        self.classes: list[str] | None = pack_classes or (layouts[0].classes if layouts else None)
        self._starts = np.concatenate([[0], np.cumsum(group_rows, dtype=np.int64)]).astype(np.int64)
        self._first_group = np.array(first_group, dtype=np.int64)
        self._group_file = np.repeat(np.arange(len(self.paths), dtype=np.int32), np.diff(self._first_group))
        self._file_starts = self._starts[self._first_group]  # the first item of each file
        self._length = int(self._starts[-1])
        self._local = ProcessLocal(partial(_OpenFiles, self.paths, cache_row_groups, verify_checksums))

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        groups = len(self._starts) - 1
        return f"{type(self).__name__}({self._length} rows in {len(self.paths)} files, {groups} row groups)"

    # -- where an item is -------------------------------------------------------------------------

    def shard_starts(self) -> np.ndarray:
        """Where each row group's items start, and the total at the end (for ShardWindowSampler)."""
        return self._starts.copy()

    def _locate(self, index: int) -> tuple[int, int, int]:
        """``(file, row group, row in the row group)`` of item ``index`` (row groups numbered across files)."""
        index = check_index(index, self._length)
        group = int(self._starts.searchsorted(index, "right")) - 1  # the method: np.searchsorted costs 2x
        return int(self._group_file[group]), group, index - int(self._starts[group])

    def location(self, index: int) -> str:
        """``"<file>#<row in the file>"``."""
        index = check_index(index, self._length)
        file = self._locate(index)[0]
        return f"{self.paths[file]}#{index - int(self._file_starts[file])}"

    def _cell(self, file: int, group: int, row: int, spec: _Column, where: Callable[[], str]) -> Any:
        """Row ``row`` of row group ``group`` in the column of ``spec`` (``_NULL`` for a null)."""
        in_file = group - int(self._first_group[file])
        try:
            array = self._local.get().column(file, in_file, spec)
        except (OSError, ValueError) as error:  # pyarrow's: a bad page or checksum, a file changed since
            raise FormatError(
                f"{where()}: cannot read column {spec.column!r} of row group {in_file} in {self.paths[file]}"
                f" ({type(error).__name__}: {error})"
            ) from error
        return _value(spec, array, row, where)

    # -- the Source protocol ----------------------------------------------------------------------

    def read(self, index: int) -> bytes:
        file, group, row = self._locate(index)
        spec = self._layouts[file].image
        data = self._cell(file, group, row, spec, lambda: self.key(index))
        if data is _NULL:
            raise FormatError(f"{self.key(index)}: no image (null in column {spec.column!r})")
        return bytes(data)

    def label(self, index: int) -> int:
        file, group, row = self._locate(index)
        spec = self._layouts[file].label
        if spec is None:
            return -1
        value = self._cell(file, group, row, spec, lambda: self.location(index))
        return -1 if value is _NULL else int(value)

    def key(self, index: int) -> str:
        """The key column's value, else (or for a null) ``location(index)``."""
        file, group, row = self._locate(index)
        spec = self._layouts[file].key
        value = _NULL if spec is None else self._cell(file, group, row, spec, lambda: self.location(index))
        return self.location(index) if value is _NULL else str(value)

    def labels(self) -> np.ndarray:
        """Every label (-1 where there is none), read from each file's label column."""
        parts = []
        files = self._local.get()
        for file, layout in enumerate(self._layouts):
            count = int(self._file_starts[file + 1] - self._file_starts[file])
            if layout.label is None:
                parts.append(np.full(count, -1, dtype=np.int64))
                continue
            column = files.parquet_file(file).read(columns=[layout.label.column]).column(layout.label.column)
            parts.append(column.fill_null(-1).to_numpy().astype(np.int64))
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    # -- the FieldSource protocol -----------------------------------------------------------------

    def field_kinds(self) -> dict[str, str]:
        return dict(self._kinds)

    def field_aliases(self) -> dict[str, str]:
        """The image and label columns' names (``{"jpg": "image", "cls": "label"}``)."""
        if not self._layouts:
            return {}
        layout = self._layouts[0]
        aliases = {layout.image.column: "image"}
        if layout.label is not None:
            aliases[layout.label.column] = "label"
        return aliases

    def read_field(self, index: int, name: str) -> Any:
        file, group, row = self._locate(index)
        spec = self._layouts[file].fields.get(name)
        if spec is None:
            raise KeyError(f"no field {name!r} in these Parquet files (fields: {sorted(self._kinds)})")
        value = self._cell(file, group, row, spec, lambda: f"{self.key(index)}: field {name!r}")
        if value is _NULL:
            raise MissingField(f"{self.key(index)}: no field {name!r} (null in column {spec.column!r})")
        return value

    def cache_info(self) -> dict[str, int]:
        """This process's reads: column chunks read, row groups kept decoded, files open."""
        return self._local.get().info()


def _check_same(first_path: str, first: _Layout, path: str, layout: _Layout) -> None:
    """Every file must hold the same fields, and a label in all or none (FormatError naming both)."""
    kinds = {n: c.kind for n, c in first.fields.items()}
    other = {n: c.kind for n, c in layout.fields.items()}
    if kinds != other or (first.label is None) != (layout.label is None):
        raise FormatError(
            f"{path}: its columns differ from {first_path}'s: fields {other} and "
            f"{'a' if layout.label else 'no'} label, against {kinds} and {'a' if first.label else 'no'} label"
        )


class ParquetDataset(ImageDataset[Any]):
    """``(transform(image), target_transform(label))`` for each row of Parquet files (see :class:`ParquetSource`).

    ``fields``: samples with more than a label (``fields=("image", "caption", "label")``: see
    ``fastloader.datasets.base``); every column besides the image and label is a field, named as
    the column. Other keyword arguments are those of :class:`ParquetSource`. ``classes`` / ``class_to_idx`` come from
    a Hugging Face ``ClassLabel`` or a pack's manifest (None otherwise). Read in a shard-aware order
    (``fastloader.samplers.ShardWindowSampler(dataset)``) rather than uniformly at random: see the
    module docstring.
    """

    def __init__(
        self,
        pattern: str | os.PathLike[str] | list[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        decode: Callable[[bytes, str], Any] = decode_pil,
        *,
        image_column: str | None = None,
        label_column: str | None = None,
        key_column: str | None = None,
        cache_row_groups: int = DEFAULT_CACHE_ROW_GROUPS,
        fields: Sequence[Spec] | Mapping[str, Spec] | None = None,
    ) -> None:
        source = ParquetSource(
            pattern,
            image_column=image_column,
            label_column=label_column,
            key_column=key_column,
            cache_row_groups=cache_row_groups,
        )
        super().__init__(source, transform, target_transform, decode, fields=fields)
