"""Records and indexes edited so that their own checks pass: an LMDB record replaced with its CRC32C
recomputed (caught only by ``verify --expect-digest``), sidecar indexes whose offsets were swapped, dropped or
repeated while their metadata stays true (rebuilt from the file, with a warning naming it)."""

from __future__ import annotations

import io
import shutil
from contextlib import redirect_stdout
from pathlib import Path

import lmdb
import pytest

from fastloader.cli import main
from fastloader.datasets.recordio import RecordIOSource
from fastloader.datasets.tfrecord import TFRecordSource
from fastloader.errors import FormatError
from fastloader.formats import lmdb_records as records
from fastloader.formats import recordio
from fastloader.formats.index_file import read_index, write_index
from fastloader.formats.tfrecord import INDEX_KIND, INDEX_VERSION, default_index_path
from fastloader.pack.verify import verify
from tests.datasets.test_recordio import images as rec_images
from tests.datasets.test_recordio import write_rec as write_recordio
from tests.datasets.test_tfrecord import imagenet_example, write_shard
from tests.images import image_bytes, write_image_folder


@pytest.fixture(scope="module")
def lmdb_pack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """An LMDB pack made by the command, with the content digest it printed (the one a user pins)."""
    root = tmp_path_factory.mktemp("digest")
    write_image_folder(root / "images", count=12)
    capture = io.StringIO()
    with redirect_stdout(capture):
        assert main(["pack", str(root / "images"), str(root / "lmdb"), "--format", "lmdb"]) == 0
    (pinned,) = [line.split()[-1] for line in capture.getvalue().splitlines() if "content digest:" in line]
    return root / "lmdb", pinned


def test_an_lmdb_record_replaced_with_its_crc_recomputed_fails_only_against_the_pinned_digest(
    lmdb_pack: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dst, pinned = lmdb_pack
    copy = tmp_path / "lmdb"
    shutil.copytree(dst, copy)
    with lmdb.open(str(copy)) as env, env.begin(write=True) as txn:
        label = records.parse_header(txn.get(records.record_key(5)), "record").label
        txn.put(records.record_key(5), records.encode_record(label, image_bytes(5, seed=7)))  # a valid CRC32C
    assert verify(copy).ok  # corruption, not tampering: plain verify cannot tell
    assert main(["verify", str(copy), "--no-progress", "--expect-digest", pinned]) == 1
    out = capsys.readouterr().out
    assert f"{copy}: record 5 (key 'class_1/0004.jpg') is not the one the pinned digest vouches for" in out


@pytest.mark.parametrize("tamper", ["swapped", "dropped", "repeated"])
def test_an_index_shipped_with_records_swapped_dropped_or_repeated_is_rebuilt(tmp_path: Path, tamper: str) -> None:
    """The sidecar index came with the data, its metadata true (the file's size and mtime, kept by an
    archive), its arrays not: records of one length, so each tampered offset still lands on a record that
    reads with valid CRCs. It is rebuilt, with a warning naming it, and every item is its own record."""
    path = tmp_path / "train.tfrecord"
    examples = [imagenet_example(b"%04d" % i, i) for i in range(6)]  # one length each
    write_shard(path, examples)
    source = TFRecordSource(path)
    index = read_index(default_index_path(path), INDEX_KIND, INDEX_VERSION)
    offsets, lengths = index.arrays["offsets"].copy(), index.arrays["lengths"].copy()
    if tamper == "swapped":
        offsets[[0, 1]] = offsets[[1, 0]]
    elif tamper == "dropped":
        offsets, lengths = offsets[1:], lengths[1:]
    else:
        offsets[5] = offsets[4]
    meta = {**index.meta, "count": len(offsets)}
    del source, index
    write_index(default_index_path(path), INDEX_KIND, INDEX_VERSION, meta, {"offsets": offsets, "lengths": lengths})
    with pytest.warns(UserWarning, match=rf"rebuilding {default_index_path(path)}: its offsets are not those"):
        reopened = TFRecordSource(path)
    assert [reopened.example(i) for i in range(len(reopened))] == [(b"%04d" % i, i) for i in range(6)]


def _swap_lines(idx: str, first: int, second: int) -> None:
    """Swap the offsets of two lines of an MXNet ``.idx``, keys kept: each still lands on a record."""
    lines = [line.split("\t") for line in Path(idx).read_text().splitlines()]
    lines[first][1], lines[second][1] = lines[second][1], lines[first][1]
    Path(idx).write_text("".join(f"{key}\t{offset}\n" for key, offset in lines))


def test_a_recordio_idx_with_two_offsets_swapped_fails_verify_naming_the_key_and_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """im2rec's file (each record's id its key), its .idx shipped with keys 2 and 5 pointing at each other's
    records: ``verify`` names both keys, a reader refuses them (they would be served as each other, labels
    included), and the other records read as they are."""
    data = rec_images(8)
    rec, idx = write_recordio(
        tmp_path / "train", [(k, recordio.pack(recordio.single_label(k, k), data[k])) for k in range(8)]
    )
    assert verify(rec).ok and verify(rec).format == "recordio"
    offsets = {int(line.split("\t")[0]): int(line.split("\t")[1]) for line in Path(idx).read_text().splitlines()}
    _swap_lines(idx, 2, 5)
    assert main(["verify", rec, "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert f"{idx}: key 2: the index points at offset {offsets[5]}, the record of key 5; its record starts at" in out
    assert f"{idx}: key 5: the index points at offset {offsets[2]}, the record of key 2" in out
    source = RecordIOSource(rec)
    for position in (2, 5):
        with pytest.raises(FormatError, match=rf"train\.rec: record {position} .*has id {7 - position}, not its key"):
            source.read(position)
        with pytest.raises(FormatError, match=rf"record {position} .*not its key {position}"):
            source.label(position)
    assert [source.read(k) for k in (0, 1, 3, 4, 6, 7)] == [data[k] for k in (0, 1, 3, 4, 6, 7)]


def test_a_recordio_file_whose_ids_are_not_keys_warns_that_its_index_cannot_be_checked(tmp_path: Path) -> None:
    """Records written with id 0 (not by im2rec): a reader serves the index as it is, after a warning naming
    the file; ``verify`` says it cannot vouch for the index."""
    data = rec_images(4)
    rec, idx = write_recordio(
        tmp_path / "plain", [(k, recordio.pack(recordio.single_label(k, 0), data[k])) for k in range(4)]
    )
    with pytest.warns(UserWarning, match=rf"{idx}: the records of .*plain\.rec do not carry their keys as ids"):
        source = RecordIOSource(rec)
    assert [source.read(k) for k in range(4)] == data
    report = verify(rec)
    assert not report.ok and "cannot vouch that the index leads each key to its record" in report.problems[0]
