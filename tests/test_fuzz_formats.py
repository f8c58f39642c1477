"""Fuzzing the format readers: a valid file, mutated by hypothesis (bytes overwritten, the file cut
short), is opened and read in full; only fastloader's documented errors may escape (FormatError,
DecodeError) — never another exception, a crash or a hang (pytest-timeout bounds each test)."""

from __future__ import annotations

import io
import os
import shutil
import struct
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from fastloader.datasets.base import Source
from fastloader.errors import DecodeError, FormatError
from fastloader.formats.index_file import read_index, write_index
from fastloader.formats.protobuf import bytes_feature, encode_example, int64_feature, parse_example
from fastloader.formats.recordio import RecordIOWriter, single_label
from fastloader.formats.recordio import pack as pack_record
from fastloader.formats.tfrecord import TFRecordWriter

ALLOWED = (FormatError, DecodeError)
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def small_jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (12, 16, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=80)
    return out.getvalue()


def write_recordio(folder: Path) -> Path:
    with RecordIOWriter(folder / "d.rec", folder / "d.idx") as writer:
        for i in range(4):
            writer.write(i, pack_record(single_label(i, i), small_jpeg(i)))
    return folder / "d.rec"


def write_tfrecord(folder: Path) -> Path:
    with TFRecordWriter(folder / "d.tfrecord") as writer:
        for i in range(4):
            writer.write(
                encode_example({"image/encoded": bytes_feature(small_jpeg(i)), "image/class/label": int64_feature(i)})
            )
    return folder / "d.tfrecord"


def write_tar(folder: Path) -> Path:
    with tarfile.open(folder / "d.tar", "w") as tar:
        for i in range(4):
            for name, data in ((f"s{i}.jpg", small_jpeg(i)), (f"s{i}.cls", str(i).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return folder / "d.tar"


def open_recordio(path: Path) -> Source:
    from fastloader.datasets.recordio import RecordIOSource

    return RecordIOSource(path, path.with_suffix(".idx"))


def open_tfrecord(path: Path) -> Source:
    from fastloader.datasets.tfrecord import TFRecordSource

    return TFRecordSource(str(path))


def open_tar(path: Path) -> Source:
    from fastloader.datasets.tar import TarShardSource

    return TarShardSource(str(path))


mutations = st.lists(st.tuples(st.integers(min_value=0, max_value=10**6), st.integers(0, 255)), max_size=8)
cuts = st.one_of(st.none(), st.integers(min_value=0, max_value=10**6))


def mutate(path: Path, changes: list[tuple[int, int]], cut: int | None) -> None:
    data = bytearray(path.read_bytes())
    for position, value in changes:
        data[position % len(data)] = value
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    path.write_bytes(bytes(data))


def read_everything(source: Source) -> None:
    for i in range(len(source)):
        source.key(i)
        source.read(i)
        source.label(i)


def fuzz(
    write: Callable[[Path], Path],
    open_source: Callable[[Path], Source],
    changes: list[tuple[int, int]],
    cut: int | None,
) -> None:
    folder = Path(tempfile.mkdtemp(prefix="fastloader-fuzz-"))  # fresh: no index left from another example
    try:
        path = write(folder)
        mutate(path, changes, cut)
        if not changes and cut is None:
            read_everything(open_source(path))  # an unmodified file must read: no error allowed
            return
        try:
            read_everything(open_source(path))
        except ALLOWED:
            pass
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize(
    ("write", "open_source"), [(write_recordio, open_recordio), (write_tfrecord, open_tfrecord), (write_tar, open_tar)]
)
def test_every_reader_reads_its_unmodified_file_exactly(
    write: Callable[[Path], Path], open_source: Callable[[Path], Source], tmp_path: Path
) -> None:
    """The baseline of the fuzz tests below: without a mutation, every record comes back as written."""
    source = open_source(write(tmp_path))
    assert len(source) == 4
    assert [source.read(i) for i in range(4)] == [small_jpeg(i) for i in range(4)]
    assert [int(source.label(i)) for i in range(4)] == [0, 1, 2, 3]


@FUZZ
@given(changes=mutations, cut=cuts)
def test_recordio_reader(changes: list[tuple[int, int]], cut: int | None) -> None:
    fuzz(write_recordio, open_recordio, changes, cut)


@FUZZ
@given(changes=mutations, cut=cuts)
def test_tfrecord_reader(changes: list[tuple[int, int]], cut: int | None) -> None:
    fuzz(write_tfrecord, open_tfrecord, changes, cut)


@FUZZ
@given(changes=mutations, cut=cuts)
def test_tar_reader(changes: list[tuple[int, int]], cut: int | None) -> None:
    fuzz(write_tar, open_tar, changes, cut)


@FUZZ
@given(data=st.binary(max_size=300))
def test_example_parser(data: bytes) -> None:
    try:
        parse_example(data)
    except ALLOWED:
        pass


def read_fuzz_index(path: Path) -> None:
    """Read a (changed) fuzz index and every value of its arrays: exact data or one of the ALLOWED errors."""
    try:
        index = read_index(path, "fuzz", 1)
        for array in index.arrays.values():
            np.asarray(array).sum()
    except ALLOWED:
        pass


@FUZZ
@given(changes=mutations, cut=cuts)
def test_index_file_reader(changes: list[tuple[int, int]], cut: int | None) -> None:
    folder = Path(tempfile.mkdtemp(prefix="fastloader-fuzz-"))
    try:
        path = folder / "x.idx"
        write_index(path, "fuzz", 1, {"n": 3}, {"a": np.arange(40), "b": np.zeros(7, np.uint8)})
        if not changes and cut is None:  # the baseline: an unmodified index reads back exactly
            assert np.array_equal(read_index(path, "fuzz", 1).arrays["a"], np.arange(40))
        mutate(path, changes, cut)
        read_fuzz_index(path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --- index VALUES: a lying index (count, offset, size, code, dtype) beside an intact data file -----------
# Bytes flipped at random rarely land on a value that still parses; these mutations change one value of a
# valid index (an array element, an array's length, or a meta entry) and write it back as a valid index
# file, so that every check of the values themselves is exercised.

INT_VALUES = st.sampled_from([-(2**63), -(2**62), -1, 0, 1, 2, 3, 5, 511, 512, 4096, 10**6, 2**31, 2**62, 2**63 - 1])
META_VALUES = st.sampled_from([None, -1, 0, 1, 10**6, 2**62, 10**30, 1.5, True, "x", [], ["jpg"], [7], {}])
value_mutations = st.tuples(
    st.sampled_from(["element", "truncate", "meta"]),
    st.integers(0, 1000),
    st.integers(0, 10**6),
    INT_VALUES,
    META_VALUES,
)


def mutate_index_values(path: Path, kind: str, version: int, mutation: tuple[str, int, int, int, object]) -> None:
    """Rewrite the index at ``path`` with one value changed (see ``value_mutations``)."""
    what, which, at, number, meta_value = mutation
    index = read_index(path, kind, version)
    arrays = {name: np.array(array) for name, array in index.arrays.items()}
    meta = dict(index.meta)
    names = sorted(name for name, array in arrays.items() if len(array))
    if what == "meta" or not names:
        key = sorted(meta)[which % len(meta)]
        meta[key] = meta_value
    else:
        name = names[which % len(names)]
        if what == "truncate":
            arrays[name] = arrays[name][: at % len(arrays[name])]
        else:
            info = np.iinfo(arrays[name].dtype) if arrays[name].dtype.kind in "iu" else None
            value = number if info is None else min(max(number, info.min), info.max)
            arrays[name].reshape(-1)[at % arrays[name].size] = value
    write_index(path, kind, version, meta, arrays)


def read_all(source: Source) -> list[tuple[str, bytes, int, dict[str, object]]]:
    """Every key, image, label and field of ``source`` (only fastloader's errors may escape)."""
    from fastloader.fields.source import field_kinds, read_fields

    kinds = field_kinds(source)
    return [
        (source.key(i), source.read(i), int(source.label(i)), read_fields(source, i, kinds)) for i in range(len(source))
    ]


def write_tar_with_fields(folder: Path) -> Path:
    with tarfile.open(folder / "d.tar", "w") as tar:
        for i in range(4):
            members = [
                (f"s{i}.jpg", small_jpeg(i)),
                (f"s{i}.cls", str(i).encode()),
                (f"s{i}.txt", f"caption {i}".encode()),
            ]
            members += [(f"s{i}.json", b'{"n": %d}' % i)] if i % 2 else []
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return folder / "d.tar"


def fuzz_index_values(
    write: Callable[[Path], Path],
    open_source: Callable[[Path], Source],
    index_of: Callable[[Path], tuple[Path, str, int]],
    mutation: tuple[str, int, int, int, object],
) -> None:
    """Write the data, index it, change one value of its index, open and read it all again: correct data
    (the index was found unusable and rebuilt, or the change is harmless) or a FormatError / DecodeError."""
    folder = Path(tempfile.mkdtemp(prefix="fastloader-fuzz-"))
    cache = os.environ.get("FASTLOADER_CACHE")
    os.environ["FASTLOADER_CACHE"] = str(folder / "cache")  # fresh per example: no catalog of another's
    try:
        path = write(folder)
        expected = read_all(open_source(path))
        index_path, kind, version = index_of(path)
        mutate_index_values(index_path, kind, version, mutation)
        lying = index_path.read_bytes()
        shutil.rmtree(folder / "cache", ignore_errors=True)  # derived from the index: built again from it
        try:
            got = read_all(open_source(path))
        except ALLOWED:
            return
        if index_path.read_bytes() != lying:  # found unusable and rebuilt from the data: exactly the data
            assert repr(got) == repr(expected)
    finally:
        if cache is None:
            os.environ.pop("FASTLOADER_CACHE", None)
        else:
            os.environ["FASTLOADER_CACHE"] = cache
        shutil.rmtree(folder, ignore_errors=True)


def tar_index(path: Path) -> tuple[Path, str, int]:
    from fastloader.formats.tar_shards import INDEX_KIND, INDEX_VERSION, default_index_path

    return default_index_path(path), INDEX_KIND, INDEX_VERSION


def tfrecord_index(path: Path) -> tuple[Path, str, int]:
    from fastloader.formats.tfrecord import INDEX_KIND, INDEX_VERSION, default_index_path

    return Path(default_index_path(str(path))), INDEX_KIND, INDEX_VERSION


def recordio_index(path: Path) -> tuple[Path, str, int]:
    from fastloader.datasets.recordio import INDEX_KIND, INDEX_SUFFIX, INDEX_VERSION
    from fastloader.storage import sidecar_path

    return sidecar_path(path, INDEX_SUFFIX), INDEX_KIND, INDEX_VERSION


@FUZZ
@given(mutation=value_mutations)
def test_tar_shard_index_values(mutation: tuple[str, int, int, int, object]) -> None:
    fuzz_index_values(write_tar_with_fields, open_tar, tar_index, mutation)


@FUZZ
@given(mutation=value_mutations)
def test_tfrecord_index_values(mutation: tuple[str, int, int, int, object]) -> None:
    fuzz_index_values(write_tfrecord, open_tfrecord, tfrecord_index, mutation)


@FUZZ
@given(mutation=value_mutations)
def test_recordio_index_values(mutation: tuple[str, int, int, int, object]) -> None:
    fuzz_index_values(write_recordio, open_recordio, recordio_index, mutation)


@FUZZ
@given(
    name=st.sampled_from(["a", "b"]),
    field=st.sampled_from(["dtype", "shape", "offset"]),
    value=st.sampled_from(
        [
            -1,
            0,
            2**62,
            2**64,
            True,
            1.5,
            None,
            "x",
            "|O",
            "|V8",
            "<M8[s]",
            "S4",
            "(2,)i4",
            [2**32, 2**32],
            [-1],
            [[1]],
            {},
        ]
    ),
)
def test_index_file_header_values(name: str, field: str, value: object) -> None:
    """The array table of an index header, one value changed: a FormatError or arrays that read."""
    import json
    import struct

    from fastloader.formats.index_file import MAGIC

    folder = Path(tempfile.mkdtemp(prefix="fastloader-fuzz-"))
    try:
        path = folder / "x.idx"
        write_index(path, "fuzz", 1, {"n": 3}, {"a": np.arange(40), "b": np.zeros(7, np.uint8)})
        data = path.read_bytes()
        (length,) = struct.unpack_from("<Q", data, len(MAGIC))
        header = json.loads(data[len(MAGIC) + 8 : len(MAGIC) + 8 + length])
        header["arrays"][name][field] = value
        text = json.dumps(header).encode()
        path.write_bytes(MAGIC + struct.pack("<Q", len(text)) + text + data[len(MAGIC) + 8 + length :])
        read_fuzz_index(path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --- LMDB record headers and field tables: one value of one record changed ----------------------------

HEADER_FIELDS = [("B", 3), ("B", 4), ("q", 8), ("I", 16)]  # version, format code, label, image length
record_mutations = st.tuples(
    st.integers(0, 3),  # the record
    st.sampled_from(["header", "table", "cut", "extend"]),
    st.integers(0, 1000),  # which header field / table entry, or how many bytes
    INT_VALUES,
    st.booleans(),  # the checksum recomputed: only the values' own checks can find the change
)


@pytest.fixture(scope="module")
def lmdb_with_fields(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fastloader.pack import pack
    from tests.field_items import FieldItems

    path = tmp_path_factory.mktemp("fuzz-lmdb") / "fields.lmdb"
    pack(FieldItems(4), path, workers=0, progress=False)
    return path


def mutate_record(value: bytes, mutation: tuple[int, str, int, int, bool]) -> bytes:
    from fastloader.formats import lmdb_records as records

    _, what, which, number, checksum = mutation
    data = bytearray(value)
    if what == "cut":
        data = data[: len(data) - 1 - which % len(data)]
    elif what == "extend":
        data += bytes(range(256))[: 1 + which % 64]
    else:
        if what == "header":
            code, at = HEADER_FIELDS[which % len(HEADER_FIELDS)]
        else:
            header = records.parse_header(value, "r")
            table = records.HEADER.size + header.length
            (count,) = struct.unpack_from("<I", value, table)
            code, at = "I", table + 4 * (which % (2 * count + 1))
        info = struct.calcsize(code) * 8
        low, high = (-(2 ** (info - 1)), 2 ** (info - 1) - 1) if code == "q" else (0, 2**info - 1)
        struct.pack_into("<" + code, data, at, min(max(number, low), high))
    if checksum and len(data) >= records.HEADER.size:
        data[20:24] = records.record_checksum(bytes(data)).to_bytes(4, "little")
    return bytes(data)


@FUZZ
@given(mutation=record_mutations)
def test_lmdb_record_header_and_field_table_values(
    lmdb_with_fields: Path, mutation: tuple[int, str, int, int, bool]
) -> None:
    """One record's header value, field table entry or length changed: readers raise FormatError /
    DecodeError or read; ``verify`` reports the record (a checksum that no longer matches, or a value
    that does not hold) and never raises."""
    import lmdb

    from fastloader.datasets.lmdb import LMDBSource
    from fastloader.formats import lmdb_records as records
    from fastloader.pack.verify import verify

    # Copies are kept until the module ends: an LMDB is shared per process by its inode, which a deleted
    # copy would hand to the next one.
    copy = Path(tempfile.mkdtemp(prefix="fastloader-fuzz-lmdb-", dir=lmdb_with_fields.parent)) / "x.lmdb"
    shutil.copytree(lmdb_with_fields, copy)
    number = mutation[0]
    with lmdb.open(str(copy)) as env, env.begin(write=True) as txn:
        value = bytes(txn.get(records.record_key(number)))
        changed = mutate_record(value, mutation)
        txn.put(records.record_key(number), changed)
    for checked in (False, True):
        try:
            read_all(LMDBSource(copy, verify_checksums=checked))
        except ALLOWED:
            pass
    report = verify(copy)
    if changed != value and not mutation[4]:
        assert number in report.bad_records, report.problems


def write_folder(folder: Path) -> Path:
    for i in range(4):
        (folder / "images" / f"class_{i % 2}").mkdir(parents=True, exist_ok=True)
        (folder / "images" / f"class_{i % 2}" / f"{i}.jpg").write_bytes(small_jpeg(i))
    for directory in (folder / "images", folder / "images" / "class_0", folder / "images" / "class_1"):
        os.utime(directory, ns=(10**18, 10**18))  # long before the scan: its index is trusted, not rebuilt
    return folder / "images"


def open_folder(path: Path) -> Source:
    from fastloader.datasets.folder import FolderSource

    return FolderSource(path)


def folder_index(path: Path) -> tuple[Path, str, int]:
    from fastloader.datasets.folder_index import FOLDER_KIND, FORMAT_VERSION, default_index_path

    return Path(default_index_path(str(path))), FOLDER_KIND, FORMAT_VERSION


@FUZZ
@given(mutation=value_mutations)
def test_folder_index_values(mutation: tuple[str, int, int, int, object]) -> None:
    """As above; a key offset that still slices the key blob (a well-formed lie) may name a file that is not
    there, or a directory: the OSError then names the path and the index (nothing else can tell)."""
    try:
        fuzz_index_values(write_folder, open_folder, folder_index, mutation)
    except OSError as error:
        assert "fastloader-index" in str(error), error
