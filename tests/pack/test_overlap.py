"""A pack never writes into what it reads: SRC and DST that hold one another are refused, the source untouched."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from fastloader.datasets.folder import FolderSource
from fastloader.pack import pack
from tests.helpers import ROOT, run_child
from tests.images import write_image_folder


def _tree(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.fixture()
def src(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    write_image_folder(root, count=12)
    FolderSource(root)  # its index beside it, made before the tree is taken
    return root


@pytest.mark.parametrize("output", ["lmdb", "tar", "parquet"])
@pytest.mark.parametrize(
    ("dst", "relation"),
    [("src/packed", "is inside the source"), ("src", "is the source"), ("src/class_1", "is inside the source")],
)
def test_a_destination_in_the_source_is_refused_and_the_source_left_whole(
    src: Path, tmp_path: Path, dst: str, relation: str, output: str
) -> None:
    before = _tree(src)
    with pytest.raises(ValueError, match=f"the destination {tmp_path / dst} {relation} {src}"):
        pack(src, tmp_path / dst, format=output, workers=0, progress=False)
    assert _tree(src) == before
    assert len(FolderSource(src)) == 12  # still the same 12 images in 3 classes
    assert not (tmp_path / f"{dst}.pack.lock").exists()


def test_a_destination_that_holds_the_source_is_refused(src: Path, tmp_path: Path) -> None:
    before = _tree(src)
    with pytest.raises(ValueError, match=f"the destination {tmp_path} holds the source {src / 'class_0'}"):
        pack(src / "class_0", tmp_path, format="tar", workers=0, progress=False)
    assert _tree(src) == before


def test_symbolic_links_are_resolved(src: Path, tmp_path: Path) -> None:
    (tmp_path / "alias").symlink_to(src)
    with pytest.raises(ValueError, match=f"is inside the source {src} .resolved: {src / 'out'} and {src}"):
        pack(src, tmp_path / "alias" / "out", workers=0, progress=False)
    assert not (src / "out").exists()


def test_a_pattern_source_refuses_its_own_directory_and_not_a_sub_directory(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    write_image_folder(tmp_path / "images", count=12)
    pack(tmp_path / "images", shards, format="tar", shard_size=4, workers=0, progress=False)
    pattern = os.fspath(shards / "shard-*.tar")
    with pytest.raises(ValueError, match=re.escape(f"the destination {shards} is the source {pattern}")):
        pack(pattern, shards, format="tar", workers=0, progress=False)
    assert pack(pattern, shards / "again", format="tar", workers=0, progress=False).packed == 12


def test_the_cli_names_both_paths(src: Path, tmp_path: Path) -> None:
    done = run_child(
        [sys.executable, "-m", "fastloader.cli", "pack", str(src), str(src / "packed"), "--no-progress"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 1
    assert f"fastloader pack: error: the destination {src / 'packed'} is inside the source {src}" in done.stderr
    assert not (src / "packed").exists()
