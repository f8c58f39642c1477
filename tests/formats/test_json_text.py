"""JSON nesting measured before it is parsed: the same answer in every process, whatever its stack."""

from __future__ import annotations

import json
import sys

import pytest

from fastloader.errors import FormatError
from fastloader.formats.field_values import check_value, decode_value, encode_value
from fastloader.formats.json_text import MAX_DEPTH, depth_exceeds, dumps, loads


def nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [1, 2, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 985, 100_000])
def test_the_limit_is_exact(depth: int) -> None:
    text = "[" * depth + "]" * depth
    assert depth_exceeds(text) == (depth > MAX_DEPTH)
    assert depth_exceeds('{"a": ' * depth + "1" + "}" * depth) == (depth > MAX_DEPTH)


def test_brackets_inside_strings_and_escapes_do_not_count() -> None:
    inside = json.dumps({"text": "[" * 1000 + '\\"{' * 500, "list": [1, 2]})
    assert not depth_exceeds(inside) and loads(inside, "x")["list"] == [1, 2]
    escaped_quote = '["\\"' + "[" * 500 + '"]'  # the quote after a backslash does not end the string
    assert not depth_exceeds(escaped_quote)
    backslashes = '["\\\\"' + ", [" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 2)  # "\\" ends: the brackets count
    assert depth_exceeds(backslashes)


def test_invalid_json_is_never_measured_shallower_than_it_parses() -> None:
    assert depth_exceeds("[" * (MAX_DEPTH + 1))  # never closed
    assert depth_exceeds('"unterminated ' + "[" * 10 + '" ' + "[" * (MAX_DEPTH + 1))


def test_loads_and_dumps_name_where_and_never_recurse_too_far() -> None:
    with pytest.raises(FormatError, match="meta.json: JSON nested deeper than 128 levels"):
        loads("[" * 100_000 + "]" * 100_000, "meta.json")
    with pytest.raises(FormatError, match="meta.json: not valid JSON"):
        loads("{nope", "meta.json")
    with pytest.raises(FormatError, match="a value: JSON nested deeper"):
        dumps(nested(sys.getrecursionlimit() * 2), "a value")
    with pytest.raises(FormatError, match="a value: JSON nested deeper"):
        dumps(nested(MAX_DEPTH + 1), "a value")
    assert json.loads(dumps(nested(MAX_DEPTH), "a value")) == nested(MAX_DEPTH)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 985, 100_000])
def test_field_values_too_deep_are_format_errors_naming_the_field(depth: int) -> None:
    with pytest.raises(FormatError, match="k: field 'meta': JSON nested deeper than 128"):
        decode_value("json", b"[" * depth + b"]" * depth, "k: field 'meta'")
    with pytest.raises(FormatError, match="k: field 'meta': JSON nested deeper than 128"):
        check_value("json", nested(depth), "k: field 'meta'")
    with pytest.raises(FormatError, match="JSON nested deeper than 128"):
        encode_value("json", nested(depth))
    assert decode_value("json", encode_value("json", nested(MAX_DEPTH)), "k") == nested(MAX_DEPTH)
