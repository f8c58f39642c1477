"""``fastloader pack`` of a Hugging Face image dataset built from file paths (``{bytes: null, path}`` rows,
written by the real ``datasets``): every image packed once from its file, through the API and the CLI."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from fastloader.pack.engine import pack
from fastloader.pack.verify import verify
from tests.helpers import run_child
from tests.images import packed_items, write_hf_by_path

pytest.importorskip("datasets")


def test_pack_reads_every_image_from_its_path_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    items = write_hf_by_path(tmp_path / "set")
    monkeypatch.chdir(tmp_path / "set")  # where the relative paths lead
    summary = pack("train.parquet", tmp_path / "out.lmdb", workers=2, progress=False)
    assert (summary.total, summary.packed, summary.skipped) == (len(items), len(items), ())
    packed = packed_items(tmp_path / "out.lmdb")
    assert [(label, data) for _, label, data in packed] == [(label, data) for _, label, data in items]
    assert verify(tmp_path / "out.lmdb").ok


def test_pack_of_a_moved_set_needs_root_and_skips_a_missing_file(tmp_path: Path) -> None:
    items = write_hf_by_path(tmp_path / "set")
    moved = tmp_path / "moved"
    shutil.move(tmp_path / "set", moved)
    (moved / "images/0005.jpg").unlink()
    cli = [sys.executable, "-m", "fastloader.cli", "pack", str(moved / "train.parquet")]
    # Without --root (run from tmp_path) no path leads anywhere: every image is skipped, naming row and path.
    lost = run_child([*cli, str(tmp_path / "lost.lmdb"), "--no-progress", "--workers", "1"], cwd=tmp_path)
    assert "skipped 12" in lost.stdout, lost.stdout + lost.stderr
    skipped = (tmp_path / "lost.lmdb.skipped.tsv").read_text()
    assert "train.parquet#0" in skipped and "'images/0000.jpg'" in skipped
    done = run_child([*cli, str(tmp_path / "out.lmdb"), "--root", str(moved), "--no-progress"], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    report = (tmp_path / "out.lmdb.skipped.tsv").read_text().splitlines()
    assert len(report) == 2 and report[1].startswith("5\t") and "'images/0005.jpg'" in report[1]
    expected = [(label, data) for index, (_, label, data) in enumerate(items) if index != 5]
    assert [(label, data) for _, label, data in packed_items(tmp_path / "out.lmdb")] == expected
    assert verify(tmp_path / "out.lmdb").ok
