"""Reports written where a user names them: a symlink's target, a FIFO or a device in place, never
replaced by a regular file; a FIFO nobody reads is an error at once, never a hang."""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest

from fastloader.cli import main
from fastloader.storage import atomic_write_bytes, write_derived_bytes, write_report_bytes
from tests.images import write_image_folder


def test_a_regular_file_is_replaced_and_a_new_one_made(tmp_path: Path) -> None:
    path = tmp_path / "report.tsv"
    write_report_bytes(path, b"first\n")
    path.chmod(0o640)
    write_report_bytes(path, b"second\n")
    assert path.read_bytes() == b"second\n" and os.listdir(tmp_path) == ["report.tsv"]


def test_a_symlink_is_followed_and_stays_a_symlink(tmp_path: Path) -> None:
    target, link = tmp_path / "real" / "report.html", tmp_path / "report.html"
    target.parent.mkdir()
    target.write_bytes(b"old")
    link.symlink_to(target)
    write_report_bytes(link, b"new")
    assert link.is_symlink() and target.read_bytes() == b"new"
    dangling = tmp_path / "dangling.html"
    dangling.symlink_to(tmp_path / "real" / "not-yet.html")
    write_report_bytes(dangling, b"made")  # as `> dangling.html` would: the link's target is created
    assert dangling.is_symlink() and (tmp_path / "real" / "not-yet.html").read_bytes() == b"made"


def test_a_fifo_with_a_reader_gets_the_report_and_stays_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    data = bytes(range(256)) * 4096  # 1 MiB: more than a pipe holds, so the writer waits on the reader
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    writer = threading.Thread(target=write_report_bytes, args=(fifo, data))
    writer.start()
    received = bytearray()
    try:
        while True:
            try:
                chunk = os.read(reader, 1 << 16)
            except BlockingIOError:  # the writer is there, its next bytes are not yet
                chunk = None
            if chunk:
                received += chunk
            elif not writer.is_alive():
                received += _drain(reader)
                break
            else:
                time.sleep(0.005)
    finally:
        writer.join(timeout=30)
        os.close(reader)
    assert bytes(received) == data and stat.S_ISFIFO(fifo.lstat().st_mode)


def _drain(fd: int) -> bytes:
    out = bytearray()
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return bytes(out)
        if not chunk:
            return bytes(out)
        out += chunk


def test_a_fifo_nobody_reads_is_an_error_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="a FIFO that no process reads") as caught:
        write_report_bytes(fifo, b"report")
    assert str(fifo) in str(caught.value) and stat.S_ISFIFO(fifo.lstat().st_mode)


def _null_device(tmp_path: Path) -> Path:
    """A node of the null device (1, 3) made in tmp: the real /dev/null is never touched."""
    node = tmp_path / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        os.close(os.open(node, os.O_WRONLY))
    except PermissionError:
        pytest.skip("device nodes cannot be made or opened here (not root, or a nodev mount)")
    return node


def test_a_character_device_is_written_in_place(tmp_path: Path) -> None:
    node = _null_device(tmp_path)
    write_report_bytes(node, b"report")
    assert stat.S_ISCHR(node.lstat().st_mode) and node.lstat().st_rdev == os.makedev(1, 3)
    assert os.listdir(tmp_path) == ["null"]  # no temporary file left beside it


def test_directories_sockets_and_block_devices_are_refused(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="a directory"):
        write_report_bytes(tmp_path, b"x")
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        with pytest.raises(OSError, match="a socket"):
            write_report_bytes(path, b"x")
    block = tmp_path / "block"
    try:
        os.mknod(block, stat.S_IFBLK | 0o600, os.makedev(7, 250))  # a loop device minor that is not set up
    except PermissionError:
        return
    with pytest.raises(OSError, match="a block device"):
        write_report_bytes(block, b"x")


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "images"
    write_image_folder(root, count=6, classes=2)
    (root / "class_0" / "zz_bad.jpg").write_bytes(b"not an image")
    return root


def test_scan_and_pack_follow_a_symlinked_report(folder: Path, tmp_path: Path) -> None:
    target = tmp_path / "kept" / "bad.tsv"
    target.parent.mkdir()
    link = tmp_path / "bad.tsv"
    link.symlink_to(target)
    assert main(["scan", str(folder), "--report", str(link), "--workers", "0", "--no-progress"]) == 0
    assert link.is_symlink() and "zz_bad.jpg" in target.read_text()
    skipped_target = tmp_path / "kept" / "skipped.tsv"
    (tmp_path / "out.lmdb.skipped.tsv").symlink_to(skipped_target)
    pack = ["pack", str(folder), str(tmp_path / "out.lmdb"), "--workers", "0", "--no-progress"]
    assert main([*pack, "--max-skipped", "1"]) == 0  # 1 of 7 skipped, over the default: accepted here
    assert (tmp_path / "out.lmdb.skipped.tsv").is_symlink() and "zz_bad.jpg" in skipped_target.read_text()


def test_scan_to_a_fifo_nobody_reads_says_so(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "bad.fifo"
    os.mkfifo(fifo)
    assert main(["scan", str(folder), "--report", str(fifo), "--workers", "0", "--no-progress"]) == 1
    assert "a FIFO that no process reads" in capsys.readouterr().err and stat.S_ISFIFO(fifo.lstat().st_mode)


def test_doctor_report_to_a_device_leaves_the_device(tmp_path: Path) -> None:
    node = _null_device(tmp_path)
    write_image_folder(tmp_path / "clean", count=4, classes=2)
    args = ["doctor", str(tmp_path / "clean"), "--workers", "0", "--batches", "1", "--batch-size", "2", "--no-storage"]
    assert main([*args, "--report", str(node)]) == 0
    assert stat.S_ISCHR(node.lstat().st_mode) and node.lstat().st_rdev == os.makedev(1, 3)


def test_a_default_location_never_writes_through_a_link(tmp_path: Path) -> None:
    """A link a dataset planted where fastloader writes by default: refused by the report writer; and the
    rename every derived file is written with replaces a link itself, never its target."""
    victim = tmp_path / "victim"
    victim.write_text("kept")
    link = tmp_path / "report.tsv"
    link.symlink_to(victim)
    with pytest.raises(FileExistsError, match=r"symbolic link.*report\.tsv"):
        write_derived_bytes(link, b"report")
    assert link.is_symlink() and victim.read_text() == "kept"
    atomic_write_bytes(link, b"index")  # an index's write: the link is replaced by the new file
    assert not link.is_symlink() and link.read_bytes() == b"index" and victim.read_text() == "kept"
