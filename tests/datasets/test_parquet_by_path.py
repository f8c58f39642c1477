"""ParquetDataset over a Hugging Face image dataset built from file paths (``{bytes: null, path}`` rows),
written and read back by the real ``datasets`` package, which is the control: the same pixels and labels,
through DataLoaderX with workers against torch's DataLoader over the ``datasets`` dataset."""

from __future__ import annotations

import io
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from fastloader import DataLoaderX
from fastloader.datasets import ParquetDataset
from fastloader.errors import FormatError, ImagePathError
from fastloader.formats import bad_samples
from tests.images import distinct_photo, write_hf_by_path

datasets = pytest.importorskip("datasets")
datasets.disable_progress_bars()
HF_IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # the Arrow type of datasets' Image


@pytest.fixture()
def by_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[tuple[str, int, bytes]]]:
    """The set in ``tmp_path/set``, and the test run from there (its relative paths lead to the images)."""
    directory = tmp_path / "set"
    items = write_hf_by_path(directory)
    monkeypatch.chdir(directory)
    return directory, items


def hf_dataset(parquet: Path, cache: Path) -> Any:
    """The ``datasets`` Dataset read from ``parquet`` (its cache kept in the test's directory)."""
    return datasets.Dataset.from_parquet(str(parquet), cache_dir=str(cache))


def pixels(image: Image.Image) -> torch.Tensor:
    """C x H x W uint8, as ``datasets``' torch format gives an image."""
    return torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)


def test_images_stored_by_path_read_as_datasets_decodes_them_through_workers(by_path, tmp_path: Path) -> None:
    directory, items = by_path
    parquet = directory / "train.parquet"
    assert pq.read_table(parquet).column("image").to_pylist()[0] == {"bytes": None, "path": "images/0000.jpg"}
    control = hf_dataset(parquet, tmp_path / "hf_cache").with_format("torch")
    ours = ParquetDataset(parquet, transform=pixels)
    assert ours.classes == ["class_0", "class_1", "class_2"]
    # The control: torch's own loader over the datasets dataset; ours: DataLoaderX with workers.
    expected = [(batch["image"], batch["label"]) for batch in DataLoader(control, batch_size=5, num_workers=2)]
    got = list(DataLoaderX(ours, batch_size=5, num_workers=2))
    assert len(got) == len(expected) == 3
    for (images, labels), (hf_images, hf_labels) in zip(got, expected):
        assert images.dtype == hf_images.dtype == torch.uint8 and images.shape == hf_images.shape
        assert torch.equal(images, hf_images) and torch.equal(labels, hf_labels)
    # And those are the files' pixels, in row order.
    for index, (_, label, data) in enumerate(items):
        image, got_label = ours[index]
        assert got_label == label and torch.equal(image, pixels(Image.open(io.BytesIO(data))))


def test_a_set_moved_elsewhere_reads_with_root(by_path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory, items = by_path
    moved = tmp_path / "moved"
    shutil.move(directory, moved)
    monkeypatch.chdir(tmp_path)  # the paths are relative: from here they lead nowhere
    parquet = moved / "train.parquet"
    with pytest.raises(ImagePathError) as raised:
        ParquetDataset(parquet)[2]
    message = str(raised.value)
    assert f"{parquet}#2" in message and "'images/0002.jpg'" in message and str(tmp_path / "images/0002.jpg") in message
    assert isinstance(raised.value, OSError) and "No such file" in message
    # datasets fails the same way here: the path is relative to the current directory, not to the file.
    with pytest.raises(FileNotFoundError):
        hf_dataset(parquet, tmp_path / "hf_cache")[2]
    for root in (moved, os.path.relpath(moved)):  # a relative root is taken from where the dataset is made
        dataset = ParquetDataset(parquet, transform=pixels, root=root)
        for index, (_, label, data) in enumerate(items):
            image, got_label = dataset[index]
            assert got_label == label and torch.equal(image, pixels(Image.open(io.BytesIO(data))))
    with pytest.raises(ValueError, match="root='nowhere' is not a directory"):
        ParquetDataset(parquet, root="nowhere")


def test_an_absolute_path_stays_absolute_under_root(tmp_path: Path) -> None:
    image = tmp_path / "elsewhere.jpg"
    image.write_bytes(distinct_photo(3))
    table = pa.table({"image": pa.array([{"bytes": None, "path": str(image)}], HF_IMAGE), "label": [1]})
    pq.write_table(table, tmp_path / "abs.parquet")
    (tmp_path / "root").mkdir()
    dataset = ParquetDataset(tmp_path / "abs.parquet", transform=pixels, root=tmp_path / "root")
    assert torch.equal(dataset[0][0], pixels(Image.open(image)))


def test_a_missing_file_names_row_and_path_and_skip_drops_it(by_path, tmp_path: Path, caplog) -> None:
    directory, items = by_path
    (directory / "images/0003.jpg").unlink()
    dataset = ParquetDataset(directory / "train.parquet", transform=pixels)
    with pytest.raises(
        ImagePathError, match=r"train\.parquet#3: column 'image': cannot read image path 'images/0003.jpg'"
    ):
        dataset[3]
    quarantine = tmp_path / "q.tsv"
    dataset.set_error_policy("skip", quarantine=quarantine)
    labels = torch.cat([batch[1] for batch in DataLoaderX(dataset, batch_size=4, num_workers=2)])
    assert labels.tolist() == [label for i, (_, label, _) in enumerate(items) if i != 3]
    (found,) = bad_samples.read(quarantine)
    assert found.position == 3 and "ImagePathError" in found.reason and "'images/0003.jpg'" in found.reason
    # Logged where it was found (here in this process: a fresh quarantine, so it is news again).
    dataset.set_error_policy("skip", quarantine=tmp_path / "q2.tsv")
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        assert len(list(DataLoaderX(dataset, batch_size=4))) == 3
    assert "bad sample" in caplog.text and "position 3" in caplog.text and "images/0003.jpg" in caplog.text


def test_a_fifo_named_as_an_image_is_an_error_not_a_hang(by_path) -> None:
    directory, _ = by_path
    (directory / "images/0001.jpg").unlink()
    os.mkfifo(directory / "images/0001.jpg")  # opened blindly, a FIFO waits for a writer forever
    with pytest.raises(ImagePathError, match=r"#1: .*'images/0001.jpg'.*not a regular file"):
        ParquetDataset(directory / "train.parquet")[1]


def test_rows_with_bytes_read_them_and_rows_with_neither_have_no_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    embedded = distinct_photo(0)
    (tmp_path / "on_disk.jpg").write_bytes(distinct_photo(1))
    rows = [
        {"bytes": embedded, "path": "not_there.jpg"},  # the bytes win, as in datasets: the path is never opened
        {"bytes": None, "path": "on_disk.jpg"},
        {"bytes": None, "path": None},
        None,
        {"bytes": None, "path": "hf://datasets/someone/set/0.jpg"},
    ]
    monkeypatch.chdir(tmp_path)  # where datasets looks for the relative path, when writing and reading
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    datasets.Dataset.from_dict({"image": rows[:2], "label": [0, 1]}, features=features).to_parquet(
        str(tmp_path / "hf.parquet")
    )
    assert pq.read_schema(tmp_path / "hf.parquet").field("image").type == HF_IMAGE
    table = pa.table({"image": pa.array(rows, HF_IMAGE)})
    pq.write_table(table, tmp_path / "mixed.parquet")
    dataset = ParquetDataset(tmp_path / "mixed.parquet", root=tmp_path)
    assert dataset.source.read(0) == embedded and dataset.source.read(1) == distinct_photo(1)
    for row in (2, 3):
        with pytest.raises(FormatError, match=rf"mixed\.parquet#{row}: no image \(null in column 'image'\)"):
            dataset.source.read(row)
    with pytest.raises(ImagePathError, match="#4: .*'hf://datasets/someone/set/0.jpg' is not a local file"):
        dataset.source.read(4)
    # datasets reads the file it wrote with embedded bytes and with a path alike: so do we.
    control = hf_dataset(tmp_path / "hf.parquet", tmp_path / "hf_cache")
    ours = ParquetDataset(tmp_path / "hf.parquet", transform=pixels)
    for index in range(2):
        assert torch.equal(ours[index][0], pixels(control[index]["image"])) and ours[index][1] == index
