"""The pack engine (Python API): real image folders, real LMDB files, real reader processes."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import lmdb
import numpy as np
import pytest
from PIL import Image

from fastloader.datasets.folder import FolderSource
from fastloader.datasets.lmdb import LMDBSource
from fastloader.errors import DecodeError, FormatError
from fastloader.pack.engine import pack
from fastloader.pack.readers import ReencodeOptions, reencode
from fastloader.pack.summary import report_path
from fastloader.pack.verify import verify
from tests.images import image_bytes, packed_items, write_image_folder


@pytest.fixture()
def folder(tmp_path: Path) -> tuple[Path, list[tuple[str, int, bytes]]]:
    root = tmp_path / "images"
    return root, write_image_folder(root)


def test_pack_keeps_every_image_byte_for_byte_with_its_label(folder, tmp_path: Path) -> None:
    root, items = folder
    summary = pack(root, tmp_path / "out.lmdb", workers=2, progress=False)
    assert (summary.total, summary.packed, summary.packed_now, summary.skipped) == (36, 36, 36, ())
    assert summary.report_path is None and summary.bytes_in == summary.bytes_out == sum(len(d) for _, _, d in items)
    assert packed_items(tmp_path / "out.lmdb") == items
    source = LMDBSource(tmp_path / "out.lmdb")
    assert source.classes == ["class_0", "class_1", "class_2"]
    assert source.labels().tolist() == [label for _, label, _ in items]
    assert verify(tmp_path / "out.lmdb").ok


def test_the_output_is_the_same_file_whatever_the_number_of_readers(folder, tmp_path: Path) -> None:
    root, _ = folder
    pack(root, tmp_path / "serial.lmdb", workers=0, progress=False, resize_max_side=40)
    pack(root, tmp_path / "parallel.lmdb", workers=2, progress=False, resize_max_side=40)
    assert (tmp_path / "serial.lmdb" / "data.mdb").read_bytes() == (
        tmp_path / "parallel.lmdb" / "data.mdb"
    ).read_bytes()


def test_resize_shrinks_large_images_to_rgb_jpeg_and_keeps_small_ones(folder, tmp_path: Path) -> None:
    root, items = folder
    pack(root, tmp_path / "small.lmdb", resize_max_side=40, workers=0, progress=False)
    packed = packed_items(tmp_path / "small.lmdb")
    assert [(key, label) for key, label, _ in packed] == [(key, label) for key, label, _ in items]
    shrunk = 0
    for (_, _, original), (_, _, data) in zip(items, packed):
        before, after = Image.open(io.BytesIO(original)), Image.open(io.BytesIO(data))
        if max(before.size) > 40:
            shrunk += 1
            assert max(after.size) == 40 and after.format == "JPEG" and after.mode == "RGB"
            assert abs(after.size[0] / after.size[1] - before.size[0] / before.size[1]) < 0.1
        else:
            assert data == original  # never upscaled, never re-encoded without need
    assert 0 < shrunk < len(items)


def test_quality_reencodes_as_jpeg_unless_it_would_grow(folder, tmp_path: Path) -> None:
    root, items = folder
    pack(root, tmp_path / "q.lmdb", quality=50, workers=0, progress=False)
    changed = 0
    for (_, _, original), (_, _, data) in zip(items, packed_items(tmp_path / "q.lmdb")):
        if data != original:
            changed += 1
            image = Image.open(io.BytesIO(data))
            assert image.format == "JPEG" and image.mode == "RGB" and len(data) < len(original)
            assert image.size == Image.open(io.BytesIO(original)).size
    assert changed > len(items) // 2


def test_reencode_rejects_what_does_not_decode() -> None:
    jpeg = image_bytes(0)
    with pytest.raises((DecodeError, OSError)):  # the JPEG extension's refusal naming the file, else PIL's
        reencode(jpeg[: len(jpeg) // 2], ReencodeOptions(), "half.jpg")  # truncated: caught even at 1/8 scale
    assert reencode(jpeg, ReencodeOptions()) is jpeg


def test_bad_inputs_are_skipped_and_reported(folder, tmp_path: Path) -> None:
    root, items = folder
    truncated = image_bytes(0)
    bad = {
        "class_0/bad_empty.jpg": b"",
        "class_1/bad_truncated.jpg": truncated[: len(truncated) // 2],
        "class_1/bad_random.jpg": np.random.default_rng(1).bytes(3000),
        "class_2/bad_text.jpg": b"this is not an image\n",
    }
    for key, data in bad.items():
        (root / key).write_bytes(data)
    dst = tmp_path / "out.lmdb"
    summary = pack(root, dst, workers=2, progress=False)
    assert sorted(s.key for s in summary.skipped) == sorted(bad)
    reasons = {s.key: s.reason for s in summary.skipped}
    assert reasons["class_0/bad_empty.jpg"] == "empty: 0 bytes"
    assert reasons["class_1/bad_truncated.jpg"].startswith(("undecodable: DecodeError", "undecodable: OSError"))
    assert reasons["class_2/bad_text.jpg"].startswith("undecodable: UnidentifiedImageError")
    assert sum(summary.skipped_by_reason().values()) == 4 and "skipped 4" in summary.format_text()
    assert packed_items(dst) == items
    report = Path(report_path(dst)).read_text().splitlines()
    assert report[0] == "position\tkey\treason" and sorted(line.split("\t")[1] for line in report[1:]) == sorted(bad)
    assert verify(dst).ok


def test_map_grows_from_a_tiny_size(folder, tmp_path: Path) -> None:
    root, items = folder
    dst = tmp_path / "grown.lmdb"
    pack(root, dst, workers=0, progress=False, map_size=64 * 1024, commit_every=5)
    assert packed_items(dst) == items
    assert os.path.getsize(dst / "data.mdb") > 4 * 64 * 1024  # the data outgrew the first map several times


class InterruptOnce:
    """A folder source whose read of ``position`` raises KeyboardInterrupt the first time only."""

    def __init__(self, root: Path, position: int) -> None:
        self.inner, self.position, self.fired = FolderSource(root), position, False
        self.classes = self.inner.classes

    def __len__(self) -> int:
        return len(self.inner)

    def read(self, index: int) -> bytes:
        if index == self.position and not self.fired:
            self.fired = True
            raise KeyboardInterrupt
        return self.inner.read(index)

    def label(self, index: int) -> int:
        return self.inner.label(index)

    def key(self, index: int) -> str:
        return self.inner.key(index)


def test_an_interrupted_pack_resumes_with_every_image_exactly_once(folder, tmp_path: Path) -> None:
    root, items = folder
    (root / "class_1" / "bad.jpg").write_bytes(b"")
    source, dst = InterruptOnce(root, position=23), tmp_path / "out.lmdb"
    with pytest.raises(KeyboardInterrupt):
        pack(source, dst, workers=0, progress=False, commit_every=4)
    with pytest.raises(FormatError, match="incomplete pack: run the same `fastloader pack` command again"):
        LMDBSource(dst)
    summary = pack(source, dst, workers=0, progress=False, commit_every=4)
    assert summary.resumed_from == 23  # what was handed over before the interrupt was kept
    assert [s.key for s in summary.skipped] == ["class_1/bad.jpg"]
    finished = (dst / "data.mdb").read_bytes()
    again = pack(source, dst, workers=0, progress=False, commit_every=4)
    assert again.resumed_from == again.total and again.packed_now == 0 and "already complete" in again.format_text()
    assert (dst / "data.mdb").read_bytes() == finished  # a finished pack is never written again
    assert packed_items(dst) == items


class DiesAt(InterruptOnce):
    """A folder source whose reader process dies outright (as a decoder crash would) at ``position``."""

    def read(self, index: int) -> bytes:
        if index == self.position:
            os._exit(3)
        return self.inner.read(index)


def test_a_dead_reader_process_is_an_error_not_a_hang_and_the_pack_resumes(folder, tmp_path: Path) -> None:
    root, items = folder
    dst = tmp_path / "out.lmdb"
    with pytest.raises(RuntimeError, match=r"a reader process died .* positions 0\.\.31; run the same command again"):
        pack(DiesAt(root, position=20), dst, workers=2, progress=False, commit_every=4)
    summary = pack(DiesAt(root, position=-1), dst, workers=2, progress=False)
    assert summary.packed == len(items) and packed_items(dst) == items


def test_a_different_pack_into_the_same_destination_is_refused(folder, tmp_path: Path) -> None:
    root, _ = folder
    pack(root, tmp_path / "out.lmdb", workers=0, progress=False)
    with pytest.raises(
        FormatError, match=r"out\.lmdb: holds a different pack \(not the same quality as this command\)"
    ):
        pack(root, tmp_path / "out.lmdb", quality=80, workers=0, progress=False)


def test_destinations_that_are_not_packs_are_refused(folder, tmp_path: Path) -> None:
    root, _ = folder
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(FormatError, match="taken: exists, holds no LMDB and is not empty"):
        pack(root, tmp_path / "taken", workers=0, progress=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(FormatError, match="file: exists and is not a directory"):
        pack(root, tmp_path / "file", workers=0, progress=False)
    with lmdb.open(str(tmp_path / "foreign")) as env, env.begin(write=True) as txn:
        txn.put(b"somebody", b"else's data")
    with pytest.raises(FormatError, match="foreign: an LMDB not written by `fastloader pack`"):
        pack(root, tmp_path / "foreign", workers=0, progress=False)
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


def test_an_lmdb_repacks_smaller_and_tar_shards_hold_the_same_images(folder, tmp_path: Path) -> None:
    from fastloader.datasets.tar import TarShardSource

    root, items = folder
    pack(root, tmp_path / "full.lmdb", workers=0, progress=False)
    pack(tmp_path / "full.lmdb", tmp_path / "small.lmdb", resize_max_side=40, workers=2, progress=False)
    direct = tmp_path / "direct.lmdb"
    pack(root, direct, resize_max_side=40, workers=0, progress=False)
    assert [d for _, _, d in packed_items(tmp_path / "small.lmdb")] == [d for _, _, d in packed_items(direct)]
    assert LMDBSource(tmp_path / "small.lmdb").classes == ["class_0", "class_1", "class_2"]
    pack(root, tmp_path / "shards", format="tar", shard_size=10, workers=0, progress=False)
    shards = TarShardSource(tmp_path / "shards")
    assert [(shards.label(i), hashlib.sha1(shards.read(i)).hexdigest()) for i in range(len(shards))] == [
        (label, hashlib.sha1(data).hexdigest()) for _, label, data in items
    ]


def test_bad_options_are_named(folder, tmp_path: Path) -> None:
    root, _ = folder
    for options, name in [({"quality": 0}, "quality"), ({"resize_max_side": 0}, "resize_max_side"),
                          ({"format": "zip"}, "format"), ({"workers": -1}, "workers")]:  # fmt: skip
        with pytest.raises(ValueError, match=name):
            pack(root, tmp_path / "x.lmdb", progress=False, **options)
    assert not (tmp_path / "x.lmdb").exists()


def write_webdataset(path: Path, count: int, bad: int) -> None:
    """A WebDataset shard ``s0000.jpg``/``.cls``/``.json``, ...; sample ``bad``'s JSON holds a lone surrogate
    (valid JSON text, ``{"a": "\\ud800"}``, whose value no UTF-8 output can hold)."""
    import tarfile

    with tarfile.open(path, "w") as tar:
        for index in range(count):
            text = b'{"a": "\\ud800"}' if index == bad else b'{"a": %d}' % index
            for ext, data in (("jpg", image_bytes(index)), ("cls", str(index % 3).encode()), ("json", text)):
                info = tarfile.TarInfo(f"s{index:04d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("shard_size", [50, 1000])
@pytest.mark.parametrize("output", ["lmdb", "tar", "parquet"])
def test_a_field_no_output_can_hold_rejects_only_its_sample(tmp_path: Path, output: str, shard_size: int) -> None:
    from fastloader.datasets.sources import open_source
    from fastloader.fields.source import read_fields
    from tests.images import pack_contents

    write_webdataset(tmp_path / "src.tar", 120, bad=5)
    dst = tmp_path / "out"
    summary = pack(tmp_path / "src.tar", dst, format=output, shard_size=shard_size, workers=0, progress=False)
    assert (summary.packed, summary.resumed_from) == (119, 0)
    [bad] = summary.skipped
    assert bad.position == 5 and bad.key.endswith("s0005") and bad.reason.startswith("rejected: ")
    assert "'utf-8' codec can't encode character '\\ud800'" in bad.reason, bad.reason
    assert Path(report_path(dst)).read_text().splitlines()[1].startswith(f"5\t{bad.key}\trejected: ")
    source, _ = open_source(str(tmp_path / "src.tar"))
    kept = [index for index in range(len(source)) if index != 5]
    assert pack_contents(dst) == [(source.key(i), source.label(i), source.read(i)) for i in kept]
    packed, _ = open_source(str(dst))
    assert [read_fields(packed, i)["json"] for i in range(len(packed))] == [{"a": i} for i in kept]
    report = verify(dst)
    assert report.ok and report.checked == 119, report.problems


def test_json_too_deep_for_one_process_is_refused_by_every_process_alike(tmp_path: Path) -> None:
    """A JSON member nested 985 deep (within reach of the recursion limit in one process, not in another)
    and one nested 129 deep are skipped, naming the sample and field, whatever --workers; 128 deep packs."""
    import tarfile

    shard = tmp_path / "d.tar"
    depths = {1: 985, 2: 129, 3: 128}
    with tarfile.open(shard, "w") as tar:
        for number in range(5):
            meta = b"[" * depths.get(number, 1) + b"0" + b"]" * depths.get(number, 1)
            for ext, data in (("jpg", image_bytes(6 * number)), ("json", meta)):
                info = tarfile.TarInfo(f"s{number}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    summaries = [pack(str(shard), tmp_path / f"w{workers}.lmdb", workers=workers, progress=False) for workers in (0, 1)]
    for summary in summaries:
        assert [(item.position, item.key) for item in summary.skipped] == [(1, f"{shard}:s1"), (2, f"{shard}:s2")]
        assert all("field 'json': JSON nested deeper than 128 levels" in item.reason for item in summary.skipped)
    assert packed_items(tmp_path / "w0.lmdb") == packed_items(tmp_path / "w1.lmdb")
    value = LMDBSource(tmp_path / "w1.lmdb").read_field(1, "json")  # position 3, nested 128 deep: packed
    for _ in range(128):
        (value,) = value
    assert value == 0
