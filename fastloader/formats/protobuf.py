"""Just enough of the protobuf wire format to read and write ``tf.train.Example``, without protobuf.

The messages (TensorFlow ``example.proto`` / ``feature.proto``)::

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }      a map entry is { string key = 1; Feature value = 2; }
    Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }
    Int64List { repeated int64 value = 1 [packed = true]; }

Wire format: each field is a varint key ``field_number << 3 | wire_type`` followed by a varint
(type 0), 8 bytes (1), a varint length and that many bytes (2), or 4 bytes (5). Readers must
accept repeated scalars both packed (one type-2 field) and unpacked (one field per value), skip
unknown fields, and let the last occurrence of a singular field or map key win. int64 values are
two's-complement in 10-byte varints when negative.

Malformed input raises :class:`~fastloader.errors.FormatError` (the caller adds file and record).
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import cast

from fastloader.errors import FormatError

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5
_KINDS = {1: "bytes", 2: "float", 3: "int64"}
_FIELD_OF_KIND = {kind: field for field, kind in _KINDS.items()}
_MAX_VARINT_BYTES = 10
_U64 = (1 << 64) - 1

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True)
class Feature:
    """One ``tf.train.Feature``: its ``kind`` ("bytes", "float", "int64", or "empty" when no list is
    set) and its values."""

    kind: str
    values: tuple[bytes, ...] | tuple[float, ...] | tuple[int, ...]


def bytes_feature(*values: bytes) -> Feature:
    return Feature("bytes", tuple(bytes(v) for v in values))


def int64_feature(*values: int) -> Feature:
    for value in values:
        if not -(1 << 63) <= int(value) < (1 << 63):
            raise ValueError(f"int64 feature value {value} is out of range")
    return Feature("int64", tuple(int(v) for v in values))


def float_feature(*values: float) -> Feature:
    return Feature("float", tuple(float(v) for v in values))


# -- decoding -----------------------------------------------------------------------------------


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    """The unsigned varint at ``pos`` (truncated to 64 bits, as protobuf does) and the position after it."""
    result = shift = 0
    end = min(len(buf), pos + _MAX_VARINT_BYTES)
    while pos < end:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & _U64, pos
        shift += 7
    if pos == len(buf):
        raise FormatError(f"truncated varint at byte {pos}")
    raise FormatError(f"varint longer than {_MAX_VARINT_BYTES} bytes at byte {pos - _MAX_VARINT_BYTES}")


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= (1 << 63) else value


def iter_fields(buf: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """``(field_number, wire_type, value)`` for each field of a message: an int for varints, a
    zero-copy view of the bytes for the other wire types."""
    pos, end = 0, len(buf)
    while pos < end:
        start = pos
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise FormatError(f"field number 0 at byte {start}")
        if wire == VARINT:
            value, pos = _varint(buf, pos)
            yield field, wire, value
            continue
        if wire == LENGTH_DELIMITED:
            size, pos = _varint(buf, pos)
        elif wire == FIXED64:
            size = 8
        elif wire == FIXED32:
            size = 4
        else:
            raise FormatError(f"unsupported wire type {wire} (field {field}) at byte {start}")
        if size > end - pos:
            raise FormatError(f"field {field} at byte {start} declares {size} bytes, only {end - pos} remain")
        yield field, wire, buf[pos : pos + size]
        pos += size


def _submessage(wire: int, value: int | memoryview, what: str) -> memoryview:
    if wire != LENGTH_DELIMITED or not isinstance(value, memoryview):
        raise FormatError(f"{what} has wire type {wire}, expected a length-delimited message")
    return value


def parse_example(data: Buffer, names: Collection[str] | None = None) -> dict[str, Feature]:
    """The features of a serialized ``tf.train.Example``, only those in ``names`` when given."""
    view = memoryview(data).cast("B")
    wanted = None if names is None else {name.encode("utf-8") for name in names}
    raw: dict[bytes, memoryview] = {}
    for field, wire, value in iter_fields(view):
        if field != 1:
            continue
        for entry_field, entry_wire, entry in iter_fields(_submessage(wire, value, "Example.features")):
            if entry_field != 1:
                continue
            key, feature = _map_entry(_submessage(entry_wire, entry, "Features.feature"))
            if wanted is None or key in wanted:
                raw[key] = feature  # a repeated map key: the last one wins
    features = {}
    for key, feature in raw.items():
        try:
            name = key.decode("utf-8")
        except UnicodeDecodeError as error:
            raise FormatError(f"feature name {key!r} is not UTF-8") from error
        features[name] = _decode_feature(feature)
    return features


def _map_entry(entry: memoryview) -> tuple[bytes, memoryview]:
    key, value = b"", memoryview(b"")
    for field, wire, item in iter_fields(entry):
        if field == 1:
            key = bytes(_submessage(wire, item, "feature name"))
        elif field == 2:
            value = _submessage(wire, item, "Feature")
    return key, value


def _decode_feature(feature: memoryview) -> Feature:
    kind, values = "empty", memoryview(b"")
    for field, wire, value in iter_fields(feature):
        if field in _KINDS:  # a oneof: the last list set wins
            kind, values = _KINDS[field], _submessage(wire, value, f"Feature.{_KINDS[field]}_list")
    if kind == "bytes":
        return Feature(kind, tuple(_bytes_values(values)))
    if kind == "float":
        return Feature(kind, tuple(_float_values(values)))
    if kind == "int64":
        return Feature(kind, tuple(_int64_values(values)))
    return Feature(kind, ())


def _bytes_values(values: memoryview) -> Iterator[bytes]:
    for field, wire, value in iter_fields(values):
        if field == 1:
            yield bytes(_submessage(wire, value, "BytesList.value"))


def _float_values(values: memoryview) -> Iterator[float]:
    for field, wire, value in iter_fields(values):
        if field != 1:
            continue
        if wire == FIXED32 and isinstance(value, memoryview):
            yield struct.unpack("<f", value)[0]
        elif wire == LENGTH_DELIMITED and isinstance(value, memoryview):
            if len(value) % 4:
                raise FormatError(f"packed FloatList of {len(value)} bytes is not a multiple of 4")
            yield from struct.unpack(f"<{len(value) // 4}f", value)
        else:
            raise FormatError(f"FloatList.value has wire type {wire}")


def _int64_values(values: memoryview) -> Iterator[int]:
    for field, wire, value in iter_fields(values):
        if field != 1:
            continue
        if wire == VARINT and isinstance(value, int):
            yield _signed64(value)
        elif wire == LENGTH_DELIMITED and isinstance(value, memoryview):
            pos = 0
            while pos < len(value):
                number, pos = _varint(value, pos)
                yield _signed64(number)
        else:
            raise FormatError(f"Int64List.value has wire type {wire}")


# -- encoding -----------------------------------------------------------------------------------


def _encode_varint(value: int) -> bytes:
    value &= _U64  # negative int64: two's complement, 10 bytes
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _encode_varint(field << 3 | LENGTH_DELIMITED) + _encode_varint(len(payload)) + payload


def _encode_feature(feature: Feature) -> bytes:
    values = feature.values
    if feature.kind == "bytes":
        body = b"".join(_length_delimited(1, cast(bytes, v)) for v in values)
    elif feature.kind == "float":
        body = _length_delimited(1, struct.pack(f"<{len(values)}f", *values)) if values else b""
    elif feature.kind == "int64":
        packed = b"".join(_encode_varint(cast(int, v)) for v in values)
        body = _length_delimited(1, packed) if values else b""
    elif feature.kind == "empty":
        return b""
    else:
        raise ValueError(f"unknown feature kind {feature.kind!r}")
    return _length_delimited(_FIELD_OF_KIND[feature.kind], body)


def encode_example(features: Mapping[str, Feature]) -> bytes:
    """Serialize a ``tf.train.Example`` holding ``features`` (names in the mapping's order)."""
    entries = b"".join(
        _length_delimited(1, _length_delimited(1, name.encode("utf-8")) + _length_delimited(2, _encode_feature(f)))
        for name, f in features.items()
    )
    return _length_delimited(1, entries)
