"""DataLoaderX(ledger=) under an error policy: the ledger records what the training loop received, a skipped sample
absent, a replaced one as its substitute (its own digest) standing in for the key asked, a worker killer left out.

The datasets return their samples' indices as labels: the keys of what the loop received come from the batches.
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path
from typing import Any

import crc32c
import pytest

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import ImageFolder
from fastloader.ledger import diff_ledgers, read_ledger, summary
from tests.images import write_image_folder
from tests.loader.test_worker_restart import KILLER, Killing, N

BAD = "class_1/0004.jpg"  # written as bytes no decoder reads


def _own_index(index: int) -> int:
    return index


class KeyedFolder(ImageFolder):
    """An ImageFolder whose labels are the samples' indices: each batch says which samples it holds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._target = _own_index  # what the dataset's pipeline reads a label with


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    clean = tmp_path_factory.mktemp("ledger-policy") / "clean"
    write_image_folder(clean, count=24)
    broken = clean.parent / "broken"
    shutil.copytree(clean, broken)
    (broken / BAD).write_bytes(b"\xff\xd8\xff\xe0 not a JPEG past its first bytes")
    return clean, broken


def _run(
    root: Path, tmp_path: Path, ledger: Path, mode: str | None, workers: int
) -> tuple[KeyedFolder, list[list[str]]]:
    """Two epochs; the keys of what the loop received, epoch by epoch."""
    dataset = KeyedFolder(root, transform=T.Compose([T.Resize(40), T.CenterCrop(32)]))
    if mode is not None:
        dataset.set_error_policy(mode, quarantine=tmp_path / f"quarantine-{ledger.name}.tsv")
    loader = DataLoaderX(dataset, batch_size=4, shuffle=True, seed=3, num_workers=workers, ledger=str(ledger))
    received = []
    for _ in range(2):
        keys: list[str] = []
        for _images, labels in loader:
            keys += [dataset.source.key(int(i)) for i in labels]
        received.append(keys)
    return dataset, received


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("mode", ["skip", "replace"])
def test_the_ledger_holds_the_keys_the_loop_received_and_their_own_bytes(
    folders: tuple[Path, Path], tmp_path: Path, mode: str, workers: int
) -> None:
    _, broken = folders
    dataset, received = _run(broken, tmp_path, tmp_path / "ledger", mode, workers)
    epochs = read_ledger(tmp_path / "ledger").ranks[0].epochs
    assert [epochs[e].keys for e in (0, 1)] == received
    for epoch in (0, 1):
        deliveries = epochs[epoch]
        assert BAD not in deliveries.keys
        # Each delivered sample's digest is of its own file: a substitute's too.
        assert deliveries.crcs == [crc32c.crc32c((broken / key).read_bytes()) for key in deliveries.keys]
        if mode == "skip":
            assert len(deliveries.keys) == len(dataset) - 1
            assert [key for _, key in deliveries.skipped] == [BAD] and deliveries.replaced == {}
        else:
            assert len(deliveries.keys) == len(dataset)
            [(position, asked)] = deliveries.replaced.items()
            assert asked == BAD and deliveries.keys[position] != BAD and deliveries.skipped == []
    assert summary(read_ledger(tmp_path / "ledger"))[0].endswith(
        ", 0 replaced, 1 skipped)" if mode == "skip" else ", 1 replaced, 0 skipped)"
    )


@pytest.mark.parametrize("mode", ["skip", "replace"])
def test_a_diff_against_a_clean_run_names_the_sample_the_policy_left_out_or_replaced(
    folders: tuple[Path, Path], tmp_path: Path, mode: str
) -> None:
    clean, broken = folders
    _run(clean, tmp_path, tmp_path / "clean", None, 0)
    _run(broken, tmp_path, tmp_path / "policy", mode, 0)
    diff = diff_ledgers(tmp_path / "clean", tmp_path / "policy")
    assert diff.first is not None and diff.first.epoch == 0 and diff.first.key == BAD
    assert diff.first.kind == ("skipped" if mode == "skip" else "replaced")
    if mode == "skip":
        assert f"key {BAD} skipped in B" in str(diff)
    else:
        position = diff.first.position
        assert position is not None
        substitute = read_ledger(tmp_path / "policy").ranks[0].epochs[0].keys[position]
        assert f"key {BAD} replaced by {substitute} in B" in str(diff)
    reverse = diff_ledgers(tmp_path / "policy", tmp_path / "clean")
    assert reverse.first is not None and reverse.first.kind == diff.first.kind and "in A" in str(reverse)


class KeyedKilling(Killing):
    """The killer datasets of test_worker_restart, naming their samples as fastloader's datasets do."""

    @property
    def source(self) -> KeyedKilling:
        return self


@pytest.mark.parametrize("mode", ["skip", "replace"])
def test_a_sample_that_kills_its_worker_is_absent_from_the_ledger(tmp_path: Path, mode: str) -> None:
    dataset = KeyedKilling(KILLER, signal.SIGKILL, None, tmp_path / "quarantine.tsv", mode)
    loader = DataLoaderX(dataset, batch_size=4, num_workers=2, stall_warning=None, ledger=str(tmp_path / "ledger"))
    received = [[dataset.key(i) for batch in loader for i in batch.tolist()] for _ in range(2)]
    killer = dataset.key(KILLER)
    epochs = read_ledger(tmp_path / "ledger").ranks[0].epochs
    assert [epochs[0].keys, epochs[1].keys] == received
    for epoch in (0, 1):
        assert killer not in epochs[epoch].keys
        if mode == "skip":
            assert len(epochs[epoch].keys) == N - 1 and [key for _, key in epochs[epoch].skipped] == [killer]
        else:
            assert len(epochs[epoch].keys) == N and list(epochs[epoch].replaced.values()) == [killer]
