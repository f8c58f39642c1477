"""A quarantine file kept across runs over a dataset that changed: its worker killers are matched by key, never by
position alone (fastloader.loader.known_killers).

Real JPEGs in a file list whose labels name the images (so a batch's labels say which images it holds); the
dataset SIGKILLs its worker for real whenever a batch it makes holds the killer's key.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets.folder import FileListDataset
from fastloader.formats import bad_samples
from tests.images import image_bytes

KILLER = 18  # the image that kills: at position 13 in the first run, 18 in the second
NEW = 5  # images added before the second run, sorting first


class KillsByKey(FileListDataset):
    """A file list whose worker dies (SIGKILL, a file in ``deaths`` first) on any batch holding ``killer``'s key."""

    def __init__(self, list_path: Path, killer: str, deaths: Path, quarantine: Path, mode: str) -> None:
        super().__init__(list_path, transform=T.Compose([T.Resize(16), T.CenterCrop(16)]))
        self.killer, self.deaths = killer, deaths
        self.set_error_policy(mode, quarantine=quarantine)

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, Any]]:
        if torch.utils.data.get_worker_info() is not None and any(self.source.key(i) == self.killer for i in indices):
            (self.deaths / str(os.getpid())).touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitems__(indices)


def _write_list(root: Path, name: str, images: range) -> Path:
    """A list of images ``images`` (image n is ``img/NNNN.jpg``, label n), in that order."""
    (root / "img").mkdir(exist_ok=True)
    lines = []
    for number in images:
        path = root / "img" / f"{number:04d}.jpg"
        if not path.exists():
            path.write_bytes(image_bytes(number))
        lines.append(f"img/{number:04d}.jpg {number}\n")
    (root / name).write_text("".join(lines))
    return root / name


def _labels(dataset: KillsByKey) -> list[list[int]]:
    loader = DataLoaderX(dataset, batch_size=4, num_workers=2, stall_warning=None)
    return [labels.tolist() for _images, labels in loader]


def _expected(images: range, mode: str) -> list[list[int]]:
    batches = [list(images)[i : i + 4] for i in range(0, len(images), 4)]
    if mode == "skip":
        return [[n for n in batch if n != KILLER] for batch in batches]
    return [[n + 1 if n == KILLER else n for n in batch] for batch in batches]  # the next image stands in


@pytest.mark.parametrize("mode", ["skip", "replace"])
def test_a_quarantine_kept_across_a_changed_dataset_leaves_out_the_killer_not_the_good_image_at_its_old_place(
    tmp_path: Path, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    quarantine, deaths, killer = tmp_path / "quarantine.tsv", tmp_path / "deaths", f"img/{KILLER:04d}.jpg"
    deaths.mkdir()

    # Run 1: 40 images; the killer, at position 13, is hunted and quarantined there.
    first = range(NEW, NEW + 40)
    run1 = KillsByKey(_write_list(tmp_path, "run1.txt", first), killer, deaths, quarantine, mode)
    assert _labels(run1) == _expected(first, mode)
    assert [(s.position, s.key) for s in bad_samples.read(quarantine)] == [(KILLER - NEW, killer)]
    killed_in_run1 = len(list(deaths.iterdir()))
    assert killed_in_run1 >= 2

    # Run 2: five new images sort first, the same quarantine. The good image now at position 13 is delivered,
    # the killer (now at 18) is known by its key: no worker dies, and its new position is recorded.
    second = range(0, NEW + 40)
    run2 = KillsByKey(_write_list(tmp_path, "run2.txt", second), killer, deaths, quarantine, mode)
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        assert _labels(run2) == _expected(second, mode)
    assert len(list(deaths.iterdir())) == killed_in_run1
    lines = [(s.position, s.key) for s in bad_samples.read(quarantine)]
    assert lines == [(KILLER - NEW, killer), (KILLER, killer)]
    assert any(killer in message and f"position {KILLER}" in message for message in caplog.messages)

    # Run 3 finds it at its new position straight from the file, with no search.
    run3 = KillsByKey(tmp_path / "run2.txt", killer, deaths, quarantine, mode)
    assert _labels(run3) == _expected(second, mode)
    assert len(list(deaths.iterdir())) == killed_in_run1 and len(bad_samples.read(quarantine)) == 2
