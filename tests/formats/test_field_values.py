"""The seven field kinds' byte layout: exact encodings, clear refusals, WebDataset's extension conventions."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest

from fastloader.errors import FormatError
from fastloader.formats.field_values import check_value, decode_value, encode_value, kind_of_extension, kind_of_value


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("bytes", bytes(range(256))),
        ("image", b"\xff\xd8\xff\xe0 not really a jpeg"),
        ("text", "caption with ünïcödé, emoji 🦊, tabs\tand\nnewlines"),
        ("text", ""),
        ("json", {"boxes": [[1.5, 2, 3, 4]], "nested": {"a": None, "b": [True, False]}, "ü": "x"}),
        ("json", [1, "two", 3.0]),
        ("int", 0),
        ("int", -(2**63)),
        ("int", 2**63 - 1),
        ("float", 0.1),
        ("float", -0.0),
        ("float", 1e-310),  # subnormal
        ("float", math.inf),
    ],
)
def test_values_round_trip_exactly(kind: str, value: object) -> None:
    back = decode_value(kind, encode_value(kind, value), "where")
    assert back == value and type(back) is type(value)
    if kind == "float":
        assert struct.pack("<d", back) == struct.pack("<d", value)  # bit for bit, the sign of -0.0 too


def test_nan_round_trips() -> None:
    assert math.isnan(decode_value("float", encode_value("float", math.nan), "where"))


@pytest.mark.parametrize(
    "array",
    [
        np.arange(7, dtype=np.float32) / 3,
        np.array([-(2**63), 2**63 - 1], dtype=np.int64),
        np.arange(24, dtype=np.uint16).reshape(2, 3, 4),
        np.array([True, False]),
        np.zeros((0, 4), dtype=np.float64),
    ],
)
def test_arrays_round_trip_with_dtype_and_shape(array: np.ndarray) -> None:
    back = decode_value("array", encode_value("array", array), "where")
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)


def test_object_arrays_are_never_pickled() -> None:
    with pytest.raises(ValueError, match="numeric"):
        encode_value("array", np.array([{"a": 1}], dtype=object))
    import io

    pickled = io.BytesIO()
    np.lib.format.write_array(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(FormatError, match="shard-3:k: not a valid array"):
        decode_value("array", pickled.getvalue(), "shard-3:k")


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        ("text", b"\xff\xfe"),
        ("json", b"{not json"),
        ("int", b"12.5"),
        ("int", b"99999999999999999999"),
        ("float", b"x"),
    ],
)
def test_bad_bytes_name_where_they_are(kind: str, data: bytes) -> None:
    with pytest.raises(FormatError, match=f"train.tar:000001: not a valid {kind} value"):
        decode_value(kind, data, "train.tar:000001")


def test_extensions_follow_webdataset() -> None:
    assert [kind_of_extension(ext) for ext in ("jpg", "seg.png", "TXT", "json", "cls", "npy", "meta.xyz")] == [
        "image",
        "image",
        "text",
        "json",
        "int",
        "array",
        "bytes",
    ]


def test_kind_of_value_and_check_value() -> None:
    assert [kind_of_value(v) for v in (b"x", "x", 3, np.int32(3), 2.5, np.zeros(2), {"a": 1}, None)] == [
        "bytes",
        "text",
        "int",
        "int",
        "float",
        "array",
        "json",
        "json",
    ]
    assert check_value("int", np.int64(5), "w") == 5 and type(check_value("int", np.int64(5), "w")) is int
    with pytest.raises(FormatError, match="k: field 'score': a str is not a valid float value"):
        check_value("float", "0.5", "k: field 'score'")
    with pytest.raises(FormatError, match="not a valid json"):
        check_value("json", {"a": np.zeros(2)}, "k")


@pytest.mark.parametrize(
    "header",
    [b"{'descr': '<i8', 'fortran_order': False, 'shape': (2,", b"{'descr': '<i8', 'shape': (1,2 3)}", b"\x00\x01"],
)
def test_an_npy_header_that_is_not_a_literal_is_a_format_error(header: bytes) -> None:
    """numpy parses a .npy header as a Python literal: a broken one must not escape as SyntaxError / TokenError."""
    header = header.ljust(118) + b"\n"
    data = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + bytes(16)
    with pytest.raises(FormatError, match="k: not a valid array value"):
        decode_value("array", data, "k")
