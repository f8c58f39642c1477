"""A folder index shipped beside the data (``train.fastloader-index``) never widens what is read: one that
names a file outside the folder, or watches no directory of it, is rebuilt from the folder's real files
(real images, a real planted index file, real packs)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np
import pytest

from fastloader.cli import main
from fastloader.datasets.folder import FileListSource, FolderSource
from fastloader.datasets.folder_index import FOLDER_KIND, FORMAT_VERSION, IndexMeta, content_id, filter_settings
from fastloader.formats.index_file import pack_strings, write_index
from tests.images import image_bytes, pack_contents, write_image_folder


def _plant(index_path: Path, root: Path, keys: list[str], watched: list[str]) -> None:
    """Write the index a stranger would ship: ``keys`` (all of class 0), watching ``watched`` as of now."""
    blob, offsets = pack_strings(keys)
    watched_blob, watched_offsets = pack_strings(watched)
    arrays = {
        "keys": blob,
        "key_offsets": offsets,
        "labels": np.zeros(len(keys), np.int64),
        "class_counts": np.array([len(keys)], np.int64),
        "watched": watched_blob,
        "watched_offsets": watched_offsets,
        "watched_mtime_ns": np.array([os.stat(path).st_mtime_ns for path in watched], np.int64),
    }
    later = time.time_ns() + 10**12  # "scanned" well after every change: never stale by its timestamps
    meta = IndexMeta(os.path.realpath(root), filter_settings(None), ("class_0",), later, content_id(arrays))
    write_index(index_path, FOLDER_KIND, FORMAT_VERSION, meta.__dict__, arrays)


@pytest.fixture()
def shipped(tmp_path: Path) -> tuple[Path, Path]:
    """``dataset/train`` (a one-class folder) and a private image elsewhere on the machine."""
    root = tmp_path / "dataset" / "train"
    write_image_folder(root, count=3, classes=1)
    secret = tmp_path / "home" / "private" / "secret.jpg"
    secret.parent.mkdir(parents=True)
    secret.write_bytes(image_bytes(99))
    past = time.time() - 60  # data written well before training (an index is not trusted within seconds)
    os.utime(root / "class_0", (past, past))
    os.utime(root, (past, past))
    return root, secret


REAL_KEYS = ["class_0/0000.jpg", "class_0/0001.jpg", "class_0/0002.jpg"]


@pytest.mark.parametrize(
    ("planted", "why"),
    [
        ("absolute", "is an absolute path, outside the folder"),
        ("dotdot", "is a '..' component, outside the folder"),
        ("watches nothing", "does not watch its folder"),
    ],
)
def test_a_planted_index_is_rebuilt_from_the_folder(
    shipped: tuple[Path, Path], planted: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    root, secret = shipped
    keys = {
        "absolute": [str(secret)],
        "dotdot": ["class_0/../../../home/private/secret.jpg"],
        "watches nothing": ["class_0/0000.jpg"],
    }[planted]
    watched = [] if planted == "watches nothing" else [str(root), str(root / "class_0")]
    index_path = root.parent / "train.fastloader-index"
    _plant(index_path, root, keys, watched)
    with caplog.at_level(logging.WARNING, logger="fastloader.datasets.folder_index"):
        source = FolderSource(root)
    assert source.index_path == str(index_path)
    assert [source.key(i) for i in range(len(source))] == REAL_KEYS
    assert str(index_path) in caplog.text and why in caplog.text


def test_pack_never_packs_a_file_a_planted_index_names_outside_the_folder(
    shipped: tuple[Path, Path], tmp_path: Path
) -> None:
    root, secret = shipped
    _plant(root.parent / "train.fastloader-index", root, [str(secret)], [str(root), str(root / "class_0")])
    out = tmp_path / "out.lmdb"
    assert main(["pack", str(root), str(out), "--workers", "0", "--no-progress"]) == 0
    packed = pack_contents(out)
    assert [key for key, _, _ in packed] == REAL_KEYS
    assert secret.read_bytes() not in [data for _, _, data in packed]


def test_names_that_only_look_like_climbing_are_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``..`` inside a name, ``...`` as a name: files of the folder, not a way out of it."""
    root = tmp_path / "train"
    names = ["a..b.jpg", "x..jpg", "...jpg"]
    for name in names:
        (root / "c" / "...").mkdir(parents=True, exist_ok=True)
        (root / "c" / name).write_bytes(b"")
    (root / "c" / "..." / "in.jpg").write_bytes(b"")
    past = time.time() - 60
    for directory in (root / "c" / "...", root / "c", root):
        os.utime(directory, (past, past))
    first = FolderSource(root)
    built = os.stat(first.index_path).st_mtime_ns
    with caplog.at_level(logging.WARNING, logger="fastloader.datasets.folder_index"):
        again = FolderSource(root)
    assert len(again) == 4 and os.stat(again.index_path).st_mtime_ns == built  # reused, never refused
    assert "outside" not in caplog.text


def test_a_file_list_index_that_watches_no_list_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_image_folder(tmp_path / "images", count=2, classes=1)
    list_path = tmp_path / "train.txt"
    list_path.write_text("images/class_0/0000.jpg 0\nimages/class_0/0001.jpg 0\n")
    built = FileListSource(list_path)
    index = Path(built.index_path)
    from fastloader.formats.index_file import read_index

    honest = read_index(index, "filelist", FORMAT_VERSION)
    arrays = dict(honest.arrays)
    secret = str(tmp_path / "secret.jpg")
    arrays["keys"], arrays["key_offsets"] = pack_strings([secret, secret])
    arrays["watched"], arrays["watched_offsets"] = pack_strings([])
    arrays["watched_mtime_ns"] = np.zeros(0, np.int64)
    meta = {**honest.meta, "samples_digest": content_id(arrays), "scanned_at_ns": time.time_ns() + 10**12}
    del honest
    write_index(index, "filelist", FORMAT_VERSION, meta, arrays)
    with caplog.at_level(logging.WARNING, logger="fastloader.datasets.folder_index"):
        source = FileListSource(list_path)
    assert [source.key(i) for i in range(len(source))] == ["images/class_0/0000.jpg", "images/class_0/0001.jpg"]
    assert "does not watch its list file" in caplog.text


def test_a_link_planted_where_the_index_goes_is_replaced_never_written_through(shipped: tuple[Path, Path]) -> None:
    """A guard of the rename every index is written with: the link goes, its target is never written."""
    root, secret = shipped
    before = secret.read_bytes()
    link = root.parent / "train.fastloader-index"
    link.symlink_to(secret)
    source = FolderSource(root)
    assert [source.key(i) for i in range(len(source))] == REAL_KEYS
    assert not link.is_symlink() and secret.read_bytes() == before
