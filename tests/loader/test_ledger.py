"""DataLoaderX(ledger=): what the training loop received, recorded, and compared across runs (fastloader.ledger)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import ImageFolder
from fastloader.errors import FormatError
from fastloader.ledger import diff_ledgers, read_ledger, summary
from tests.helpers import CHILD_TIMEOUT_S, ROOT, kill, wait_until
from tests.images import image_bytes, write_image_folder


class Indices(Dataset[int]):
    def __init__(self, length: int = 40) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        return index


def folder_loader(root: Path, ledger: Path | str, **options: Any) -> DataLoaderX[Any]:
    dataset = ImageFolder(root, transform=T.Compose([T.Resize(40), T.CenterCrop(32)]))
    settings: dict[str, Any] = {"batch_size": 4, "shuffle": True, "seed": 7, "num_workers": 0}
    settings.update(options)
    return DataLoaderX(dataset, ledger=str(ledger), **settings)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ledger") / "train"
    write_image_folder(root, count=36)
    return root


@pytest.mark.parametrize("workers", [0, 2])
def test_a_run_resumed_in_a_fresh_loader_compares_equal_to_an_uninterrupted_one(
    folder: Path, tmp_path: Path, workers: int
) -> None:
    whole = folder_loader(folder, tmp_path / "whole", num_workers=workers)
    for _ in range(3):
        for _ in whole:
            pass
    cut = random.Random(workers).randrange(1, 8)  # a batch of epoch 1 (9 batches an epoch)
    first = folder_loader(folder, tmp_path / "resumed", num_workers=workers)
    for _ in first:
        pass
    iterator = iter(first)
    for _ in range(cut):
        next(iterator)
    state = json.loads(json.dumps(first.state_dict()))
    next(iterator), next(iterator)  # delivered after the state, before the "crash": the resumed run does them again
    del iterator, first
    second = folder_loader(folder, tmp_path / "resumed", num_workers=workers)
    second.load_state_dict(state)
    for _ in range(2):  # the rest of epoch 1, then epoch 2
        for _ in second:
            pass
    del second
    diff = diff_ledgers(tmp_path / "whole", tmp_path / "resumed")
    assert diff.same, str(diff)
    assert str(diff) == "same samples, same order, same bytes in 3 epochs (108 samples)"
    resumed = read_ledger(tmp_path / "resumed").ranks[0].epochs[1]
    assert resumed.iterations == 2 and len(resumed.keys) == 36
    assert all(key.startswith("class_") for key in resumed.keys) and None not in resumed.crcs


def test_the_keys_and_digests_are_the_datasets_keys_and_the_crc32c_of_the_files(folder: Path, tmp_path: Path) -> None:
    import crc32c

    loader = folder_loader(folder, tmp_path / "l", shuffle=False, num_workers=2)
    for _ in loader:
        pass
    epoch = read_ledger(tmp_path / "l").ranks[0].epochs[0]
    dataset = loader.dataset
    assert epoch.keys == [dataset.source.key(i) for i in range(len(dataset))]  # type: ignore[attr-defined]
    assert epoch.crcs == [crc32c.crc32c((folder / key).read_bytes()) for key in epoch.keys]


class Doubling(torch.utils.data.Sampler[int]):
    """0..n-1, with ``index`` delivered in place of ``replaced`` (None: ``replaced`` left out)."""

    def __init__(self, n: int, replaced: int, index: int | None) -> None:
        self.order = [index if i == replaced else i for i in range(n)]
        self.order = [i for i in self.order if i is not None]

    def __iter__(self) -> Any:
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)


def test_a_sample_doubled_or_missing_is_named(folder: Path, tmp_path: Path) -> None:
    def run(path: Path, sampler: Any) -> None:
        for _ in folder_loader(folder, path, shuffle=None, seed=None, sampler=sampler):
            pass

    run(tmp_path / "a", Doubling(36, 6, 6))
    run(tmp_path / "doubled", Doubling(36, 6, 5))
    run(tmp_path / "missing", Doubling(36, 6, None))
    keys = read_ledger(tmp_path / "a").ranks[0].epochs[0].keys
    doubled = diff_ledgers(tmp_path / "a", tmp_path / "doubled")
    assert doubled.first is not None and doubled.first.kind == "doubled" and doubled.first.position == 6
    assert str(doubled) == f"rank 0, epoch 0, position 6: key {keys[5]} delivered twice in B"
    missing = diff_ledgers(tmp_path / "a", tmp_path / "missing")
    assert missing.first is not None and missing.first.kind == "missing"
    assert str(missing) == f"rank 0, epoch 0, position 6: key {keys[6]} missing in B (delivered in A)"
    swapped = Doubling(36, 6, 6)
    swapped.order[6], swapped.order[7] = 7, 6
    run(tmp_path / "swapped", swapped)
    reordered = diff_ledgers(tmp_path / "a", tmp_path / "swapped")
    assert reordered.first is not None and reordered.first.kind == "reordered" and reordered.first.position == 6


def test_same_key_with_other_bytes_is_named(tmp_path: Path) -> None:
    root = tmp_path / "train"
    items = write_image_folder(root, count=12)
    for _ in folder_loader(root, tmp_path / "before", shuffle=False):
        pass
    key = items[3][0]
    (root / key).write_bytes(image_bytes(100 + 3 * 6))  # another image of the same kind, under the same name
    for _ in folder_loader(root, tmp_path / "after", shuffle=False):
        pass
    diff = diff_ledgers(tmp_path / "before", tmp_path / "after")
    assert diff.first is not None and diff.first.kind == "other bytes" and diff.first.key == key
    assert str(diff).startswith(f"rank 0, epoch 0, position 3: key {key}: other bytes (CRC32C ")


_CHILD = """
import sys, time
from fastloader import DataLoaderX
from tests.loader.test_ledger import Indices
loader = DataLoaderX(Indices(400), batch_size=4, shuffle=False, num_workers=2, ledger=sys.argv[1])
for number, batch in enumerate(loader):
    if number == 4:
        print("received 5 batches", flush=True)
        time.sleep(3600)  # SIGKILLed here, mid-epoch
"""


def test_a_training_process_killed_mid_epoch_leaves_a_ledger_whose_flushed_part_reads(tmp_path: Path) -> None:
    path = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:

        def five_batches() -> bool:
            return path.exists() and sum(map(len, _epochs(path))) >= 20

        assert wait_until(lambda: five_batches() or process.poll() is not None, CHILD_TIMEOUT_S), "no ledger"
    finally:
        stdout, stderr = kill(process)
    assert process.returncode == -9, stderr
    assert _epochs(path) == [[str(i) for i in range(20)]]
    with open(path, "ab") as file:  # what a kill in the middle of a write leaves: a torn block
        file.write(bytes.fromhex("464c424c") + b"\x40\x00\x00\x00torn")
    ledger = read_ledger(path)
    assert ledger.ranks[0].epochs[0].keys == [str(i) for i in range(20)]
    assert len(ledger.notes) == 1 and "the tail a crash cut short" in ledger.notes[0]
    # The next run appends after the torn bytes: they are skipped, the rest reads.
    for _ in DataLoaderX(Indices(8), batch_size=4, ledger=str(path)):
        pass
    ledger = read_ledger(path)
    assert ledger.ranks[0].epochs[0].keys == [str(i) for i in range(8)] and "skipped" in ledger.notes[0]


def _epochs(path: Path) -> list[list[str]]:
    return [epoch.keys for epoch in read_ledger(path).ranks[0].epochs.values()]


def test_each_rank_writes_its_own_file_and_the_diff_goes_rank_by_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")

    def run(name: str, rank: int, stop: int | None = None) -> dict[str, Any] | None:
        monkeypatch.setenv("RANK", str(rank))
        loader = DataLoaderX(
            Indices(40), batch_size=4, shuffle=True, seed=5, distributed=True, ledger=str(tmp_path / name)
        )
        if stop is None:
            for _ in range(2):
                for _ in loader:
                    pass
            return None
        iterator = iter(loader)
        for _ in range(stop):
            next(iterator)
        return loader.state_dict()

    for rank in (0, 1):
        run("whole.{rank}", rank)
    run("resumed.{rank}", 0)
    state = run("resumed.{rank}", 1, stop=3)
    monkeypatch.setenv("RANK", "1")
    loader = DataLoaderX(
        Indices(40), batch_size=4, shuffle=True, seed=5, distributed=True, ledger=str(tmp_path / "resumed.{rank}")
    )
    loader.load_state_dict(state)  # type: ignore[arg-type]
    for _ in range(2):
        for _ in loader:
            pass
    assert sorted(os.listdir(tmp_path)) == ["resumed.0", "resumed.1", "whole.0", "whole.1"]
    diff = diff_ledgers(tmp_path / "whole.{rank}", tmp_path / "resumed.{rank}")
    assert (
        str(diff)
        == "same samples, same order in 4 epochs of 2 ranks (80 samples; bytes not compared where not digested)"
    )
    os.remove(tmp_path / "resumed.1")
    missing = diff_ledgers(tmp_path / "whole.{rank}", tmp_path / "resumed.{rank}")
    assert missing.first is not None and str(missing.first) == "rank 1, epoch 0: no ledger of rank 1 in B"


class Stream(IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(10))


def test_an_iterable_dataset_is_recorded_by_its_batches_positions(tmp_path: Path) -> None:
    for _ in DataLoaderX(Stream(), batch_size=4, ledger=str(tmp_path / "l")):
        pass
    ledger = read_ledger(tmp_path / "l")
    assert ledger.ranks[0].epochs[0].keys == ["batch 0", "batch 1", "batch 2"]
    assert summary(ledger) == ["rank 0, epoch 0: 3 samples (0 with digests)"]


def test_a_file_that_is_no_ledger_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("my notes\n")
    with pytest.raises(FormatError, match="notes.txt: not a fastloader ledger"):
        iter(DataLoaderX(Indices(8), batch_size=4, ledger=str(path)))
    with pytest.raises(ValueError, match="ledger must be None or a path"):
        DataLoaderX(Indices(8), ledger=3)  # type: ignore[arg-type]
