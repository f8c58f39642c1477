"""num_workers="auto": measured on the pipeline within a time budget, more workers where they pay, the same
batches as by hand, and an IterableDataset never multiplied by its workers."""

from __future__ import annotations

import fcntl
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from fastloader import DataLoaderX, world
from fastloader.loader import autotune
from fastloader.loader.autotune import Auto, candidates

WORK_S = 0.012  # per sample


class DecodeBound(Dataset[torch.Tensor]):
    """Each sample takes WORK_S of its worker's own time (as a decode on its own core does): more workers,
    more samples per second. A sleep, not a busy loop, so that the cost does not depend on how busy the
    machine is (a busy loop on a loaded 2-core machine gains nothing from a second worker)."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(WORK_S)
        return torch.tensor(index)


class ReadBound(Dataset[torch.Tensor]):
    """Storage that serves one read at a time (a saturated disk): more workers only queue up on it."""

    def __init__(self, lock_path: str) -> None:
        self.lock_path = lock_path

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int) -> torch.Tensor:
        with open(self.lock_path, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            # 3 x WORK_S: what a second worker overlaps (its IPC, the main process's share) stays a few per
            # cent of the lock's time on a loaded machine, well under autotune's 10% step
            time.sleep(3 * WORK_S)
            fcntl.flock(lock, fcntl.LOCK_UN)
        return torch.tensor(index)


class Draws(Dataset[torch.Tensor]):
    """Its items depend on the worker's random seed: a changed seed changes them."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.stack([torch.tensor(index), torch.randint(0, 1 << 30, ())])


def test_candidates_rise_to_the_cores() -> None:
    assert candidates(1) == [1]
    assert candidates(2) == [1, 2]
    assert candidates(6) == [1, 2, 4, 6]
    assert candidates(8) == [1, 2, 4, 8]


@pytest.mark.skipif(world.cores_per_rank() < 2, reason="autotune tries a second worker only with two cores")
def test_decode_bound_gets_more_workers_than_read_bound(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="fastloader"):
        decode = DataLoaderX(DecodeBound(), batch_size=4, shuffle=True, num_workers="auto")
        next(iter(decode))
        read = DataLoaderX(ReadBound(str(tmp_path / "disk.lock")), batch_size=4, shuffle=True, num_workers="auto")
        next(iter(read))
    decode_choice, read_choice = decode.stats()["autotune"], read.stats()["autotune"]
    assert decode.num_workers >= 2 and read.num_workers == 1, (decode_choice, read_choice)
    assert [t["num_workers"] for t in decode_choice["trials"]][:2] == [1, 2]
    rates = [t["images_per_s"] for t in read_choice["trials"]]
    assert rates[1] < 1.1 * rates[0]  # the measurement that made it stop
    logged = [r.getMessage() for r in caplog.records if "'auto'" in r.getMessage()]
    assert len(logged) == 2 and f"{decode.num_workers} workers" in logged[0] and "1 worker " in logged[1]


def test_the_same_batches_as_the_chosen_number_given_by_hand() -> None:
    torch.manual_seed(7)
    auto = DataLoaderX(Draws(), batch_size=8, shuffle=True, num_workers="auto", prefetch_factor="auto")
    got = [batch.tolist() for batch in auto]
    chosen = auto.num_workers
    assert type(chosen) is int and chosen >= 1 and type(auto.prefetch_factor) is int
    torch.manual_seed(7)
    by_hand = DataLoaderX(Draws(), batch_size=8, shuffle=True, num_workers=chosen, prefetch_factor=auto.prefetch_factor)
    assert got == [batch.tolist() for batch in by_hand]  # order, and the workers' random draws
    assert auto.stats()["autotune"]["num_workers"] == chosen
    assert auto.stats()["autotune"]["reason"] == "measured"
    assert [batch.tolist() for batch in auto] != got  # the next epoch reshuffles as usual


def test_auto_before_the_first_epoch_is_an_int_that_a_rebuilt_loader_keeps() -> None:
    loader = DataLoaderX(Draws(), batch_size=8, num_workers="auto")
    assert isinstance(loader.num_workers, Auto) and loader.num_workers >= 1  # frameworks compare it with ints
    rebuilt = DataLoaderX(Draws(), batch_size=8, num_workers=loader.num_workers)  # as Lightning rebuilds
    assert isinstance(rebuilt.num_workers, Auto)
    assert loader.stats()["autotune"] is None
    list(rebuilt)
    assert not isinstance(rebuilt.num_workers, Auto) and rebuilt.stats()["autotune"] is not None


def test_bad_auto_values_are_refused() -> None:
    with pytest.raises(ValueError, match="num_workers"):
        DataLoaderX(Draws(), num_workers="many")
    with pytest.raises(ValueError, match="prefetch_factor='auto' needs worker processes"):
        DataLoaderX(Draws(), num_workers=0, prefetch_factor="auto")


class Stream(IterableDataset[int]):
    """Items 0..9, the same in every copy: as most IterableDatasets, it leaves the workers to torch."""

    def __iter__(self) -> Iterator[int]:
        return iter(range(10))


class ShardedStream(Stream):
    """Items 0..9 split between the workers by torch's convention, and saying so."""

    shards_by_worker = True

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        if info is None:
            return iter(range(10))
        return iter(range(info.id, 10, info.num_workers))


def test_an_iterable_dataset_gives_each_item_once_under_auto(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="fastloader"):
        loader = DataLoaderX(Stream(), batch_size=2, num_workers="auto")
        items = sorted(int(i) for batch in loader for i in batch)
    assert items == list(range(10)) and loader.num_workers == 0 and loader.prefetch_factor is None
    assert loader.stats()["autotune"]["reason"].startswith("not measured: Stream is an IterableDataset")
    (record,) = [r for r in caplog.records if "'auto'" in r.getMessage()]
    assert record.levelno == logging.WARNING and record.getMessage().startswith("fastloader 'auto': 0 workers")
    assert "set its shards_by_worker = True, or pass num_workers=" in record.getMessage()
    by_hand = DataLoaderX(Stream(), batch_size=2, num_workers=1, prefetch_factor="auto")  # workers given: kept
    assert sorted(int(i) for batch in by_hand for i in batch) == list(range(10)) and by_hand.num_workers == 1


def test_an_iterable_dataset_that_shards_itself_gets_a_worker_per_core(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="fastloader"):
        loader = DataLoaderX(ShardedStream(), batch_size=2, num_workers="auto")
        items = sorted(int(i) for batch in loader for i in batch)
    assert items == list(range(10)) and loader.num_workers == world.cores_per_rank()  # real worker processes
    (message,) = [r.getMessage() for r in caplog.records if "'auto'" in r.getMessage()]
    assert f"{loader.num_workers} workers" in message and "ShardedStream shards itself by worker" in message


class Slow(Dataset[torch.Tensor]):
    """SLOW_S per item, each read noted in a file (the workers are other processes)."""

    def __init__(self, notes: str) -> None:
        self.notes = notes

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, index: int) -> torch.Tensor:
        with open(self.notes, "a") as notes:
            notes.write(f"{index}\n")
        time.sleep(SLOW_S)
        return torch.tensor(index)


SLOW_S = 0.3  # a batch of 4 takes 1.2 s: longer than the whole budget the test gives the trials


def test_a_dataset_too_slow_to_measure_keeps_the_default_within_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(autotune, "TRIALS_BUDGET_S", 1.0, raising=False)  # raising: see the reason below
    notes = tmp_path / "reads"
    loader = DataLoaderX(Slow(str(notes)), batch_size=4, num_workers="auto")
    counts = candidates(world.cores_per_rank())
    with caplog.at_level(logging.INFO, logger="fastloader"):
        choice = autotune.choose(loader, counts, prefetch_auto=False)
    # The one trial's worker was stopped within its first batch: by the sleeps, it cannot have read more
    # in the budget. Trials that ran to the end would have read 5 batches with one worker, then 8 with two.
    assert len(notes.read_text().split()) <= 4
    assert (choice.num_workers, choice.trials) == (counts[-1], [])
    assert choice.reason == "not measured: not one trial timed its batches within the 1 s budget"
    (record,) = [r for r in caplog.records if "'auto'" in r.getMessage()]
    assert record.levelno == logging.WARNING and f"'auto': {counts[-1]} workers" in record.getMessage()
    batch = next(iter(loader))  # the trials again, then the loader with the cores' workers
    assert batch.tolist() == [0, 1, 2, 3] and loader.num_workers == counts[-1]
    assert loader.timeout == 0  # the trials' timeouts were their own
