"""``fastloader pack`` / ``fastloader verify`` as real subprocesses, killed with SIGKILL and resumed."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest

from fastloader.formats import lmdb_records as records
from fastloader.pack.lmdb_sink import LMDBSink
from fastloader.pack.readers import ReencodeOptions, reencode
from fastloader.pack.verify import verify
from tests.helpers import run_child, wait_until
from tests.images import packed_items, write_image_folder

CLI = [sys.executable, "-m", "fastloader.cli"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_child([*CLI, *args])


def stamp(dst: Path) -> tuple[int, int] | None:
    """(size, mtime) of the pack's data file: it changes when a run commits."""
    try:
        stat = (dst / "data.mdb").stat()
    except FileNotFoundError:
        return None
    return stat.st_size, stat.st_mtime_ns


def committed_position(dst: Path) -> int:
    """The source position a dead pack's progress record says to resume from."""
    with lmdb.open(str(dst), readonly=True, lock=False) as env, env.begin() as txn:
        raw = txn.get(records.PROGRESS_KEY)
    return 0 if raw is None else records.PackProgress.from_json(raw, str(dst)).next_position


def run_and_kill(command: list[str], dst: Path, delay: float, log: Path) -> int | None:
    """Start a pack; once it has committed, wait ``delay`` s and SIGKILL it with its readers.

    Returns the position its progress record then says to resume from; None if it finished first.
    """
    before = stamp(dst)

    def committed() -> bool:  # the data file changed and holds more than its two meta pages
        now = stamp(dst)
        return now is not None and now != before and now[0] > 2 * 4096

    # A session of its own, so that the kill takes the reader processes with it, as a crash would.
    with open(log, "ab") as stderr:
        process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=stderr)
    wait_until(lambda: committed() or process.poll() is not None, timeout=60, interval=0.001)
    wait_until(lambda: process.poll() is not None, timeout=delay, interval=0.001)
    if process.poll() is not None:
        return None
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    return committed_position(dst)


def test_sigkill_at_random_moments_then_resume_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    root, dst = tmp_path / "images", tmp_path / "out.lmdb"
    items = write_image_folder(root, count=300, seed=7)
    (root / "class_2" / "broken.jpg").write_bytes(b"not an image at all")
    command = [*CLI, "pack", str(root), str(dst), "--resize-max-side", "32", "--workers", "1"]
    command += ["--commit-every", "4", "--no-progress", "--json"]
    rng = random.Random(20240611)
    positions = []
    for _ in range(5):
        position = run_and_kill(command, dst, rng.uniform(0.0, 0.02), tmp_path / "killed.log")
        if position is None:  # finished before the moment drawn: nothing left to kill
            break
        positions.append(position)
    assert any(0 < position < 301 for position in positions), f"no kill landed mid-pack: {positions}"
    final = run_child(command)
    assert final.returncode == 0, final.stderr
    summary = json.loads(final.stdout)
    assert summary["packed"] == 300 and [s["key"] for s in summary["skipped"]] == ["class_2/broken.jpg"]
    options = ReencodeOptions(resize_max_side=32)
    assert packed_items(dst) == [(key, label, reencode(data, options)) for key, label, data in items]
    assert verify(dst).ok


@pytest.fixture(scope="module")
def packed_by_cli(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[str, int, bytes]], dict]:
    root = tmp_path_factory.mktemp("cli")
    items = write_image_folder(root / "images", count=24)
    (root / "images" / "class_0" / "empty.jpg").write_bytes(b"")
    result = run("pack", str(root / "images"), str(root / "out.lmdb"), "--workers", "2", "--no-progress", "--json")
    assert result.returncode == 0, result.stderr
    return root / "out.lmdb", items, json.loads(result.stdout)


def test_pack_then_verify_through_the_cli(packed_by_cli) -> None:
    dst, items, summary = packed_by_cli
    assert (summary["total"], summary["packed"], summary["by_reason"]) == (25, 24, {"empty: 0 bytes": 1})
    assert Path(summary["report_path"]).read_text().splitlines()[1].endswith("class_0/empty.jpg\tempty: 0 bytes")
    assert packed_items(dst) == items
    result = run("verify", str(dst), "--no-progress")
    assert result.returncode == 0 and result.stdout.strip() == f"OK: 24 records verified in {dst} (lmdb)"


def test_verify_exits_nonzero_naming_the_corrupted_record(packed_by_cli, tmp_path: Path) -> None:
    dst, items, _ = packed_by_cli
    copy = tmp_path / "copy.lmdb"
    shutil.copytree(dst, copy)
    blob = bytearray((copy / "data.mdb").read_bytes())
    blob[blob.find(items[9][2][-100:]) + 50] ^= 0x10
    (copy / "data.mdb").write_bytes(blob)
    result = run("verify", str(copy), "--no-progress")
    assert result.returncode == 1
    assert f"{copy}[9] ({items[9][0]}): checksum mismatch" in result.stdout


def test_help_usage_errors_and_a_second_writer(packed_by_cli, tmp_path: Path) -> None:
    dst, _, _ = packed_by_cli
    help_text = run("pack", "--help").stdout
    for option in ("--format", "--resize-max-side", "--quality", "--workers", "--src-format", "SIGKILL", "verify"):
        assert option in help_text
    usage = run("pack", str(dst), str(tmp_path / "x.lmdb"), "--quality", "0")
    assert usage.returncode == 2 and "--quality: must be from 1 to 100" in usage.stderr
    source = dst.parent / "images"
    writer = LMDBSink(tmp_path / "busy.lmdb", {"anything": 1})
    try:
        busy = run("pack", str(source), str(tmp_path / "busy.lmdb"), "--no-progress")
    finally:
        writer.close()
    assert busy.returncode == 1 and "another fastloader pack is writing into it" in busy.stderr
    missing = run("verify", str(tmp_path / "none.lmdb"))
    assert missing.returncode == 1 and "none.lmdb: the path does not exist" in missing.stderr


def test_a_sample_whose_json_no_output_can_hold_is_skipped_and_the_parquet_pack_holds_the_rest(tmp_path: Path) -> None:
    from tests.pack.test_engine import write_webdataset

    write_webdataset(tmp_path / "src.tar", 300, bad=5)
    dst = tmp_path / "out"
    result = run(
        "pack", str(tmp_path / "src.tar"), str(dst), "--format", "parquet", "--shard-size", "50", "--no-progress"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"packed 299 of 300 images into {dst} (parquet)\n"), result.stdout
    assert "skipped 1" in result.stdout and "rejected: ValueError" in result.stdout
    result = run("verify", str(dst), "--no-progress")
    assert result.returncode == 0 and result.stdout.strip() == f"OK: 299 records verified in {dst} (parquet)"
