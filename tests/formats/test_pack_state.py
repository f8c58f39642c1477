"""The JSON state of tar and Parquet packs: the same bytes as earlier fastloaders wrote, keys in their order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fastloader.errors import FormatError
from fastloader.formats.bad_samples import BadSample
from fastloader.formats.pack_state import MAX_STATE_BYTES, ShardRecord
from fastloader.formats.parquet_pack import ParquetPackState
from fastloader.formats.tar_manifest import TarPackState, field_members

COMMON: dict[str, Any] = {
    "fingerprint": {"n": 3, "a": [1]},
    "created": 7,
    "position": 4,
    "shards": (ShardRecord("x-000000.tar", 2, 3),),
    "skipped": (BadSample(1, "k", "why"), BadSample(3, "k3", "why")),
    "complete": True,
    "classes": ["a"],
    "meta": {"m": 1},
}
SHARD = {"name": "x-000000.tar", "count": 2, "end_position": 3}
SKIPPED = [{"position": 1, "key": "k", "reason": "why"}, {"position": 3, "key": "k3", "reason": "why"}]


def test_tar_state_bytes(tmp_path: Path) -> None:
    state = TarPackState(prefix="x", fields=field_members({"Caption": "text"}), **COMMON)
    expected = {"fingerprint": {"n": 3, "a": [1]}, "prefix": "x", "created": 7, "position": 4, "shards": [SHARD]}
    expected |= {"skipped": SKIPPED, "complete": True, "classes": ["a"], "meta": {"m": 1}}
    expected |= {"fields": {"Caption": {"kind": "text", "extension": "caption.txt"}}}
    expected |= {"format": "fastloader-tar", "version": 4, "count": 2}
    assert state.to_json() == json.dumps(expected, indent=1).encode()
    (tmp_path / "state.json").write_bytes(state.to_json())
    assert TarPackState.read(tmp_path / "state.json") == state


def test_parquet_state_bytes(tmp_path: Path) -> None:
    state = ParquetPackState(fields={"c": "text"}, **COMMON)
    expected = {"fingerprint": {"n": 3, "a": [1]}, "created": 7, "fields": {"c": "text"}, "position": 4}
    expected |= {"shards": [SHARD], "skipped": SKIPPED, "complete": True, "classes": ["a"], "meta": {"m": 1}}
    expected |= {"format": "fastloader-parquet", "version": 2, "count": 2}
    assert state.to_json() == json.dumps(expected, indent=1).encode()
    (tmp_path / "state.json").write_bytes(state.to_json())
    assert ParquetPackState.read(tmp_path / "state.json") == state
    with pytest.raises(FormatError, match="unreadable Parquet pack state .*expected 'fastloader-parquet' v1 or v2"):
        ParquetPackState.read(_with(tmp_path, version=3))
    with pytest.raises(FormatError, match="bad file name '../x'"):
        ParquetPackState.read(_with(tmp_path, shards=[{**SHARD, "name": "../x"}]))


def _with(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "changed.json"
    path.write_text(json.dumps({**json.loads((tmp_path / "state.json").read_bytes()), **changes}))
    return path


SECOND = {"name": "x-000001.tar", "count": 2, "end_position": 6}
HASH = "0123456789abcdef" * 4


def test_a_file_s_size_and_hash_read_back_and_bad_ones_are_refused(tmp_path: Path) -> None:
    state = TarPackState(prefix="x", **{**COMMON, "shards": (ShardRecord("x-000000.tar", 2, 3, 10240, HASH),)})
    (tmp_path / "state.json").write_bytes(state.to_json())
    assert TarPackState.read(tmp_path / "state.json") == state
    for bad in ({"size": 10240}, {"size": -1, "sha256": HASH}, {"size": 1, "sha256": "ABC"}):
        with pytest.raises(FormatError, match="bad (size|sha256)"):
            TarPackState.read(_with(tmp_path, shards=[{**SHARD, **bad}]))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"shards": [SHARD, SHARD]}, "shard 'x-000000.tar' is listed twice"),
        ({"shards": [SHARD, {**SECOND, "name": SHARD["name"]}], "position": 6}, "shard 'x-000000.tar' is listed twice"),
        ({"shards": [SHARD, {**SECOND, "end_position": 3}]}, r"shard 'x-000001.tar': end_position 3 is not after"),
        ({"shards": [SHARD, SECOND]}, r"shard 'x-000001.tar': end_position 6 .* within the pack's position \(4\)"),
        ({"shards": [{**SHARD, "count": -1}]}, "shard 'x-000000.tar': bad count -1"),
        (
            {"shards": [{**SHARD, "count": 3}]},
            r"shard 'x-000000.tar': count 3, but it covers positions 0..2 of which 1 are skipped \(2",
        ),
        ({"shards": [{**SHARD, "end_position": 2}]}, r"shard 'x-000000.tar': count 2, but it covers positions 0..1 "),
        ({"position": 7}, r"positions 3..6 are neither in a shard nor all skipped \(position 7, 2 samples"),
        ({"count": 40}, "count 40, but its shards hold 2 samples"),
        ({"position": -1}, "bad position -1"),
        ({"skipped": [SKIPPED[1], SKIPPED[0]]}, "the skipped positions do not strictly increase within 0..3"),
        ({"skipped": [SKIPPED[0], SKIPPED[0]]}, "the skipped positions do not strictly increase"),
        ({"skipped": [SKIPPED[0], {**SKIPPED[1], "position": 4}]}, "the skipped positions do not strictly increase"),
    ],
)
def test_a_state_whose_numbers_disagree_is_refused_naming_the_file_and_shard(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    """A shard listed twice would be served twice; a wrong end_position or count would resume at the wrong place."""
    for state in (ParquetPackState(fields={}, **COMMON), TarPackState(prefix="x", **COMMON)):
        (tmp_path / "state.json").write_bytes(state.to_json())
        path = _with(tmp_path, **changes)
        with pytest.raises(FormatError, match=f"{path}: {message}"):
            type(state).read(path)


def test_shards_and_skipped_items_that_account_for_every_position_read(tmp_path: Path) -> None:
    shards = (ShardRecord(**SHARD), ShardRecord(**SECOND))
    skipped = (*COMMON["skipped"], BadSample(6, "k6", "why"))  # positions 1 and 3 in the first shard, 6 after both
    state = TarPackState(prefix="x", **{**COMMON, "position": 7, "shards": shards, "skipped": skipped})
    (tmp_path / "state.json").write_bytes(state.to_json())
    assert TarPackState.read(tmp_path / "state.json") == state and state.count == 4


def test_a_manifest_nested_too_deep_is_a_format_error_naming_it(tmp_path: Path) -> None:
    """A manifest is data from elsewhere (a copied pack, an S3 prefix): 100,000 levels of nesting must not
    escape as a RecursionError."""
    path = tmp_path / TarPackState.MANIFEST_NAME
    path.write_text('{"format": "fastloader-tar", "meta": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(FormatError, match="nested deeper than"):
        TarPackState.read(path)


def test_a_manifest_larger_than_a_pack_state_may_be_is_refused_before_it_is_read(tmp_path: Path) -> None:
    manifest = tmp_path / "fastloader-tar.json"
    with open(manifest, "wb") as out:
        out.truncate(MAX_STATE_BYTES + 1)  # sparse: no disk spent, and a read would take 256 MB
    with pytest.raises(FormatError, match=rf"{manifest}: unreadable tar pack state \(268,435,457 bytes, more than"):
        TarPackState.read(manifest)
