"""The source registry: the kind a path names, and its source opened."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fastloader.datasets.folder import FolderSource
from fastloader.datasets.lmdb import LMDBSource
from fastloader.datasets.sources import SOURCE_KINDS, detect_source_kind, open_source
from fastloader.pack.engine import pack
from tests.images import write_image_folder


@pytest.fixture()
def folder(tmp_path: Path) -> tuple[Path, list[tuple[str, int, bytes]]]:
    root = tmp_path / "images"
    return root, write_image_folder(root)


def test_source_kind_is_guessed_from_the_path(folder, tmp_path: Path) -> None:
    root, _ = folder
    pack(root, tmp_path / "out.lmdb", workers=0, progress=False)
    assert detect_source_kind(str(root)) == "folder"
    assert detect_source_kind(str(tmp_path / "out.lmdb")) == "lmdb"
    guesses = {"a.txt": "list", "a.csv": "list", "train.rec": "recordio", "t-{0..3}.tfrecord": "tfrecord"}
    guesses |= {"shard-{000..009}.tar": "tar", os.path.join("x", "*.tar"): "tar"}
    assert {name: detect_source_kind(name) for name in guesses} == guesses
    with pytest.raises(ValueError, match="cannot tell what to read"):
        detect_source_kind("model.bin")


def test_a_source_opens_as_its_kind_and_an_unknown_kind_is_named(folder, tmp_path: Path) -> None:
    root, items = folder
    source, kind = open_source(str(root))
    assert kind == "folder" and isinstance(source, FolderSource) and len(source) == len(items)
    pack(root, tmp_path / "out.lmdb", workers=0, progress=False)
    packed, kind = open_source(str(tmp_path / "out.lmdb"), "lmdb")
    assert kind == "lmdb" and isinstance(packed, LMDBSource) and len(packed) == len(items)
    with pytest.raises(
        ValueError, match="--src-format \\(src_format=\\) must be auto or one of " + ", ".join(SOURCE_KINDS)
    ):
        open_source(str(root), "zip")
