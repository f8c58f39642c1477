"""A full disk during `pack`: a clear error naming the destination, and the partial output is never
taken for a complete pack. Uses a real 1 MB tmpfs (needs root to mount; skipped otherwise)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastloader.datasets import LMDBDataset, TarShardDataset
from fastloader.errors import FormatError
from fastloader.pack import pack
from tests.images import write_image_folder


@pytest.fixture()
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.parametrize(("output", "reader"), [("lmdb", LMDBDataset), ("tar", TarShardDataset)])
def test_a_full_disk_is_a_clear_error_and_never_a_complete_pack(
    tiny_disk: Path, tmp_path: Path, output: str, reader: type
) -> None:
    source = tmp_path / "images"
    write_image_folder(source, count=200)  # about 1.5 MB: more than the disk holds
    dst = tiny_disk / f"out-{output}"
    with pytest.raises(OSError, match=rf"{dst}: writing the pack failed .* run the same command again"):
        pack(str(source), dst, format=output, workers=0, progress=False, shard_size=50)
    with pytest.raises(FormatError):
        reader(dst)
