"""``fastloader pack --format parquet``: every field kind kept exactly (folder, any source and Parquet
itself in), resume after an interrupt or a kill with 0 lost / 0 duplicated, and ``verify``."""

from __future__ import annotations

import io
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from fastloader.cli import main
from fastloader.datasets.parquet import ParquetDataset, ParquetSource
from fastloader.datasets.sources import detect_source_kind
from fastloader.errors import FormatError, MissingField
from fastloader.fields.source import read_fields
from fastloader.formats.parquet_pack import MANIFEST_NAME, PROGRESS_NAME, ParquetPackState
from fastloader.pack import pack, verify
from fastloader.pack.parquet_sink import ParquetSink
from tests.images import write_image_folder

REPO = Path(__file__).resolve().parents[2]
KINDS = {
    "caption": "text",
    "count": "int",
    "flags": "array",
    "grid": "array",
    "half": "array",
    "key": "text",  # named as a reserved column: stored as "_key", read back as "key"
    "label": "int",
    "mask": "image",
    "meta": "json",
    "raw": "bytes",
    "score": "float",
    "swapped": "array",
    "vec": "array",
    "wide": "array",
}


def png(i: int) -> bytes:
    pixels = np.random.default_rng(i).integers(0, 256, (8 + i % 3, 8, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def fields_of(i: int) -> dict[str, Any]:
    """Item i's fields: every kind, edge values included; some fields are missing from some items."""
    values: dict[str, Any] = {
        "caption": ["", "naïve café ☕", "line\nbreak\ttab\x00nul", "\u2028 🐟"][i % 4],
        "count": [0, -1, 2**63 - 1, -(2**63), 42][i % 5],
        "flags": np.array([True, False, i % 2 == 0]),
        "grid": np.arange(6, dtype=np.float64).reshape(2, 3) + i,  # 2-D: stored as .npy
        "half": np.array([0.5, i], dtype=np.float16),  # no float16 in Parquet: .npy
        "key": f"k{i}",
        "label": i * 10,
        "mask": png(i + 100),
        "meta": [{"a": [1, 2.5, None], "b": {"c": "é"}}, [1, "x"], "plain", None, 3.25, True][i % 6],
        "raw": b"" if i == 2 else bytes(range(256))[i:] + b"\x00",
        "score": [0.1, float("nan"), float("inf"), -0.0, 1e-300, 5e-324][i % 6],
        "swapped": np.array([1, -2, i], dtype=">i4"),  # big-endian: read back in native byte order
        "vec": (np.arange(i % 4, dtype=np.float32) * 0.1),  # length 0 to 3
        "wide": np.array([2**64 - 1, i], dtype=np.uint64),
    }
    if i % 6 == 5:
        del values["caption"]
    if i % 4 == 1:
        del values["vec"], values["meta"]
    return values


class AllKinds:
    """A source of PNG images whose items carry fields of every kind (picklable for reader processes)."""

    classes = ["a", "b", "c"]

    def __init__(self, count: int, interrupt_at: int | None = None) -> None:
        self.count, self.interrupt_at = count, interrupt_at

    def __len__(self) -> int:
        return self.count

    def read(self, index: int) -> bytes:
        if index == self.interrupt_at:
            self.interrupt_at = None  # once: the resumed run reads it
            raise KeyboardInterrupt
        return png(index)

    def label(self, index: int) -> int:
        return -1 if index % 5 == 4 else index % 3

    def key(self, index: int) -> str:
        return f"items/{index:03d}.png"

    def field_kinds(self) -> dict[str, str]:
        return dict(KINDS)

    def read_field(self, index: int, name: str) -> Any:
        values = fields_of(index)
        if name not in values:
            raise MissingField(f"{self.key(index)}: no field {name!r}")
        return values[name]


def same(a: Any, b: Any) -> bool:
    """Exactly equal: arrays in dtype (byte order made native, as fields are), shape and bytes; floats bit
    for bit (NaN, -0.0); types too."""
    if isinstance(b, np.ndarray) and not b.dtype.isnative:
        b = b.astype(b.dtype.newbyteorder("="))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.tobytes() == b.tobytes()
        )
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    return type(a) is type(b) and a == b


def check_items(dst: Path, count: int) -> ParquetSource:
    """Every item of AllKinds(count), once, in order: image, label, source key and fields exact."""
    source = ParquetSource(dst)
    assert len(source) == count and source.field_kinds() == KINDS and source.classes == AllKinds.classes
    reference = AllKinds(count)
    for i in range(count):
        assert (source.read(i), source.label(i), source.key(i)) == (png(i), reference.label(i), reference.key(i))
        got, expected = read_fields(source, i), fields_of(i)
        assert got.keys() == expected.keys(), i
        for name, value in expected.items():
            assert same(got[name], value), (i, name, got[name], value)
    return source


def test_every_field_kind_survives_any_source_to_parquet_to_parquet(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    summary = pack(AllKinds(23), first, format="parquet", shard_size=10, workers=0, progress=False)
    assert (summary.packed, summary.skipped) == (23, ())
    assert sorted(p.name for p in first.glob("*.parquet")) == [f"part-00000{n}.parquet" for n in range(3)]
    check_items(first, 23)
    assert detect_source_kind(str(first)) == "parquet"  # a pack directory is a source
    assert verify(first).ok
    pack(first, second, format="parquet", shard_size=7, workers=2, progress=False)  # through reader processes
    check_items(second, 23)
    assert verify(second).ok

    # What any Parquet reader sees: plain columns, the reserved names moved aside.
    table = pq.read_table(second)  # the directory: the manifest ("_...") is skipped as pandas and Spark do
    assert table.num_rows == 23
    schema = pq.read_schema(second / "part-000000.parquet")
    assert schema.names[:5] == ["key", "image", "label", "caption", "count"] and "_key" in schema.names
    types = {name: str(schema.field(name).type) for name in schema.names}
    assert types["vec"] == "list<element: float>" and types["flags"] == "list<element: bool>"
    assert types["wide"] == "list<element: uint64>" and types["grid"] == types["half"] == "binary"
    assert (types["meta"], types["_label"], types["score"]) == ("string", "int64", "double")
    assert table.column("key").to_pylist()[:2] == ["items/000.png", "items/001.png"]
    assert table.column("_label").to_pylist()[:3] == [0, 10, 20]
    chunk = pq.ParquetFile(second / "part-000000.parquet").metadata.row_group(0)
    codecs = {chunk.column(i).path_in_schema: chunk.column(i).compression for i in range(chunk.num_columns)}
    assert codecs["image"] == codecs["mask"] == "UNCOMPRESSED" and codecs["caption"] == "SNAPPY"
    assert codecs["vec.list.element"] == "SNAPPY"


def test_a_hugging_face_dataset_packs_to_parquet_and_through_tar_shards_with_its_fields(tmp_path: Path) -> None:
    from tests.datasets.test_parquet import write_hf_dataset

    rows = write_hf_dataset(tmp_path / "hf", [10, 7])
    original = ParquetSource(tmp_path / "hf")
    pack(tmp_path / "hf", tmp_path / "own", format="parquet", workers=0, progress=False)
    pack(tmp_path / "hf", tmp_path / "tar", format="tar", workers=0, progress=False)
    pack(tmp_path / "tar", tmp_path / "back", format="parquet", workers=0, progress=False)
    for dst in ("own", "back"):
        packed = ParquetSource(tmp_path / dst)
        assert packed.field_kinds() == original.field_kinds() and len(packed) == len(rows)
        assert packed.classes == original.classes == ["cat", "dog", "fish"]
        for i in range(len(rows)):
            assert (packed.read(i), packed.label(i)) == (rows[i]["image"]["bytes"], original.label(i))
            got, expected = read_fields(packed, i), read_fields(original, i)
            assert got.keys() == expected.keys() and all(same(got[n], v) for n, v in expected.items()), i
    second_file = tmp_path / "hf" / "train-00001-of-00002.parquet"
    assert ParquetSource(tmp_path / "own").key(11) == original.key(11) == f"{second_file}#1"


def test_a_folder_packs_to_parquet_with_classes_and_reads_as_a_dataset(tmp_path: Path) -> None:
    items = write_image_folder(tmp_path / "images", count=20)
    pack(tmp_path / "images", tmp_path / "out", format="parquet", shard_size=8, workers=2, progress=False)
    source = ParquetSource(tmp_path / "out")
    assert [(source.key(i), source.label(i), source.read(i)) for i in range(len(source))] == items
    assert source.field_kinds() == {} and source.shard_starts().tolist() == [0, 8, 16, 20]
    dataset = ParquetDataset(tmp_path / "out")
    assert dataset.classes == ["class_0", "class_1", "class_2"] and dataset[19][1] == items[19][1]
    report = verify(tmp_path / "out")
    assert report.ok and (report.format, report.expected, report.checked) == ("parquet", 20, 20)


def test_row_groups_are_cut_by_rows_or_bytes(tmp_path: Path) -> None:
    sink = ParquetSink(tmp_path / "rows", {"n": 1}, shard_size=10, row_group_size=3)
    for i in range(10):
        sink.add(i, f"k{i}", i, png(i))
    sink.finish(None, {})
    metadata = pq.read_metadata(tmp_path / "rows" / "part-000000.parquet")
    assert [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)] == [3, 3, 3, 1]
    sink = ParquetSink(tmp_path / "bytes", {"n": 1}, shard_size=10, row_group_bytes=2 * len(png(0)) - 1)
    for i in range(5):
        sink.add(i, f"k{i}", i, png(0))
    sink.finish(None, {})
    metadata = pq.read_metadata(tmp_path / "bytes" / "part-000000.parquet")
    assert [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)] == [2, 2, 1]


def test_an_empty_pack_is_an_empty_dataset_that_knows_its_fields(tmp_path: Path) -> None:
    sink = ParquetSink(tmp_path / "out", {"n": 0}, fields={"caption": "text"})
    sink.add_skipped(0, "k0", "unreadable")
    sink.finish(["a"], {})
    source = ParquetSource(tmp_path / "out")
    assert (len(source), source.field_kinds(), source.classes, source.shard_starts().tolist()) == (
        0,
        {"caption": "text"},
        ["a"],
        [0],
    )
    report = verify(tmp_path / "out")
    assert not report.ok and report.empty  # an empty pack is never vouched for


def test_an_array_changing_dtype_or_dimensions_starts_a_new_file(tmp_path: Path) -> None:
    values = [np.ones(2, np.float32)] * 3 + [np.ones(2, np.float64)] * 2 + [np.ones((2, 2), np.float64)]
    sink = ParquetSink(tmp_path / "out", {"n": 1}, shard_size=100, fields={"v": "array"})
    for i, value in enumerate(values):
        sink.add(i, f"k{i}", 0, png(i), {"v": value * i} if i != 1 else {})
    sink.finish(None, {})
    state = ParquetPackState.read(tmp_path / "out" / MANIFEST_NAME)
    assert [(s.count, s.end_position) for s in state.shards] == [(3, 3), (2, 5), (1, 6)]
    source = ParquetSource(tmp_path / "out")
    with pytest.raises(MissingField, match="k1: no field 'v'"):
        source.read_field(1, "v")
    for i, value in enumerate(values):
        if i != 1:
            assert same(source.read_field(i, "v"), value * i)


def test_an_interrupted_pack_resumes_with_every_item_exactly_once(tmp_path: Path) -> None:
    source, dst = AllKinds(23, interrupt_at=17), tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        pack(source, dst, format="parquet", shard_size=5, workers=0, progress=False)
    with pytest.raises(FormatError, match="incomplete pack: .*run it again to finish"):
        ParquetSource(dst)
    assert ParquetPackState.read(dst / PROGRESS_NAME).position == 15  # whole files only
    summary = pack(source, dst, format="parquet", shard_size=5, workers=0, progress=False)
    assert summary.resumed_from == 15 and summary.packed_now == 8
    check_items(dst, 23)
    again = pack(source, dst, format="parquet", shard_size=5, workers=0, progress=False)
    assert again.resumed_from == again.total and "already complete" in again.format_text()


def test_resume_discards_temporaries_and_unrecorded_files(tmp_path: Path) -> None:
    dst, fingerprint = tmp_path / "out", {"n": 9}
    first = ParquetSink(dst, fingerprint, shard_size=3)
    for i in range(5):  # one file recorded; rows 3 and 4 in an open one
        first.add(i, f"k{i}", i, png(i))
    first.add_skipped(5, "k5", "unreadable")
    assert first.resume_position() == 3 and list(dst.glob(".part-000001.parquet.*.tmp"))
    del first  # killed: no close, no finish
    (dst / "part-000001.parquet").write_bytes(b"renamed, never recorded")
    (dst / f".{PROGRESS_NAME}.abc123.tmp").write_bytes(b"half a progress file")
    second = ParquetSink(dst, fingerprint, shard_size=3)
    assert second.resume_position() == 3 and second.skipped() == []
    assert sorted(p.name for p in dst.iterdir()) == [PROGRESS_NAME, "part-000000.parquet"]
    for i in range(3, 9):
        if i == 5:
            second.add_skipped(i, f"k{i}", "unreadable")
        else:
            second.add(i, f"k{i}", i, png(i))
    second.finish(None, {})
    source = ParquetSource(dst)
    assert [source.key(i) for i in range(len(source))] == ["k0", "k1", "k2", "k3", "k4", "k6", "k7", "k8"]
    assert [s.position for s in ParquetPackState.read(dst / MANIFEST_NAME).skipped] == [5]


def test_killed_process_resumes_with_nothing_lost_or_duplicated(tmp_path: Path) -> None:
    """A real SIGKILL at an arbitrary point of a running pack."""
    dst, count = tmp_path / "out", 40
    child = f"""
import numpy as np
from fastloader.pack.parquet_sink import ParquetSink
from tests.pack.test_parquet_sink import png
sink = ParquetSink({str(dst)!r}, {{"n": {count}}}, shard_size=3, row_group_size=2, fields={{"v": "array"}})
for position in range(sink.resume_position(), {count}):
    sink.add(position, f"k{{position}}", position, png(position), {{"v": np.arange(position)}})
    print(position, flush=True)
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, env=env, text=True, cwd=REPO)
    assert process.stdout is not None
    for line in process.stdout:
        if int(line) >= 20:
            break
    process.send_signal(signal.SIGKILL)
    process.wait()
    sink = ParquetSink(dst, {"n": count}, shard_size=3, row_group_size=2, fields={"v": "array"})
    resume = sink.resume_position()
    assert 18 <= resume <= count and resume % 3 == 0  # whole files only
    for position in range(resume, count):
        sink.add(position, f"k{position}", position, png(position), {"v": np.arange(position)})
    sink.finish(None, {})
    source = ParquetSource(dst)
    assert [source.key(i) for i in range(len(source))] == [f"k{i}" for i in range(count)]
    assert source.labels().tolist() == list(range(count))
    assert all(same(source.read_field(i, "v"), np.arange(i)) and source.read(i) == png(i) for i in range(count))


def test_destinations_holding_another_pack_are_refused(tmp_path: Path) -> None:
    dst = tmp_path / "out"
    sink = ParquetSink(dst, {"n": 1}, shard_size=1)
    sink.add(0, "k0", 0, png(0))
    sink.close()
    with pytest.raises(FormatError, match=f"{dst}: holds a different pack"):
        ParquetSink(dst, {"n": 2})
    with pytest.raises(FormatError, match=f"{dst}: holds a different pack"):
        ParquetSink(dst, {"n": 1}, fields={"caption": "text"})
    (tmp_path / "tar").mkdir()
    (tmp_path / "tar" / "fastloader-tar.json").write_text("{}")
    with pytest.raises(FormatError, match="holds a tar pack"):
        ParquetSink(tmp_path / "tar", {"n": 1})
    (tmp_path / "foreign").mkdir()
    pq.write_table(pa.table({"image": [png(0)]}), tmp_path / "foreign" / "part-000000.parquet")
    with pytest.raises(FormatError, match="refusing to overwrite"):
        ParquetSink(tmp_path / "foreign", {"n": 1})
    (tmp_path / "file").write_text("x")
    with pytest.raises(FormatError, match="exists and is not a directory"):
        ParquetSink(tmp_path / "file", {"n": 1})
    sink = ParquetSink(tmp_path / "bad", {"n": 1}, fields={"n": "int"})
    with pytest.raises(ValueError, match="k0: field 'x' is not one of this pack's fields"):
        sink.add(0, "k0", 0, png(0), {"x": 1})
    with pytest.raises(FormatError, match="k0: field 'n': a str is not a valid int value"):
        sink.add(0, "k0", 0, png(0), {"n": "1"})
    sink.add(0, "k0", 0, png(0), {"n": 1})  # nothing was written by the refused calls
    with pytest.raises(ValueError, match="positions must strictly increase"):
        sink.add(0, "k0", 0, png(0))


def test_verify_names_a_damaged_row_and_a_damaged_field(tmp_path: Path) -> None:
    dst = tmp_path / "out"
    pack(AllKinds(12), dst, format="parquet", shard_size=5, workers=0, progress=False)
    part = dst / "part-000001.parquet"
    # A flipped byte inside the image of item 7 (row 2 of the second file): the page checksum fails.
    blob = bytearray(part.read_bytes())
    at = blob.find(png(7))
    assert at >= 0
    blob[at + len(png(7)) // 2] ^= 0xFF
    part.write_bytes(blob)
    report = verify(dst)
    assert not report.ok and 7 in report.bad_records and report.checked == 12
    expected = f"{part}#2 (items/007.png): cannot read column 'image' of row group 0 in {part}"
    assert any(p.startswith(expected) and "checksum" in p for p in report.problems), report.problems
    # A JSON field that no longer parses: rewritten by another tool, the schema metadata kept.
    pack(AllKinds(12), tmp_path / "again", format="parquet", shard_size=5, workers=0, progress=False)
    part = tmp_path / "again" / "part-000000.parquet"
    table = pq.read_table(part)
    meta = table.column("meta").to_pylist()
    meta[3] = '{"broken'
    table = table.set_column(table.schema.get_field_index("meta"), "meta", pa.array(meta, pa.string()))
    pq.write_table(table, part)
    report = verify(tmp_path / "again")
    assert report.bad_records == (3,) and report.problems[0].startswith(f"{part}: not the bytes that were packed")
    assert report.problems[1].startswith(f"{part}#3 (items/003.png): field 'meta': not a valid json value")
    # A file that lost rows: the manifest's count no longer matches.
    pq.write_table(table.slice(0, 4), part)
    report = verify(tmp_path / "again")
    assert report.problems[1:] == (f"{part}: its footer counts 4 samples, the manifest records 5",)


def test_pack_and_verify_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_image_folder(tmp_path / "images", count=9)
    dst = tmp_path / "out"
    args = ["pack", str(tmp_path / "images"), str(dst), "--format", "parquet", "--shard-size", "4", "--workers", "0"]
    assert main([*args, "--no-progress"]) == 0
    assert "packed 9 of 9 images" in capsys.readouterr().out
    assert main(["verify", str(dst), "--no-progress"]) == 0
    assert f"OK: 9 records verified in {dst} (parquet)" in capsys.readouterr().out
    assert detect_source_kind(str(dst / "part-*.parquet")) == "parquet"
    assert main(["pack", str(dst / "part-*.parquet"), str(tmp_path / "again.lmdb"), "--no-progress"]) == 0
