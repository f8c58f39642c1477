"""FIFOs and devices named like images, through every command: skipped when a folder is indexed (and
named), never opened; a file list or a shard path naming one is an error naming it. Opening a FIFO
blindly waits for a writer forever, so each test runs under a timeout: a hang fails it."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from fastloader.cli import main
from fastloader.datasets import FileListDataset, ImageFolder
from tests.images import write_image_folder

pytestmark = pytest.mark.timeout(120)

IMAGES = 8


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    """8 good images, a FIFO ``class_0/zz_pipe.jpg`` and, as root, a device node ``class_1/zz_null.jpg``."""
    root = tmp_path / "images"
    write_image_folder(root, count=IMAGES, classes=2)
    os.mkfifo(root / "class_0" / "zz_pipe.jpg")
    try:
        os.mknod(root / "class_1" / "zz_null.jpg", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pass  # not root: the FIFO alone
    return root


def odd_entries(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("zz_*"))


def test_image_folder_skips_and_names_them(folder: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        ds = ImageFolder(folder)
    assert len(ds) == IMAGES and ds.source.not_regular == len(odd_entries(folder))
    assert all("zz_" not in path for path, _ in ds.samples)
    message = next(record.getMessage() for record in caplog.records if "not regular files" in record.message)
    assert all(name in message for name in odd_entries(folder))
    assert [ds[i][1] for i in range(len(ds))] == list(ds.targets)  # every sample reads
    again = ImageFolder(folder)  # the index reused: still counted
    assert again.source.not_regular == ds.source.not_regular


def test_scan_pack_doctor_and_bench_run_past_them(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["scan", str(folder), "--workers", "1", "--no-progress", "--report", str(tmp_path / "bad.tsv")]) == 0
    assert f"scanned {IMAGES} images" in capsys.readouterr().out
    assert main(["pack", str(folder), str(tmp_path / "out.lmdb"), "--workers", "1", "--no-progress"]) == 0
    assert f"packed {IMAGES} of {IMAGES}" in capsys.readouterr().out
    doctor = ["doctor", str(folder), "--workers", "1", "--batches", "2", "--batch-size", "4", "--no-storage"]
    assert main(doctor) == 0
    assert "verdict:" in capsys.readouterr().out
    bench = ["bench", str(folder), "--workers", "1", "--batches", "1", "--repeats", "1", "--batch-size", "4"]
    assert main(bench) == 0
    assert "DataLoaderX: x" in capsys.readouterr().out


def test_a_file_list_naming_a_fifo_is_an_error_naming_it(folder: Path, tmp_path: Path) -> None:
    fifo = folder / "class_0" / "zz_pipe.jpg"
    good = sorted((folder / "class_1").glob("0*.jpg"))
    listing = tmp_path / "list.txt"
    listing.write_text(f"{good[0]} 1\n{fifo} 0\n{good[1]} 1\n")
    ds = FileListDataset(listing)
    with pytest.raises(OSError, match=r"not a regular file \(a FIFO\)") as caught:
        ds[1]
    assert str(fifo) in str(caught.value)
    with pytest.raises(OSError, match="a FIFO"):
        FileListDataset(listing, loader=lambda path: open(path, "rb").read())[1]  # noqa: SIM115 - never reached
    ds.set_error_policy("replace", quarantine=tmp_path / "q.tsv")
    assert ds[1][1] == 1 and ds.error_stats()["bad_samples"] == 1  # replaced by the next sample
    report = tmp_path / "bad.tsv"
    assert main(["scan", str(listing), "--workers", "0", "--no-progress", "--report", str(report)]) == 0
    assert "not a regular file (a FIFO)" in report.read_text() and str(fifo) in report.read_text()


def test_a_shard_path_naming_a_fifo_is_an_error_naming_it(tmp_path: Path) -> None:
    from fastloader.datasets.recordio import RecordIOSource
    from fastloader.datasets.tar import TarShardSource
    from fastloader.datasets.tfrecord import TFRecordSource

    for name, open_source in (
        ("d.tar", lambda p: TarShardSource(str(p))),
        ("d.rec", lambda p: RecordIOSource(p, None)),
        ("d.tfrecord", lambda p: TFRecordSource(str(p))),
    ):
        fifo = tmp_path / name
        os.mkfifo(fifo)
        with pytest.raises(OSError, match=r"not a regular file \(a FIFO\)") as caught:
            open_source(fifo)
        assert str(fifo) in str(caught.value)
