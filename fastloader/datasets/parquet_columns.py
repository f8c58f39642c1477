"""What the columns of a Parquet file hold, and the Python value of one cell (for ``fastloader.datasets.parquet``).

A file's schema and its schema metadata come from its footer, which a damaged or hostile file can make
say anything: every name, kind, encoding and dtype they give is checked here against the columns the
file has and their Arrow types, so that a lie is a FormatError naming the file and never a KeyError, a
TypeError or a value silently converted to another type later. The rules that find the image, label,
key and field columns are in the docstring of ``fastloader.datasets.parquet``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastloader.errors import FormatError
from fastloader.formats.field_values import decode_value
from fastloader.formats.parquet_pack import PACK_FORMAT, SCHEMA_META_KEY, import_pyarrow

_IMAGE_NAMES = ("image", "jpg", "jpeg", "png", "webp", "img")
_LABEL_NAMES = ("label", "labels", "cls", "class")
_KEY_NAMES = ("key", "__key__", "id")
_NUMERIC = "biuf"  # numpy dtype kinds an array field may have
_HOW = {"image": "binary", "bytes": "binary", "text": "text", "json": "json_text", "int": "int", "float": "float"}
NULL: Any = object()  # a null cell (JSON's null is a value: None)


@dataclass(frozen=True)
class Column:
    """How one field (or the image, label or key) is read from its top-level column.

    ``how``: ``binary``, ``hf_image`` (the struct ``{bytes, path}``, as a dict), ``text``, ``int``, ``float``,
    ``list`` (a numpy array of ``dtype``), ``npy`` (binary ``.npy``), ``json_text`` (JSON in a
    string), ``json`` (a nested Arrow value) or ``str`` (``str`` of a scalar: dates, decimals).
    """

    name: str
    column: str
    kind: str
    how: str
    dtype: str | None = None


@dataclass(frozen=True)
class Layout:
    """What the columns of one file hold."""

    image: Column
    label: Column | None
    key: Column | None
    fields: dict[str, Column]
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


def _is_list(pa: Any, arrow_type: Any) -> bool:
    types = pa.types
    return bool(types.is_list(arrow_type) or types.is_large_list(arrow_type) or types.is_fixed_size_list(arrow_type))


def _infer(pa: Any, name: str, arrow_type: Any) -> Column | None:
    """The field a column of a foreign file is, from its Arrow type (None: not a field)."""
    types = pa.types
    if types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type  # read back decoded: the dictionary is an encoding
    if _is_hf_image(pa, arrow_type):
        return Column(name, name, "image", "hf_image")
    if _is_binary(pa, arrow_type):
        return Column(name, name, "bytes", "binary")
    if _is_string(pa, arrow_type):
        return Column(name, name, "text", "text")
    if types.is_integer(arrow_type) or types.is_boolean(arrow_type):
        return Column(name, name, "int", "int")
    if types.is_floating(arrow_type):
        return Column(name, name, "float", "float")
    if _is_list(pa, arrow_type):
        value_type = arrow_type.value_type
        if _is_number(pa, value_type):
            return Column(name, name, "array", "list", np.dtype(value_type.to_pandas_dtype()).str)
        return Column(name, name, "json", "json")
    if types.is_struct(arrow_type) or types.is_map(arrow_type):
        return Column(name, name, "json", "json")
    if types.is_temporal(arrow_type) or types.is_decimal(arrow_type):
        return Column(name, name, "text", "str")
    return None


def _hf_features(metadata: Mapping[bytes, bytes]) -> dict[str, dict[str, Any]]:
    """The ``features`` of the schema metadata Hugging Face ``datasets`` writes (``{}`` without); only
    its entries that are objects (a damaged file may hold anything)."""
    try:
        features = json.loads(metadata[b"huggingface"])["info"]["features"]
    except (KeyError, TypeError, ValueError, RecursionError):
        return {}
    if not isinstance(features, dict):
        return {}
    return {name: value for name, value in features.items() if isinstance(value, dict)}


def _own_meta(metadata: Mapping[bytes, bytes], path: str, types: Mapping[str, Any]) -> dict[str, Any] | None:
    """The schema metadata ``fastloader pack --format parquet`` wrote, checked against the file's columns
    (None for a foreign file)."""
    raw = metadata.get(SCHEMA_META_KEY)
    if raw is None:
        return None
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        raise FormatError(f"{path}: unreadable fastloader schema metadata ({type(error).__name__}: {error})") from None
    if not isinstance(meta, dict) or meta.get("format") != PACK_FORMAT or not isinstance(meta.get("fields"), list):
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise FormatError(f"{path}: unreadable fastloader schema metadata (format {found!r}, or no list of fields)")
    for role in ("image", "label", "key"):
        _named_column(meta.get(role), f"the {role}", path, types, optional=role != "image")
    for entry in meta["fields"]:
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) for k in ("name", "column", "kind")):
            raise FormatError(f"{path}: fastloader schema metadata: a field entry without name, column and kind")
        _named_column(entry["column"], f"field {entry['name']!r}", path, types, optional=False)
    return meta


def _named_column(column: Any, what: str, path: str, types: Mapping[str, Any], *, optional: bool) -> None:
    if column is None and optional:
        return
    if not isinstance(column, str) or column not in types:
        raise FormatError(
            f"{path}: fastloader schema metadata names column {column!r} for {what}, which the file does not have"
            f" (columns: {list(types)})"
        )


def _own_column(pa: Any, entry: Mapping[str, Any], arrow_type: Any, path: str) -> Column:
    """A field as a pack described it (see ``fastloader.formats.parquet_pack``), if its column's type holds it."""
    kind, encoding, name, column = entry["kind"], entry.get("encoding"), entry["name"], entry["column"]
    if kind == "array" and encoding == "list":
        dtype = _list_dtype(pa, entry.get("dtype"), arrow_type, f"{path}: field {name!r}")
        return Column(name, column, kind, "list", dtype)
    if kind == "array" and encoding != "npy":
        raise FormatError(f"{path}: field {name!r}: unknown array encoding {encoding!r}")
    if kind != "array" and kind not in _HOW:
        raise FormatError(f"{path}: field {name!r}: unknown kind {kind!r}")
    spec = Column(name, column, kind, "npy" if kind == "array" else _HOW[kind])
    if not _holds(pa, spec.how, arrow_type):
        raise FormatError(f"{path}: field {name!r} of kind {kind!r} cannot be in column {column!r} of {arrow_type}")
    return spec


def _holds(pa: Any, how: str, arrow_type: Any) -> bool:
    """Whether a column of ``arrow_type`` holds values read as ``how`` (a pack's field other than a list)."""
    if how in ("binary", "npy"):
        return _is_binary(pa, arrow_type)
    if how in ("text", "json_text"):
        return _is_string(pa, arrow_type)
    return bool(pa.types.is_integer(arrow_type) if how == "int" else pa.types.is_floating(arrow_type))


def _list_dtype(pa: Any, dtype: Any, arrow_type: Any, where: str) -> str:
    """The numpy dtype of a ``list`` array field: the one recorded, which must be the list's value type."""
    try:
        numpy_type = np.dtype(dtype) if isinstance(dtype, str) else None
    except (TypeError, ValueError):
        numpy_type = None
    if numpy_type is None or numpy_type.kind not in _NUMERIC or not numpy_type.isnative:
        raise FormatError(f"{where}: recorded dtype {dtype!r} is not a numeric numpy dtype in native byte order")
    if not _is_list(pa, arrow_type) or pa.from_numpy_dtype(numpy_type) != arrow_type.value_type:
        raise FormatError(f"{where}: recorded dtype {dtype!r} does not match its column's type {arrow_type}")
    return str(numpy_type.str)


def file_layout(
    path: str, schema: Any, image_column: str | None, label_column: str | None, key_column: str | None
) -> Layout:
    """What the columns of the file at ``path`` (its Arrow ``schema``) hold: see ``fastloader.datasets.parquet``."""
    pa, _ = import_pyarrow()
    names = list(schema.names)
    if len(set(names)) != len(names):
        raise FormatError(f"{path}: duplicate column names ({names})")
    types = {name: schema.field(name).type for name in names}
    metadata = schema.metadata or {}
    own, hf = _own_meta(metadata, path, types), _hf_features(metadata)

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
        image_spec = Column("image", image, "image", "hf_image")
    elif _is_binary(pa, image_type):
        image_spec = Column("image", image, "image", "binary")
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
        if key is not None and not _is_string(pa, types[key]):
            raise FormatError(f"{path}: key column {key!r} holds {types[key]}, not strings")
    elif key is None:
        key = next((n for n in _KEY_NAMES if n in types and _is_string(pa, types[n])), None)
    if key is not None and key in (image, label):
        raise FormatError(f"{path}: column {key!r} cannot be both the key and the image or label")

    described = {entry["column"]: entry for entry in (own or {}).get("fields", [])}
    fields: dict[str, Column] = {}
    for name in names:
        if name in (image, label, key):
            continue
        entry = described.get(name)
        spec = _own_column(pa, entry, types[name], path) if entry is not None else _infer(pa, name, types[name])
        if spec is not None:
            if spec.name in fields:
                raise FormatError(f"{path}: two columns hold field {spec.name!r}")
            fields[spec.name] = spec
    classes = None
    if label is not None:
        names_of = hf.get(label, {}).get("names")
        if isinstance(names_of, list) and all(isinstance(n, str) for n in names_of):
            classes = list(names_of)
    return Layout(
        image_spec,
        None if label is None else Column("label", label, "int", "int"),
        None if key is None else Column("key", key, "text", "text"),
        fields,
        classes,
    )


def cell_value(spec: Column, array: Any, row: int, where: Callable[[], str]) -> Any:
    """The Python value of ``array[row]`` (``NULL`` for a null) as the field kind of ``spec`` has it;
    ``where()`` names it in errors (called only then: a key may cost a read)."""
    pa, _ = import_pyarrow()
    scalar = array[row]
    if not scalar.is_valid:
        return NULL
    try:
        return _convert(spec, scalar, where)
    except (ValueError, KeyError, OverflowError, pa.ArrowException) as error:
        if isinstance(error, FormatError):
            raise
        # Bytes no writer would store: a string that is not UTF-8, a map with a key twice, a date out of range.
        raise FormatError(
            f"{where()}: column {spec.column!r}: unreadable value ({type(error).__name__}: {error})"
        ) from None


def _convert(spec: Column, scalar: Any, where: Callable[[], str]) -> Any:
    how = spec.how
    if how in ("binary", "hf_image", "text"):  # hf_image: {"bytes": ..., "path": ...} (a struct may lack "path")
        return scalar.as_py()
    if how == "json":
        return scalar.as_py(maps_as_pydicts="strict")
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
        # The field codec's own decode: the same nesting bound in every process, errors naming the field.
        return decode_value("json", scalar.as_py().encode("utf-8", "surrogatepass"), where())
    return str(scalar.as_py())  # "str": dates, times, decimals
