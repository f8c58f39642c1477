"""The tar pack manifest: how field names become member extensions, and manifests of every version read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastloader.errors import FormatError
from fastloader.formats.tar_manifest import FieldMember, TarPackState, field_members, member_extension


@pytest.mark.parametrize(
    ("name", "kind", "extension"),
    [
        ("txt", "text", "txt"),  # what WebDataset readers already decode right stays as it is
        ("json", "json", "json"),
        ("seg.png", "image", "seg.png"),
        ("id", "int", "id"),
        ("caption", "text", "caption.txt"),  # a suffix tells them the kind
        ("meta", "json", "meta.json"),
        ("age", "int", "age.cls"),
        ("embedding", "array", "embedding.npy"),
        ("notes.txt", "bytes", "notes.txt.bin"),
        ("score", "float", "score"),  # no float extension exists
        ("mask", "image", "mask"),
        ("TEXT", "text", "text"),  # lowercased, as readers would
        ("image/object/bbox/xmin", "array", "image%2fobject%2fbbox%2fxmin.npy"),
        ("50% é", "bytes", "50%25%20%c3%a9"),
        ("png", "image", "field.png"),  # else readers take it for the image, or the label
        ("label", "int", "field.label"),
        ("cls", "int", "field.cls"),
    ],
)
def test_member_extension(name: str, kind: str, extension: str) -> None:
    assert member_extension(name, kind) == extension


def test_colliding_or_bad_fields_are_refused() -> None:
    assert field_members({"Caption": "text", "TEXT": "text"}) == {
        "Caption": FieldMember("text", "caption.txt"),
        "TEXT": FieldMember("text", "text"),
    }
    with pytest.raises(ValueError, match="fields 'a.B' and 'A.b' would both be stored as tar members"):
        field_members({"a.B": "bytes", "A.b": "bytes"})
    with pytest.raises(ValueError, match="empty"):
        member_extension("", "text")
    with pytest.raises(ValueError, match="kind must be one of"):
        member_extension("x", "str")


def state_json(**changes: object) -> str:
    raw = {"fingerprint": {}, "prefix": "shard", "created": 1, "shards": [], "skipped": [], "complete": True}
    raw.update({"classes": None, "meta": {}, "format": "fastloader-tar", "version": 2, "count": 0})
    raw.update(changes)
    return json.dumps(raw)


def test_manifests_of_both_versions_read(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(state_json(version=1))  # before fields: no "fields" key
    assert TarPackState.read(path).fields == {}
    state = TarPackState(fingerprint={}, prefix="shard", created=1, fields=field_members({"Caption": "text"}))
    path.write_bytes(state.to_json())
    assert TarPackState.read(path) == state and json.loads(path.read_bytes())["fields"] == {
        "Caption": {"kind": "text", "extension": "caption.txt"}
    }
    for bad in (
        state_json(version=5),
        state_json(fields={"x": {"kind": "pickle", "extension": "x"}}),
        state_json(fields={"x": {"kind": "image", "extension": "png"}}),
        state_json(fields={"x": {"kind": "text", "extension": "a/b"}}),
        state_json(fields={"x": {"kind": "text", "extension": "t"}, "y": {"kind": "text", "extension": "t"}}),
    ):
        path.write_text(bad)
        with pytest.raises(FormatError, match="unreadable tar pack state"):
            TarPackState.read(path)
