"""What every test shares: its own fastloader cache directory.

Indexes that cannot sit beside their data, lock files and decoded caches go to ``$FASTLOADER_CACHE``;
each test gets an empty one, so no test reads another's files or writes into the real
``~/.cache/fastloader`` (subprocesses inherit the variable).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "fastloader-cache"
    monkeypatch.setenv("FASTLOADER_CACHE", str(cache))
    return cache


@pytest.fixture()
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MB tmpfs (grown by the test with ``mount -o remount,size=...``); skipped where mounting needs a
    root this process does not have."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
