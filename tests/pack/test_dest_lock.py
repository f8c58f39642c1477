"""One writer per destination: real concurrent ``fastloader pack`` processes, real SIGKILL, real lock files."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from fastloader.errors import DestinationLocked
from fastloader.pack import pack, verify
from fastloader.pack.dest_lock import lock_path
from tests.helpers import ROOT, finish, run_child
from tests.images import pack_contents, write_image_folder
from tests.pack.gated_source import wait_for_lock

CLI = [sys.executable, "-m", "fastloader.cli"]
FORMATS = ["lmdb", "tar", "parquet"]
GatedPack = Callable[..., subprocess.Popen[str]]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture()
def sources(tmp_path: Path) -> tuple[Path, list[tuple[str, int, bytes]], Path]:
    """Two folders of 20 images each, of the same keys and other pixels."""
    first, second = tmp_path / "first", tmp_path / "second"
    items = write_image_folder(first, count=20)
    write_image_folder(second, count=20, seed=1)
    return first, items, second


@pytest.mark.parametrize("output", FORMATS)
def test_a_second_pack_into_a_locked_destination_is_refused_naming_the_holder(
    sources: tuple[Path, list[tuple[str, int, bytes]], Path], tmp_path: Path, output: str, gated_pack: GatedPack
) -> None:
    first, items, second = sources
    dst = tmp_path / "dst"
    running = gated_pack(first, dst, output)
    record = wait_for_lock(dst, tmp_path, running)
    assert record["host"] == socket.gethostname()
    refused = run_child(
        [*CLI, "pack", str(second), str(dst), "--format", output, "--shard-size", "8", "--workers", "0",
         "--no-progress"],
        cwd=ROOT, env=_env(),
    )  # fmt: skip
    assert refused.returncode == 1, refused.stdout
    assert "another fastloader pack is writing into it" in refused.stderr
    assert f"pid {running.pid} on host {socket.gethostname()}, since " in refused.stderr
    assert "gated_source" in refused.stderr  # the holder's command line
    (tmp_path / "gate").touch()
    out, err = finish(running)
    assert running.returncode == 0, err
    assert verify(dst).ok
    assert pack_contents(dst) == items  # every sample once, all of the first source
    assert not lock_path(dst).exists()  # released


def test_a_lock_left_by_a_killed_pack_is_taken_over_and_the_pack_resumes(
    sources: tuple[Path, list[tuple[str, int, bytes]], Path],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    gated_pack: GatedPack,
) -> None:
    first, items, _ = sources
    dst = tmp_path / "dst"
    killed = gated_pack(first, dst, "tar")
    wait_for_lock(dst, tmp_path, killed)
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    assert json.loads(lock_path(dst).read_text())["pid"] == killed.pid  # its record stays; the pid is gone
    summary = pack(first, dst, format="tar", shard_size=8, workers=0, progress=False)
    assert f"taking over the lock of a pack that is gone: pid {killed.pid} on host" in capfd.readouterr().err
    assert summary.packed == 20 and verify(dst).ok
    assert pack_contents(dst) == items
    assert not lock_path(dst).exists()


def _record(dst: Path, **fields: object) -> None:
    base = {"pid": os.getpid(), "host": socket.gethostname(), "since": 1.0e9, "process_started": 0.0}
    lock_path(dst).write_text(json.dumps({**base, "command": "fastloader pack elsewhere", **fields}))


def test_a_lock_of_another_host_is_respected_unless_broken(
    sources: tuple[Path, list[tuple[str, int, bytes]], Path], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    first, items, _ = sources
    dst = tmp_path / "dst"
    _record(dst, pid=4242, host="other-host.example")
    with pytest.raises(DestinationLocked, match=r"pid 4242 on host other-host\.example, since 2001-09-0.*--break-lock"):
        pack(first, dst, format="tar", workers=0, progress=False)
    assert not dst.exists()  # nothing written
    pack(first, dst, format="tar", workers=0, progress=False, break_lock=True)
    assert "breaking the lock of pid 4242 on host other-host.example" in capfd.readouterr().err
    assert pack_contents(dst) == items and verify(dst).ok


def test_a_live_process_of_this_host_named_by_a_lock_is_respected(
    sources: tuple[Path, list[tuple[str, int, bytes]], Path], tmp_path: Path
) -> None:
    """A lock whose flock is free but whose pid runs, with the start time recorded (a file system whose flock
    another mount does not see), is not taken over; the same pid with another start time (reused) is."""
    first, _, _ = sources
    dst = tmp_path / "dst"
    me = psutil.Process()
    _record(dst, process_started=me.create_time())
    with pytest.raises(DestinationLocked, match=f"pid {os.getpid()} on host .*that process still runs"):
        pack(first, dst, format="tar", workers=0, progress=False)
    _record(dst, process_started=me.create_time() - 3600)  # the pid of a process gone, reused by this one
    assert pack(first, dst, format="tar", workers=0, progress=False).packed == 20


def test_two_spellings_of_one_destination_share_its_lock(
    sources: tuple[Path, list[tuple[str, int, bytes]], Path], tmp_path: Path, gated_pack: GatedPack
) -> None:
    first, _, second = sources
    (tmp_path / "out").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "out")
    running = gated_pack(first, tmp_path / "out" / "dst", "tar")
    wait_for_lock(tmp_path / "out" / "dst", tmp_path, running)
    with pytest.raises(DestinationLocked, match=f"pid {running.pid} on host"):
        pack(second, tmp_path / "link" / "dst/", format="tar", workers=0, progress=False)
    (tmp_path / "gate").touch()
    finish(running)
    assert running.returncode == 0
