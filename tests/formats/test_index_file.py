"""The memory-mapped index file: round trip, and clear errors for foreign, older or truncated files."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import numpy as np
import pytest

from fastloader.errors import FormatError
from fastloader.formats.index_file import IndexFile, pack_strings, read_index, string_at, write_index


def test_round_trip_is_memory_mapped(tmp_path: Path) -> None:
    blob, offsets = pack_strings(["a/b.jpg", "ümlaut/ç.jpg", "", "x" * 1000])
    labels = np.arange(4, dtype=np.int64)
    path = tmp_path / "i.idx"
    write_index(
        path,
        "test",
        3,
        {"root": "/data", "classes": ["a", "b"]},
        {"blob": blob, "offsets": offsets, "labels": labels, "empty": np.zeros(0, np.int32)},
    )
    index = read_index(path, "test", 3)
    assert index.meta == {"root": "/data", "classes": ["a", "b"]}
    assert isinstance(index.arrays["labels"], np.memmap) and not index.arrays["labels"].flags.writeable
    assert index.arrays["labels"].tolist() == [0, 1, 2, 3] and index.arrays["empty"].shape == (0,)
    assert [string_at(index.arrays["blob"], index.arrays["offsets"], i) for i in range(4)] == [
        "a/b.jpg",
        "ümlaut/ç.jpg",
        "",
        "x" * 1000,
    ]
    assert not list(tmp_path.glob("*.tmp")), "no temporary file left behind"


def test_surrogate_escaped_file_names_survive() -> None:
    name = b"caf\xe9.jpg".decode("utf-8", "surrogateescape")  # a Latin-1 name on a UTF-8 system
    blob, offsets = pack_strings([name])
    assert string_at(blob, offsets, 0) == name


def test_wrong_kind_or_version_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "i.idx"
    write_index(path, "folder", 1, {}, {"a": np.zeros(3)})
    with pytest.raises(FormatError, match="expected 'tar' v1"):
        read_index(path, "tar", 1)
    with pytest.raises(FormatError, match="version 1"):
        read_index(path, "folder", 2)


def test_foreign_and_truncated_files_are_format_errors(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.idx"
    foreign.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(FormatError, match="bad magic"):
        read_index(foreign, "folder", 1)
    path = tmp_path / "i.idx"
    write_index(path, "folder", 1, {}, {"a": np.arange(1000)})
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(FormatError, match="truncated"):
        read_index(path, "folder", 1)


def test_cached_index_is_built_once_by_processes_starting_together(tmp_path: Path) -> None:
    """Four ranks starting together: the first builds under the lock, the others wait and read it."""
    import threading

    from fastloader.formats.index_file import cached_index

    path, builds = tmp_path / "x.idx", []

    def current() -> IndexFile | None:
        return read_index(path, "race", 1) if path.exists() else None

    def build() -> IndexFile:
        builds.append(threading.get_ident())
        time.sleep(0.2)  # a slow scan: the others arrive meanwhile
        write_index(path, "race", 1, {}, {"a": np.arange(5)})
        return read_index(path, "race", 1)

    results: list[IndexFile] = []
    threads = [threading.Thread(target=lambda: results.append(cached_index(path, current, build))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1 and len(results) == 4
    assert all(np.array_equal(index.arrays["a"], np.arange(5)) for index in results)


def _with_header(path: Path, header: object, size: int = 4096) -> Path:
    """An index file whose header is ``header`` (any JSON), padded with zeros to ``size`` bytes."""
    import json
    import struct

    from fastloader.formats.index_file import MAGIC

    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    data = MAGIC + struct.pack("<Q", len(text)) + text
    path.write_bytes(data + b"\x00" * max(0, size - len(data)))
    return path


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"dtype": "<i8", "shape": [2**32, 2**32], "offset": 128}, "runs past the end"),  # 2**64 elements: int64 wraps
        ({"dtype": "<i8", "shape": [2**62], "offset": 128}, "runs past the end"),
        ({"dtype": "<i8", "shape": [4], "offset": -64}, "is not a count"),
        ({"dtype": "<i8", "shape": [-4], "offset": 128}, "is not a count"),
        ({"dtype": "<i8", "shape": [True], "offset": 128}, "is not a count"),
        ({"dtype": "<i8", "shape": [1.5], "offset": 128}, "is not a count"),
        ({"dtype": "|O", "shape": [4], "offset": 128}, "not a plain numeric type"),
        ({"dtype": "|V8", "shape": [4], "offset": 128}, "not a plain numeric type"),
        ({"dtype": [["a", "<i4"]], "shape": [4], "offset": 128}, "malformed dtype or shape"),
        ({"dtype": "<i8", "shape": 4, "offset": 128}, "malformed dtype or shape"),
        ({"dtype": "no such type", "shape": [4], "offset": 128}, "malformed index header"),
    ],
)
def test_every_header_value_is_checked_before_it_sizes_anything(tmp_path: Path, spec: dict, message: str) -> None:
    path = _with_header(tmp_path / "i.idx", {"kind": "k", "version": 1, "meta": {}, "arrays": {"a": spec}})
    with pytest.raises(FormatError, match=message):
        read_index(path, "k", 1)


def test_a_header_nested_deeper_than_the_limit_is_a_format_error(tmp_path: Path) -> None:
    path = _with_header(tmp_path / "i.idx", b"[" * 100_000 + b"]" * 100_000, size=0)
    with pytest.raises(FormatError, match="index header: JSON nested deeper than 128 levels"):
        read_index(path, "k", 1)
