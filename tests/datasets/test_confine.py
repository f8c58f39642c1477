"""confine=True: nothing is read from outside a folder's or a file list's root, with real links on disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fastloader.datasets.folder import FileListDataset, FileListSource, FolderSource, ImageFolder
from fastloader.errors import OutsideRoot
from tests.images import image_bytes


def make_tree(tmp_path: Path) -> tuple[Path, Path]:
    """``data/`` with a plain file, a link that stays inside, a link to a file outside and a class directory
    linked outside; ``outside/`` holds what those links reach."""
    root, outside = tmp_path / "data", tmp_path / "outside"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    (outside / "classdir").mkdir(parents=True)
    (root / "b" / "plain.jpg").write_bytes(image_bytes(0))
    (root / "a" / "inside.jpg").symlink_to(Path("..") / "b" / "plain.jpg")
    (outside / "secret.jpg").write_bytes(image_bytes(1))
    (root / "a" / "leak.jpg").symlink_to(outside / "secret.jpg")
    (outside / "classdir" / "x.jpg").write_bytes(image_bytes(2))
    (root / "c").symlink_to(outside / "classdir", target_is_directory=True)
    return root, outside


def keys_of(source: FolderSource | FileListSource) -> dict[str, int]:
    return {source.key(i): i for i in range(len(source))}


def test_confined_folder_refuses_links_outside_and_names_them(tmp_path: Path) -> None:
    root, outside = make_tree(tmp_path)
    dataset = ImageFolder(root, confine=True)
    keys = keys_of(dataset.source)
    assert set(keys) == {"a/inside.jpg", "a/leak.jpg", "b/plain.jpg", "c/x.jpg"}
    assert dataset.source.read(keys["a/inside.jpg"]) == image_bytes(0)  # a link that stays inside is fine
    assert dataset.source.read(keys["b/plain.jpg"]) == image_bytes(0)
    dataset[keys["a/inside.jpg"]]
    for key, real in (("a/leak.jpg", outside / "secret.jpg"), ("c/x.jpg", outside / "classdir" / "x.jpg")):
        with pytest.raises(OutsideRoot, match=f"{key}: points outside the root .*to {real}"):
            dataset.source.read(keys[key])
        with pytest.raises(OutsideRoot, match=key):
            dataset[keys[key]]
        assert dataset.source.content_identity(keys[key]) is None  # the decoded cache serves nothing for it


def test_confined_folder_refuses_before_the_users_loader_opens(tmp_path: Path) -> None:
    root, _ = make_tree(tmp_path)
    opened: list[str] = []
    dataset = ImageFolder(root, loader=lambda path: opened.append(path) or path, confine=True)
    keys = keys_of(dataset.source)
    dataset[keys["a/inside.jpg"]]
    with pytest.raises(OutsideRoot, match="a/leak.jpg"):
        dataset[keys["a/leak.jpg"]]
    assert opened == [os.path.join(root, "a/inside.jpg")]


def test_unconfined_folder_reads_outside_and_says_where(tmp_path: Path) -> None:
    root, outside = make_tree(tmp_path)
    source = ImageFolder(root).source
    keys = keys_of(source)
    assert source.read(keys["a/leak.jpg"]) == image_bytes(1)  # torchvision's behaviour, kept by default
    assert source.outside(keys["a/leak.jpg"]) == str(outside / "secret.jpg")
    assert source.outside(keys["c/x.jpg"]) == str(outside / "classdir" / "x.jpg")
    assert source.outside(keys["a/inside.jpg"]) is None
    assert source.outside(keys["b/plain.jpg"]) is None


def test_a_root_reached_through_a_link_is_the_users_own(tmp_path: Path) -> None:
    root, _ = make_tree(tmp_path)
    (tmp_path / "alias").symlink_to(root, target_is_directory=True)
    source = ImageFolder(tmp_path / "alias", confine=True).source
    assert source.read(keys_of(source)["b/plain.jpg"]) == image_bytes(0)


def write_list(tmp_path: Path) -> tuple[Path, Path]:
    """``lists/train.txt`` naming a file under its root, ``../secret.jpg`` and an absolute path."""
    root = tmp_path / "lists"
    root.mkdir()
    (root / "in.jpg").write_bytes(image_bytes(0))
    (tmp_path / "secret.jpg").write_bytes(image_bytes(1))
    (tmp_path / "elsewhere").mkdir()
    absolute = tmp_path / "elsewhere" / "abs.jpg"
    absolute.write_bytes(image_bytes(2))
    listing = root / "train.txt"
    listing.write_text(f"in.jpg 0\n../secret.jpg 1\n{absolute} 2\n")
    return listing, absolute


def test_confined_file_list_refuses_dotdot_and_absolute_paths(tmp_path: Path) -> None:
    listing, absolute = write_list(tmp_path)
    dataset = FileListDataset(listing, confine=True)
    assert dataset.source.read(0) == image_bytes(0)
    with pytest.raises(OutsideRoot, match=f"../secret.jpg: points outside .*to {tmp_path / 'secret.jpg'}"):
        dataset.source.read(1)
    with pytest.raises(OutsideRoot, match=f"{absolute}: points outside"):
        dataset[2]


def test_unconfined_file_list_reads_them_and_says_where(tmp_path: Path) -> None:
    listing, absolute = write_list(tmp_path)
    source = FileListDataset(listing).source
    assert [source.read(i) for i in range(3)] == [image_bytes(i) for i in range(3)]
    assert [source.outside(i) for i in range(3)] == [None, str(tmp_path / "secret.jpg"), str(absolute)]
