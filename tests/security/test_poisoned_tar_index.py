"""A tar pack's shard indexes are checked against their shards: ``verify`` rescans each shard and names the first
sample its index misdescribes, and a reader trusts no index whose arrays are not those the manifest records
(poisoned labels and swapped offsets, done for real to a real pack's index, its shard and manifest untouched)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from fastloader.datasets import TarShardDataset
from fastloader.formats.index_file import read_index, write_index
from fastloader.formats.tar_shards import INDEX_KIND, INDEX_VERSION
from fastloader.pack import pack
from fastloader.pack.verify import verify
from tests.images import write_image_folder


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("indexes")
    write_image_folder(root / "images", count=12)
    pack(root / "images", root / "tar", format="tar", shard_size=4, workers=0, progress=False)
    return root / "tar"


@pytest.fixture()
def copy(packed: Path, tmp_path: Path) -> Path:
    shutil.copytree(packed, tmp_path / "tar")  # copy2: the shards keep their mtimes, so the indexes still "fit"
    return tmp_path / "tar"


def edit_index(dst: Path, edit: Callable[[dict[str, np.ndarray]], None]) -> None:
    """Rewrite shard 0's index with ``edit`` applied to its arrays, its meta (the shard's size, mtime and
    SHA-256) kept: an index that still names its shard."""
    path = dst / "shard-000000.tar.fl-idx"
    index = read_index(path, INDEX_KIND, INDEX_VERSION)
    arrays = {name: np.array(array) for name, array in index.arrays.items()}
    edit(arrays)
    write_index(path, INDEX_KIND, INDEX_VERSION, dict(index.meta), arrays)


def flip_labels(arrays: dict[str, np.ndarray]) -> None:
    arrays["label"] = (arrays["label"] + 1) % 3


def swap_offsets(arrays: dict[str, np.ndarray]) -> None:
    for name in ("data_offset", "data_size"):
        arrays[name][[0, 1]] = arrays[name][[1, 0]]


def test_verify_names_the_first_sample_a_poisoned_index_misdescribes(copy: Path) -> None:
    labels = [label for _, label in TarShardDataset(copy, transform=lambda image: 0)]
    edit_index(copy, flip_labels)
    problems = verify(copy).problems
    shard = copy / "shard-000000.tar"
    assert problems == (
        f"{shard}: its index does not describe the shard's members: sample 0 (key '000000000'): label "
        f"{(labels[0] + 1) % 3} in the index, {labels[0]} in the shard",
    )


def test_verify_names_swapped_offsets(copy: Path) -> None:
    edit_index(copy, swap_offsets)
    (problem,) = verify(copy).problems
    assert problem.startswith(f"{copy / 'shard-000000.tar'}: its index does not describe the shard's members: sample 0")
    assert "image ('jpg'," in problem


@pytest.mark.parametrize("edit", [flip_labels, swap_offsets])
def test_a_reader_serves_the_shard_not_a_poisoned_index(
    copy: Path, packed: Path, edit: Callable[[dict[str, np.ndarray]], None]
) -> None:
    truth = TarShardDataset(packed, transform=np.asarray)
    edit_index(copy, edit)
    with pytest.warns(UserWarning, match="arrays are not those the pack's manifest records"):
        dataset = TarShardDataset(copy, transform=np.asarray)
    for index in range(len(truth)):
        image, label = dataset[index]
        assert label == truth[index][1] and np.array_equal(image, truth[index][0])
    assert verify(copy).ok  # the index rebuilt from the shard is the one the manifest records


def test_a_pack_without_index_digests_reads_but_verify_cannot_vouch(copy: Path) -> None:
    manifest = copy / "fastloader-tar.json"
    raw = json.loads(manifest.read_bytes())
    for entry in raw["shards"]:
        del entry["index_sha256"]
    manifest.write_text(json.dumps({**raw, "version": 3}))
    assert len(TarShardDataset(copy)) == 12
    assert verify(copy).problems == (
        f"{copy}: cannot vouch for this tar pack's indexes when it is read: its manifest records no digest of each "
        "shard's index (written by an older fastloader). verify checked every index against its shard now, but a "
        "reader does not check them when it opens the pack; pack it again",
    )
    edit_index(copy, flip_labels)  # still found by the rescan
    assert any("sample 0 (key '000000000'): label" in problem for problem in verify(copy).problems)
