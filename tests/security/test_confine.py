"""confine=True: nothing is read from outside a folder's or a file list's root, with real links on disk."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fastloader import DataLoaderX
from fastloader.cli import main
from fastloader.datasets import ParquetDataset
from fastloader.datasets.folder import FileListDataset, FileListSource, FolderSource, ImageFolder
from fastloader.errors import OutsideRoot
from fastloader.pack.engine import pack
from fastloader.pack.scan import scan
from fastloader.transforms import CenterCrop, Compose, Resize
from tests.datasets.test_parquet_by_path import HF_IMAGE
from tests.images import distinct_photo, image_bytes, pack_contents


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


def test_confined_pack_packs_nothing_from_outside(tmp_path: Path) -> None:
    root, outside = make_tree(tmp_path)
    summary = pack(root, tmp_path / "out", workers=0, progress=False, confine=True)
    assert sorted(key for key, _, _ in pack_contents(tmp_path / "out")) == ["a/inside.jpg", "b/plain.jpg"]
    assert {data for _, _, data in pack_contents(tmp_path / "out")} == {image_bytes(0)}
    refused = {item.key: item.reason for item in summary.skipped}
    assert set(refused) == {"a/leak.jpg", "c/x.jpg"}
    expected = f"OutsideRoot: a/leak.jpg: points outside the root {root}/ (to {outside / 'secret.jpg'})"
    assert expected in refused["a/leak.jpg"]
    assert summary.outside == 0


def test_unconfined_pack_packs_them_and_says_so(tmp_path: Path) -> None:
    root, outside = make_tree(tmp_path)
    summary = pack(root, tmp_path / "out", workers=0, progress=False)
    assert len(pack_contents(tmp_path / "out")) == 4 and not summary.skipped
    assert summary.outside == 2
    text = summary.format_text()
    assert f"read 2 samples from outside the source's root, e.g. a/leak.jpg -> {outside / 'secret.jpg'}" in text


def test_pack_command_confines_a_file_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    listing, absolute = write_list(tmp_path)
    argv = ["pack", str(listing), str(tmp_path / "out"), "--workers", "0", "--no-progress", "--max-skipped", "1"]
    assert main([*argv, "--confine"]) == 0
    assert [key for key, _, _ in pack_contents(tmp_path / "out")] == ["in.jpg"]
    skipped = (tmp_path / "out.skipped.tsv").read_text()
    assert "../secret.jpg" in skipped and str(tmp_path / "secret.jpg") in skipped and str(absolute) in skipped
    assert "from outside" not in capsys.readouterr().out
    assert main([*argv[:2], str(tmp_path / "open"), *argv[3:]]) == 0
    assert len(pack_contents(tmp_path / "open")) == 3
    expected = f"read 2 samples from outside the source's root, e.g. ../secret.jpg -> {tmp_path / 'secret.jpg'}"
    assert expected in capsys.readouterr().out


def test_scan_counts_or_refuses_what_lies_outside(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, outside = make_tree(tmp_path)
    report = scan(root, report=tmp_path / "bad.tsv", workers=0, progress=False)
    assert not report.bad and report.outside == 2
    assert f"read 2 samples from outside the source's root, e.g. a/leak.jpg -> {outside / 'secret.jpg'}" in (
        report.format_text()
    )
    argv = ["scan", str(root), "--report", str(tmp_path / "bad2.tsv"), "--workers", "0", "--no-progress", "--confine"]
    assert main(argv) == 0
    assert "bad: 2" in capsys.readouterr().out
    bad = (tmp_path / "bad2.tsv").read_text()
    assert "a/leak.jpg" in bad and "c/x.jpg" in bad and str(outside / "classdir" / "x.jpg") in bad


def test_confine_refuses_image_paths_that_lead_outside_the_root(tmp_path: Path) -> None:
    """Rows naming ``../``, an absolute path and a symbolic link out, beside one inside: under confine=True
    only the one inside is read, the others are OutsideRoot naming the row and the path; without it every
    one reads the file outside (what a stranger's set can make a reader, and `pack`, read)."""
    root, secret = tmp_path / "set", tmp_path / "secret.jpg"
    (root / "images").mkdir(parents=True)
    secret.write_bytes(distinct_photo(1))
    (root / "images" / "0000.jpg").write_bytes(distinct_photo(0))
    (root / "images" / "link.jpg").symlink_to(secret)
    paths = ["images/0000.jpg", "../secret.jpg", str(secret), "images/link.jpg"]
    parquet = root / "train.parquet"
    image = pa.array([{"bytes": None, "path": path} for path in paths], HF_IMAGE)
    pq.write_table(pa.table({"image": image, "label": pa.array([0, 1, 2, 3], pa.int64())}), parquet)

    loose = ParquetDataset(parquet, root=root)
    assert [loose.source.read(i) for i in range(4)] == [distinct_photo(0)] + [distinct_photo(1)] * 3
    confined = ParquetDataset(parquet, root=root, confine=True)
    assert confined.source.read(0) == distinct_photo(0)
    for row, path in enumerate(paths[1:], start=1):
        with pytest.raises(OutsideRoot) as raised:
            confined.source.read(row)
        message = str(raised.value)
        assert message.startswith(f"{parquet}#{row}: column 'image': image path {path!r}: points outside the root")
        assert f"(to {secret})" in message and "confine=True" in message
    with pytest.raises(ValueError, match="confine=True needs root="):
        ParquetDataset(parquet, confine=True)
    # pack and scan take --confine for Parquet too: the three rows are bad samples, named, nothing read.
    report = scan(str(parquet), root=str(root), confine=True, workers=0, progress=False, report=tmp_path / "bad.tsv")
    assert [bad.position for bad in report.bad] == [1, 2, 3]
    assert all("points outside the root" in bad.reason for bad in report.bad)


@pytest.mark.parametrize("policy", ["skip", "replace"])
def test_a_confined_folder_with_a_link_out_takes_the_decoded_cache_and_its_policy_drops_the_link(
    tmp_path: Path, policy: str
) -> None:
    """The decoded cache reads a few spread samples to fingerprint its source: one confine refuses is the error
    policy's when it is read as an item, not a failure of set_cache (a link out, found by the fuzz oracle)."""
    root, _ = make_tree(tmp_path)
    dataset = ImageFolder(root, transform=Compose([Resize(16), CenterCrop(16)]), confine=True)
    dataset.set_error_policy(policy, quarantine=tmp_path / "quarantine.tsv")
    dataset.set_cache(tmp_path / "cache")
    labels = [int(label) for _, labels in DataLoaderX(dataset, batch_size=4) for label in labels]
    # a/ is 0, b/ 1; replaced: a/leak.jpg by b/plain.jpg, c/x.jpg by a/inside.jpg (the next good sample)
    assert sorted(labels) == ([0, 1] if policy == "skip" else [0, 0, 1, 1])
