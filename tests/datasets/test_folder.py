"""ImageFolder and FileListDataset: torchvision's classes, order and errors; every item right through
real DataLoader workers; grayscale, CMYK and PNG-named-.jpg images decoded to RGB."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import datasets as tv_datasets

from fastloader.datasets.folder import FileListDataset, FileListSource, FolderSource, ImageFolder

SIDE = 32


def write_image(path: Path, value: int, mode: str = "RGB", image_format: str = "JPEG") -> None:
    """A flat image whose every channel decodes to about ``value`` (RGB, grayscale or CMYK)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "CMYK":
        image = Image.new("CMYK", (SIDE, SIDE), (0, 0, 0, 255 - value))  # only black ink: gray
    else:
        image = Image.new(mode, (SIDE, SIDE), (value,) * len(mode))
    image.save(path, format=image_format, quality=95)


def make_odd_tree(root: Path) -> Path:
    """Nested sub-folders, mixed-case extensions, non-image files, a symlinked directory, an empty class."""
    write_image(root / "cat" / "b.JPG", 10)
    write_image(root / "cat" / "a.jpeg", 20)
    write_image(root / "cat" / "sub" / "deep" / "c.Png", 30, image_format="PNG")
    write_image(root / "cat" / "sub-2" / "d.jpg", 40)  # "sub-2" sorts between "sub" and "sub/deep"
    write_image(root / "cat" / "sub" / "e.Bmp", 50, image_format="BMP")
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / "cat" / "sub" / "README").write_text("nor this")
    write_image(root / "dog" / "gray.jpg", 60, mode="L")
    write_image(root / "dog" / "cmyk.jpg", 70, mode="CMYK")
    write_image(root / "dog" / "png-named.jpg", 80, image_format="PNG")
    write_image(root / "elsewhere" / "shared" / "f.jpg", 90)
    os.symlink(root / "elsewhere" / "shared", root / "dog" / "linked")
    (root / "empty_class" / "sub").mkdir(parents=True)
    (root / "empty_class" / "sub" / "skip.txt").write_text("")
    (root / "stray.jpg").write_text("a file at the root is not a class")
    past = time.time() - 60
    for directory, _, _ in os.walk(root, followlinks=True):
        os.utime(directory, (past, past))
    return root


def test_same_classes_and_samples_as_torchvision(tmp_path: Path) -> None:
    root = make_odd_tree(tmp_path / "data")
    theirs = tv_datasets.ImageFolder(str(root), allow_empty=True)
    ours = ImageFolder(str(root), allow_empty=True)
    assert ours.classes == theirs.classes == ["cat", "dog", "elsewhere", "empty_class"]
    assert ours.class_to_idx == theirs.class_to_idx
    assert list(ours.samples) == theirs.samples and list(ours.imgs) == theirs.imgs
    assert isinstance(ours.targets, np.ndarray) and ours.targets.tolist() == theirs.targets
    assert ours.extensions == theirs.extensions and len(ours) == len(theirs) == 10
    assert ours.samples[-1] == theirs.samples[-1] and ours.samples[1:3] == theirs.samples[1:3]

    def is_jpeg(path: str) -> bool:
        return path.lower().endswith((".jpg", ".jpeg"))

    filtered = ImageFolder(root, is_valid_file=is_jpeg, allow_empty=True)
    assert list(filtered.samples) == tv_datasets.ImageFolder(root, is_valid_file=is_jpeg, allow_empty=True).samples
    assert filtered.extensions is None


def test_empty_class_is_an_error_unless_allowed_as_in_torchvision(tmp_path: Path) -> None:
    root = make_odd_tree(tmp_path / "data")
    with pytest.raises(FileNotFoundError, match="Found no valid file for the classes empty_class"):
        tv_datasets.ImageFolder(root)
    with pytest.raises(FileNotFoundError, match=r"data: Found no valid file for the classes empty_class\. Supported"):
        ImageFolder(root)


def to_array(image: Image.Image) -> np.ndarray:
    return np.asarray(image).copy()


def test_dataloader_workers_read_every_item_as_rgb(tmp_path: Path) -> None:
    root = make_odd_tree(tmp_path / "data")
    dataset = ImageFolder(root, transform=to_array, allow_empty=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=3, num_workers=2)
    images, labels = zip(*loader)
    pixels, targets = torch.cat(images), torch.cat(labels)
    assert pixels.shape == (10, SIDE, SIDE, 3) and pixels.dtype == torch.uint8
    assert targets.tolist() == [label for _, label in tv_datasets.ImageFolder(root, allow_empty=True).samples]
    means = pixels.float().mean(dim=(1, 2))  # per item, per channel
    by_key = {dataset.source.key(i): means[i] for i in range(len(dataset))}
    wanted = {"cat/b.JPG": 10, "cat/a.jpeg": 20, "cat/sub/deep/c.Png": 30, "cat/sub-2/d.jpg": 40, "cat/sub/e.Bmp": 50}
    wanted |= {"dog/gray.jpg": 60, "dog/cmyk.jpg": 70, "dog/png-named.jpg": 80, "dog/linked/f.jpg": 90}
    wanted |= {"elsewhere/shared/f.jpg": 90}
    assert set(by_key) == set(wanted)
    for key, value in wanted.items():
        assert torch.allclose(by_key[key], torch.full((3,), float(value)), atol=6), (key, by_key[key])


def test_a_user_loader_gets_the_path_as_in_torchvision(tmp_path: Path) -> None:
    root = make_odd_tree(tmp_path / "data")
    dataset = ImageFolder(root, loader=str.upper, target_transform=lambda label: label * 10, allow_empty=True)
    path, label = dataset.samples[4]
    assert dataset[4] == (path.upper(), label * 10) and path.startswith(str(root))


def test_a_missing_file_names_its_path(tmp_path: Path) -> None:
    root = make_odd_tree(tmp_path / "data")
    dataset = ImageFolder(root, allow_empty=True)
    gone = dataset.samples[0][0]
    os.unlink(gone)
    with pytest.raises(FileNotFoundError, match=gone):
        dataset[0]


def test_dataset_pickles_small_and_reads_the_same(tmp_path: Path) -> None:
    root = make_odd_tree(tmp_path / "data")
    dataset = ImageFolder(root, transform=to_array, allow_empty=True)
    assert dataset.targets.tolist() == [label for _, label in dataset.samples]  # maps the index here
    clone = pickle.loads(pickle.dumps(dataset))
    assert len(pickle.dumps(dataset)) < 4_000
    assert np.array_equal(clone[7][0], dataset[7][0]) and clone[7][1] == dataset[7][1]
    assert list(clone.samples) == list(dataset.samples)
    assert "Number of datapoints: 10" in repr(dataset)


def test_folder_source_paths_are_absolute_keys_relative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_odd_tree(tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    source = FolderSource("data", allow_empty=True)
    assert source.root == str(tmp_path / "data") and source.key(0) == "cat/a.jpeg"
    assert source.path(0) == str(tmp_path / "data" / "cat" / "a.jpeg")
    assert source.read(0) == (tmp_path / "data" / "cat" / "a.jpeg").read_bytes()
    dataset = ImageFolder("data", allow_empty=True)
    assert dataset.samples[0] == ("data/cat/a.jpeg", 0), "torchvision spells paths from the root as given"
    with pytest.raises(IndexError):
        source.key(len(source))


def test_file_list_dataset_in_both_formats_through_workers(tmp_path: Path) -> None:
    images = tmp_path / "images"
    write_image(images / "x" / "one.jpg", 100)
    write_image(images / "two.png", 150, image_format="PNG")
    write_image(tmp_path / "elsewhere" / "three.jpg", 200, mode="L")
    absolute = tmp_path / "elsewhere" / "three.jpg"
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists" / "train.txt").write_text(f"x/one.jpg 1\ntwo.png 0\n{absolute} 2\n")
    (tmp_path / "lists" / "train.csv").write_text(f"path,label\nx/one.jpg,1\ntwo.png,0\n{absolute},2\n")
    for name in ("train.txt", "train.csv"):
        dataset = FileListDataset(tmp_path / "lists" / name, root=images, transform=to_array, classes=["a", "b", "c"])
        assert dataset.classes == ["a", "b", "c"] and dataset.targets.tolist() == [1, 0, 2]
        assert [path for path, _ in dataset.samples] == [
            str(images / "x" / "one.jpg"),
            str(images / "two.png"),
            str(absolute),
        ]
        loader = torch.utils.data.DataLoader(dataset, batch_size=2, num_workers=2)
        pixels, labels = (torch.cat(parts) for parts in zip(*loader))
        assert labels.tolist() == [1, 0, 2] and pixels.shape == (3, SIDE, SIDE, 3)
        assert torch.allclose(
            pixels.float().mean(dim=(1, 2)), torch.tensor([[100.0] * 3, [150.0] * 3, [200.0] * 3]), atol=6
        )


def test_file_list_missing_image_names_its_path(tmp_path: Path) -> None:
    (tmp_path / "l.txt").write_text("nope/missing.jpg 0\n")
    dataset = FileListDataset(tmp_path / "l.txt")
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope" / "missing.jpg")):
        dataset[0]
    assert isinstance(dataset.source, FileListSource) and dataset.source.classes is None


def path_loader(path: str) -> Image.Image:
    """A user's loader with torchvision's contract, ``loader(path)``; refuses the files named bad*."""
    if os.path.basename(path).startswith("bad"):
        raise OSError(f"cannot read {path}")
    with Image.open(path) as image:
        return image.convert("RGB")


@pytest.mark.parametrize("policy", ["replace", "skip"])
def test_a_path_loader_goes_through_the_error_policy(tmp_path: Path, policy: str) -> None:
    """``loader(path)`` and the error policy together: one seam for ds[i], batches and bad samples."""
    root = tmp_path / "data"
    for i in range(12):
        write_image(root / f"class_{i % 2}" / f"{'bad' if i == 5 else 'ok'}_{i:02d}.jpg", 10 * i)
    dataset = ImageFolder(root, loader=path_loader, transform=to_array)
    dataset.set_error_policy(policy, quarantine=tmp_path / "bad.tsv")
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=list)
    items = [item for batch in loader for item in batch]
    assert len(items) == (12 if policy == "replace" else 11)
    assert all(isinstance(image, np.ndarray) and image.shape == (SIDE, SIDE, 3) for image, _ in items)
    bad = dataset.error_stats()
    assert bad["bad_samples"] == 1 and "OSError" in next(iter(bad["by_reason"]))
    assert dataset[0][0].shape == (SIDE, SIDE, 3)  # ds[i] takes the same path


def test_a_path_loader_gets_torchvisions_paths(tmp_path: Path) -> None:
    root = make_odd_tree(tmp_path / "data")
    seen: list[str] = []
    dataset = ImageFolder(root, loader=lambda path: seen.append(path) or path, allow_empty=True)
    theirs = tv_datasets.ImageFolder(str(root), loader=lambda path: path, allow_empty=True)
    assert [dataset[i][0] for i in range(len(dataset))] == [theirs[i][0] for i in range(len(theirs))] == seen
