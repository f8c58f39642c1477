"""num_workers="auto": measured on the pipeline, more workers where they pay, and the same batches as by hand."""

from __future__ import annotations

import fcntl
import logging
import os
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset

from fastloader import DataLoaderX
from fastloader.loader.autotune import Auto, candidates

WORK_S = 0.012  # per sample


class DecodeBound(Dataset[torch.Tensor]):
    """Each sample keeps a core busy for WORK_S (as decoding does): more workers, more samples per second."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int) -> torch.Tensor:
        end = time.thread_time() + WORK_S
        while time.thread_time() < end:
            pass
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
            time.sleep(WORK_S)
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


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to see workers pay")
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
    assert len(logged) == 2 and f"{decode.num_workers} workers" in logged[0] and "1 workers" in logged[1]


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
