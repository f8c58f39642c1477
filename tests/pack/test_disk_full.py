"""A full disk during `pack`: a clear error naming the destination, the partial output is never taken for
a complete pack, and once the disk has room the same command finishes it with every sample exactly once.
Uses a real 1 MB tmpfs, grown by a remount (needs root to mount; skipped otherwise)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fastloader.datasets import LMDBDataset, ParquetDataset, TarShardDataset
from fastloader.errors import FormatError
from fastloader.pack import pack
from fastloader.pack.verify import verify
from tests.images import pack_contents, write_image_folder

READERS = {"lmdb": LMDBDataset, "tar": TarShardDataset, "parquet": ParquetDataset}


@pytest.mark.parametrize("output", ["lmdb", "tar", "parquet"])
def test_a_full_disk_is_a_clear_error_then_the_same_pack_on_a_grown_disk_holds_every_sample_once(
    tiny_disk: Path, tmp_path: Path, output: str
) -> None:
    source = tmp_path / "images"
    items = write_image_folder(source, count=300)  # about 1.4 MB of images: more than the disk holds
    (source / "class_1" / "bad.jpg").write_bytes(b"")  # skipped: recorded with the progress, never packed
    dst = tiny_disk / f"out-{output}"
    options = {"format": output, "workers": 0, "progress": False, "shard_size": 50, "commit_every": 50}
    with pytest.raises(OSError, match=rf"{dst}: writing the pack failed .* run the same command again"):
        pack(str(source), dst, **options)
    with pytest.raises(FormatError):
        READERS[output](dst)
    grown = subprocess.run(["mount", "-o", "remount,size=16m", str(tiny_disk)], capture_output=True)
    assert grown.returncode == 0, grown.stderr.decode()
    summary = pack(str(source), dst, **options)
    assert 0 < summary.resumed_from < summary.total == 301  # what the first run made durable was kept
    assert summary.packed == 300 and [item.key for item in summary.skipped] == ["class_1/bad.jpg"]
    assert pack_contents(dst) == items  # keys, labels and image bytes, sample by sample, each once
    report = verify(dst)
    assert report.ok and report.checked == 300, report.problems
