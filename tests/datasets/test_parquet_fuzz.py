"""Fuzzing Parquet input: a fastloader pack and a foreign (Hugging Face style) file, mutated by hypothesis
(bytes anywhere, bytes of the footer's thrift metadata, bits of the column names the footer and the schema
metadata hold, the file cut short). Reading every row must give data or fastloader's FormatError (a
MissingField is one) naming the file, never another exception; ``verify`` must return a report, and a
report that says OK must mean every sample reads back exactly as packed. pytest-timeout bounds a hang."""

from __future__ import annotations

import io
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from fastloader.datasets.parquet import ParquetDataset, ParquetSource
from fastloader.errors import DecodeError, FormatError, MissingField
from fastloader.fields.source import read_fields
from fastloader.pack import verify
from fastloader.pack.parquet_sink import ParquetSink

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KINDS = {"caption": "text", "count": "int", "score": "float", "meta": "json", "vec": "array", "raw": "bytes"}
# What a mutation edits: any byte, a byte of the footer (thrift FileMetaData and its length), a bit of a
# column name where the footer holds it (the thrift schema, the JSON schema metadata), or the file's end.
edits = st.lists(
    st.tuples(st.sampled_from(["anywhere", "footer", "name", "cut"]), st.integers(0, 2**32), st.integers(0, 255)),
    min_size=1,
    max_size=4,
)


def png(i: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((4, 4, 3), i, np.uint8)).save(out, format="PNG")
    return out.getvalue()


def fields_of(i: int) -> dict[str, Any]:
    values = {
        "caption": f"caption {i} ☕",
        "count": i - 3,
        "score": i / 4,
        "meta": {"a": [i, None], "b": "é"},
        "vec": np.arange(i % 3, dtype=np.float32),
        "raw": bytes([i]) * 3,
    }
    if i % 3 == 1:
        del values["caption"]
    return values


def write_pack(dst: Path) -> Path:
    """8 rows in row groups of 4, every field kind a Parquet pack stores as a plain column."""
    sink = ParquetSink(dst, {"fuzz": 1}, shard_size=8, row_group_size=4, fields=KINDS)
    for i in range(8):
        sink.add(i, f"items/{i}", i % 3, png(i), fields_of(i))
    sink.finish(["a", "b", "c"], {})
    return dst / "part-000000.parquet"


def write_foreign(path: Path) -> Path:
    """As Hugging Face writes it: an Image struct, dictionary strings, a struct, a map, timestamps."""
    n = 6
    table = pa.table(
        {
            "image": pa.array(
                [{"bytes": png(i), "path": f"{i}.png"} for i in range(n)],
                pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
            ),
            "label": pa.array([i % 2 for i in range(n)], pa.int64()),
            "tags": pa.array([f"t{i % 2}" for i in range(n)]).dictionary_encode(),
            "meta": pa.array([{"w": i, "src": "x"} for i in range(n)]),
            "attrs": pa.array([[("k", i)] for i in range(n)], pa.map_(pa.string(), pa.int64())),
            "words": pa.array([["a", "b"][: i % 3] for i in range(n)], pa.list_(pa.string())),
            "when": pa.array([i * 86400 for i in range(n)], pa.timestamp("s")),
        }
    )
    pq.write_table(table, path, row_group_size=3)
    return path


def mutate(path: Path, changes: list[tuple[str, int, int]], names: list[str]) -> None:
    data = bytearray(path.read_bytes())
    footer_start = max(0, len(data) - 8 - int.from_bytes(data[-8:-4], "little"))
    footer = bytes(data[footer_start:])
    spots = [footer_start + at + k for name in names for at in _finds(footer, name.encode()) for k in range(len(name))]
    for region, seed, value in changes:
        if region == "cut":
            del data[seed % len(data) :]
            if not data:
                break
        elif region == "name" and spots:
            data[spots[seed % len(spots)] % len(data)] ^= 1 << (value % 8)  # one flipped bit in a name
        elif region == "footer":
            data[(footer_start + seed % (len(data) - footer_start or 1)) % len(data)] = value
        else:
            data[seed % len(data)] = value
    path.write_bytes(bytes(data))


def _finds(haystack: bytes, needle: bytes) -> list[int]:
    found, at = [], haystack.find(needle)
    while at >= 0:
        found.append(at)
        at = haystack.find(needle, at + 1)
    return found


def read_all(source: ParquetSource) -> list[tuple[Any, ...]]:
    """Every row's key, image, label and fields; a FormatError (a missing field is one) is the only error."""
    rows = []
    for i in range(len(source)):
        try:
            fields = read_fields(source, i)
        except MissingField:
            fields = None
        rows.append((source.key(i), source.read(i), source.label(i), fields))
    source.labels()
    return rows


def decode_all(dataset: ParquetDataset) -> None:
    """Every sample as the dataset gives it; an image whose bytes changed is the decoder's DecodeError."""
    for i in range(len(dataset)):
        try:
            dataset[i]
        except DecodeError:
            continue


def outcome(read: Callable[[], Any], path: Path) -> Any:
    """``read()``'s result, or None for a FormatError, which must name the file."""
    try:
        return read()
    except FormatError as error:
        assert str(path) in str(error) or path.name in str(error), error
        return None


def same_as_packed(rows: list[tuple[Any, ...]]) -> bool:
    for i, (key, image, label, fields) in enumerate(rows):
        expected = fields_of(i)
        if (key, image, label) != (f"items/{i}", png(i), i % 3) or fields is None or fields.keys() != expected.keys():
            return False
        for name, value in expected.items():
            got = fields[name]
            if isinstance(value, np.ndarray):
                if not (isinstance(got, np.ndarray) and got.dtype == value.dtype and np.array_equal(got, value)):
                    return False
            elif type(got) is not type(value) or got != value:
                return False
    return True


def test_the_unmodified_files_read_back_exactly(tmp_path: Path) -> None:
    """The baseline of the fuzz tests: without a mutation, every row comes back as written."""
    write_pack(tmp_path / "pack")
    assert verify(tmp_path / "pack").ok
    assert same_as_packed(read_all(ParquetSource(tmp_path / "pack")))
    source = ParquetSource(write_foreign(tmp_path / "foreign.parquet"))
    rows = read_all(source)
    assert [row[1] for row in rows] == [png(i) for i in range(6)] and rows[4][3]["tags"] == "t0"


@pytest.mark.timeout(120)
@FUZZ
@given(changes=edits)
def test_a_mutated_pack_reads_as_data_or_a_format_error_and_verify_reports(changes: list[tuple[str, int, int]]) -> None:
    folder = Path(tempfile.mkdtemp(prefix="fastloader-fuzz-"))
    try:
        part = write_pack(folder / "pack")
        mutate(part, changes, ["key", "image", "label", *KINDS])
        outcome(lambda: read_all(ParquetSource(folder / "pack")), part)
        report = verify(folder / "pack")  # a report, never an exception
        if report.ok:  # then every sample must be the one packed
            assert same_as_packed(read_all(ParquetSource(folder / "pack"))), changes
        else:
            assert all(str(folder / "pack") in problem for problem in report.problems), report.problems
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.timeout(120)
@FUZZ
@given(changes=edits)
def test_a_mutated_foreign_file_reads_as_data_or_a_format_error(changes: list[tuple[str, int, int]]) -> None:
    folder = Path(tempfile.mkdtemp(prefix="fastloader-fuzz-"))
    try:
        path = write_foreign(folder / "train.parquet")
        mutate(path, changes, ["image", "bytes", "path", "label", "tags", "meta", "attrs", "words", "when"])
        outcome(lambda: read_all(ParquetSource(path)), path)
        outcome(lambda: decode_all(ParquetDataset(path)), path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_flipped_bit_in_any_column_name_is_a_format_error_and_verify_reports_it(tmp_path: Path) -> None:
    """Each place the footer names a column (the thrift schema, the column chunks, the schema metadata's JSON),
    one bit flipped: the reader names the file, and verify returns a report that finds it, or the data read
    is still exact."""
    original = write_pack(tmp_path / "pack").read_bytes()
    footer_start = len(original) - 8 - int.from_bytes(original[-8:-4], "little")
    spots = sorted(
        footer_start + at
        for name in ["key", "image", "label", *KINDS]
        for at in _finds(original[footer_start:], name.encode())
    )
    assert len(spots) >= 2 * (3 + len(KINDS))  # every name at least in the schema and in the JSON
    found = 0
    for spot in spots:
        data = bytearray(original)
        data[spot] ^= 1
        part = tmp_path / "pack" / "part-000000.parquet"
        part.write_bytes(bytes(data))
        read = outcome(lambda: read_all(ParquetSource(tmp_path / "pack")), part)
        report = verify(tmp_path / "pack")
        if report.ok:
            assert read is not None and same_as_packed(read), spot
        else:
            found += 1
            assert all(str(tmp_path / "pack") in problem for problem in report.problems), report.problems
    # At least each name in the thrift schema: the file then lacks a column the pack describes. The copies
    # in the column chunks' metadata, and the schema metadata pyarrow also keeps in ARROW:schema, are not read.
    assert found >= 3 + len(KINDS), found
