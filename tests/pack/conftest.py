"""Fixtures of the pack tests: a real disk small enough to fill."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


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
