"""The stall watchdog names the stuck worker and shows where it is stuck, instead of a silent hang."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import pytest
from torch.utils.data import Dataset

from fastloader import DataLoaderX


class StuckAt(Dataset[int]):
    """Item ``stuck`` blocks until the file ``release`` exists."""

    def __init__(self, stuck: int, release: str) -> None:
        self.stuck, self.release = stuck, release

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        if index == self.stuck:
            stuck_in_the_dataset(self.release)
        return index


def stuck_in_the_dataset(release: str) -> None:
    while not os.path.exists(release):
        time.sleep(0.05)


def test_a_stuck_worker_is_reported_by_its_stack(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    release = tmp_path / "release"
    loader = DataLoaderX(StuckAt(5, str(release)), batch_size=1, num_workers=2, stall_warning=1.0)
    threading.Timer(3.5, release.touch).start()  # the test's way out: the worker goes on after 3.5 s
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        batches = [int(batch) for batch in loader]
    assert batches == list(range(8))  # the stall ended and nothing was lost
    reports = [r.getMessage() for r in caplog.records if "no batch for" in r.getMessage()]
    assert len(reports) >= 2  # repeated while the wait lasts (1 s, 2 s, 3 s)
    report = reports[0]
    assert "it waits for batch 5 from worker 1" in report  # batch 5 of 8, round-robin over 2 workers
    worker_1 = report.split("--- worker 1")[1].split("--- ")[0]
    assert "<- the awaited batch" in worker_1
    assert "stuck_in_the_dataset" in worker_1  # the worker's own Python stack, from faulthandler
    assert "stuck_in_the_dataset" not in report.split("--- worker 0")[1].split("--- worker 1")[0]
    assert "--- training process" in report and "fastloader-dataloaderx" in report  # the producer thread


def test_no_worker_processes_the_training_process_stack_shows_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    release = tmp_path / "release"
    loader = DataLoaderX(StuckAt(2, str(release)), batch_size=1, num_workers=0, stall_warning=0.5)
    threading.Timer(1.5, release.touch).start()
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        assert [int(b) for b in loader] == list(range(8))
    report = next(r.getMessage() for r in caplog.records if "no batch for" in r.getMessage())
    assert "stuck_in_the_dataset" in report.split("--- training process")[1]


def test_stall_warning_none_is_silent_and_bad_values_are_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    release = tmp_path / "release"
    loader = DataLoaderX(StuckAt(1, str(release)), batch_size=1, num_workers=1, stall_warning=None)
    threading.Timer(1.0, release.touch).start()
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        assert len(list(loader)) == 8
    assert not [r for r in caplog.records if "no batch for" in r.getMessage()]
    for bad in (0, -1.0, True):
        with pytest.raises(ValueError, match="stall_warning"):
            DataLoaderX(StuckAt(1, str(release)), stall_warning=bad)
