"""The JSON state of tar and Parquet packs: the same bytes as earlier fastloaders wrote, keys in their order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fastloader.errors import FormatError
from fastloader.formats.bad_samples import BadSample
from fastloader.formats.pack_state import ShardRecord
from fastloader.formats.parquet_pack import ParquetPackState
from fastloader.formats.tar_manifest import TarPackState, field_members

COMMON: dict[str, Any] = {
    "fingerprint": {"n": 3, "a": [1]},
    "created": 7,
    "position": 5,
    "shards": (ShardRecord("x-000000.tar", 2, 3),),
    "skipped": (BadSample(1, "k", "why"),),
    "complete": True,
    "classes": ["a"],
    "meta": {"m": 1},
}
SHARD = {"name": "x-000000.tar", "count": 2, "end_position": 3}
SKIPPED = {"position": 1, "key": "k", "reason": "why"}


def test_tar_state_bytes(tmp_path: Path) -> None:
    state = TarPackState(prefix="x", fields=field_members({"Caption": "text"}), **COMMON)
    expected = {"fingerprint": {"n": 3, "a": [1]}, "prefix": "x", "created": 7, "position": 5, "shards": [SHARD]}
    expected |= {"skipped": [SKIPPED], "complete": True, "classes": ["a"], "meta": {"m": 1}}
    expected |= {"fields": {"Caption": {"kind": "text", "extension": "caption.txt"}}}
    expected |= {"format": "fastloader-tar", "version": 2, "count": 2}
    assert state.to_json() == json.dumps(expected, indent=1).encode()
    (tmp_path / "state.json").write_bytes(state.to_json())
    assert TarPackState.read(tmp_path / "state.json") == state


def test_parquet_state_bytes(tmp_path: Path) -> None:
    state = ParquetPackState(fields={"c": "text"}, **COMMON)
    expected = {"fingerprint": {"n": 3, "a": [1]}, "created": 7, "fields": {"c": "text"}, "position": 5}
    expected |= {"shards": [SHARD], "skipped": [SKIPPED], "complete": True, "classes": ["a"], "meta": {"m": 1}}
    expected |= {"format": "fastloader-parquet", "version": 1, "count": 2}
    assert state.to_json() == json.dumps(expected, indent=1).encode()
    (tmp_path / "state.json").write_bytes(state.to_json())
    assert ParquetPackState.read(tmp_path / "state.json") == state
    with pytest.raises(FormatError, match="unreadable Parquet pack state .*expected 'fastloader-parquet' v1"):
        ParquetPackState.read(_with(tmp_path, version=2))
    with pytest.raises(FormatError, match="bad file name '../x'"):
        ParquetPackState.read(_with(tmp_path, shards=[{**SHARD, "name": "../x"}]))


def _with(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "changed.json"
    path.write_text(json.dumps({**json.loads((tmp_path / "state.json").read_bytes()), **changes}))
    return path
