"""A sample found bad stays bad for the run: whatever the crop, in every worker process and every epoch, and
never read again (real JPEGs cut short and closed by an end marker, real worker processes, several epochs)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import torch
from PIL import Image

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import ImageDataset
from fastloader.errors import DecodeError
from fastloader.image import jpeg_ext
from fastloader.sample import PHOTOS

pytestmark = pytest.mark.skipif(not jpeg_ext.AVAILABLE, reason="fastloader.image._jpeg not built")

COUNT, BAD = 20, 7
TRAIN = T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip()])


class WatchedFiles:
    """Image files as a source (label = position); every read of the file named ``watched`` is appended
    to ``log``, from whichever process reads it."""

    def __init__(self, files: list[Path], watched: str, log: Path) -> None:
        self.files, self.watched, self.log = files, watched, log

    def __len__(self) -> int:
        return len(self.files)

    def read(self, index: int) -> bytes:
        if self.files[index].name == self.watched:
            with open(self.log, "a") as log:
                log.write(f"{os.getpid()}\n")
        return self.files[index].read_bytes()

    def label(self, index: int) -> int:
        return index

    def key(self, index: int) -> str:
        return self.files[index].name


def photos(root: Path) -> list[Path]:
    """``COUNT`` real photos (300x225); the one at ``BAD`` cut at 60% and closed with FFD9: its top rows decode."""
    root.mkdir()
    files = []
    for i in range(COUNT):
        image = Image.open(sorted(PHOTOS.glob("*.jpg"))[i % 5]).convert("RGB").resize((300 + i, 225))
        out = io.BytesIO()
        image.save(out, "JPEG", quality=90)
        data = out.getvalue()
        if i == BAD:
            data = data[: len(data) * 6 // 10] + b"\xff\xd9"
        files.append(root / f"{i:03d}{'_cut' if i == BAD else ''}.jpg")
        files[-1].write_bytes(data)
    return files


def reads(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.parametrize("mode", ["skip", "replace"])
def test_a_truncated_file_is_bad_in_every_epoch_and_worker_and_never_read_again(tmp_path: Path, mode: str) -> None:
    files, log = photos(tmp_path / "images"), tmp_path / "reads.log"
    dataset = ImageDataset(WatchedFiles(files, files[BAD].name, log), transform=TRAIN)
    dataset.set_error_policy(mode, quarantine=tmp_path / "q.tsv")
    loader = DataLoaderX(dataset, batch_size=4, shuffle=True, num_workers=2)
    read_after_first = None
    for epoch in range(4):
        labels = torch.cat([labels for _, labels in loader]).tolist()
        assert BAD not in labels, f"epoch {epoch}: the bad file was delivered"
        if mode == "skip":
            assert sorted(labels) == [i for i in range(COUNT) if i != BAD], f"epoch {epoch}"
        else:  # the next sample stands in, every epoch
            assert len(labels) == COUNT and labels.count(BAD + 1) == 2, f"epoch {epoch}"
        if epoch == 0:
            read_after_first = reads(log)
            assert read_after_first >= 1
    assert reads(log) == read_after_first, "a sample found bad was read again in a later epoch"
    stats = dataset.error_stats()
    assert stats["bad_samples"] == 1
    lines = (tmp_path / "q.tsv").read_text().splitlines()
    assert len(lines) == 1 and lines[0].split("\t")[:2] == [str(BAD), files[BAD].name]
    assert "Premature end" in lines[0] or "premature end" in lines[0]


def test_raise_names_a_found_bad_file_again_without_decoding_it(tmp_path: Path) -> None:
    files, log = photos(tmp_path / "images"), tmp_path / "reads.log"
    dataset = ImageDataset(WatchedFiles(files, files[BAD].name, log), transform=TRAIN)
    dataset.set_error_policy("raise", quarantine=tmp_path / "q.tsv")
    torch.manual_seed(0)
    for _ in range(5):
        with pytest.raises(DecodeError, match=files[BAD].name):
            dataset[BAD]
    assert reads(log) == 1 and dataset.error_stats()["bad_samples"] == 1


def test_a_stale_quarantine_line_excludes_nothing(tmp_path: Path) -> None:
    """A quarantine reused after the dataset changed: a position whose key is no longer the sample's is read."""
    files = photos(tmp_path / "images")
    quarantine = tmp_path / "q.tsv"
    quarantine.write_text("3\tsome_other_file.jpg\tundecodable: DecodeError: gone\n")
    dataset = ImageDataset(WatchedFiles(files, "", tmp_path / "reads.log"), transform=TRAIN)
    dataset.set_error_policy("skip", quarantine=quarantine)
    labels = torch.cat([labels for _, labels in DataLoaderX(dataset, batch_size=4)]).tolist()
    assert sorted(labels) == [i for i in range(COUNT) if i != BAD]
