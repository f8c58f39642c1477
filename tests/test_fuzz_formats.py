"""Fuzzing the format readers: a valid file, mutated by hypothesis (bytes overwritten, the file cut
short), is opened and read in full; only fastloader's documented errors may escape (FormatError,
DecodeError) — never another exception, a crash or a hang (pytest-timeout bounds each test)."""

from __future__ import annotations

import io
import shutil
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
        try:
            index = read_index(path, "fuzz", 1)
            for array in index.arrays.values():
                np.asarray(array).sum()
        except ALLOWED:
            pass
    finally:
        shutil.rmtree(folder, ignore_errors=True)
