"""Idle worker deaths (the OOM killer picking a worker between batches) are counted per epoch, not over the
life of persistent workers: one a epoch for ten epochs is ten restarts, never the end of the run
(fastloader.loader.worker_restart)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset

from fastloader import DataLoaderX
from fastloader.datasets.error_policy import ErrorPolicy
from tests.helpers import pid_alive

N = 16


class Pids(Dataset[int]):
    """Sample i is i; each worker leaves a file named by its pid, so the test can kill one that is idle."""

    def __init__(self, pids: Path, quarantine: Path) -> None:
        self.pids = pids
        self.error_policy = ErrorPolicy("skip", N, quarantine=quarantine)

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> int:
        if torch.utils.data.get_worker_info() is not None:
            (self.pids / str(os.getpid())).touch()
        return index


def _kill_an_idle_worker(pids: Path) -> None:
    """SIGKILL a live worker (between epochs: it waits for work), and wait until it is dead (a zombie)."""
    victim = next(int(entry.name) for entry in sorted(pids.iterdir()) if pid_alive(int(entry.name)))
    os.kill(victim, signal.SIGKILL)
    while pid_alive(victim):
        time.sleep(0.01)


def test_an_idle_worker_killed_in_each_of_ten_epochs_is_restarted_each_time(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    dataset = Pids(pids, tmp_path / "quarantine.tsv")
    loader = DataLoaderX(dataset, batch_size=4, num_workers=2, persistent_workers=True, stall_warning=None)
    for _ in range(10):
        assert [batch.tolist() for batch in loader] == [list(range(i, i + 4)) for i in range(0, N, 4)]
        _kill_an_idle_worker(pids)
    assert [batch.tolist() for batch in loader] == [list(range(i, i + 4)) for i in range(0, N, 4)]
    assert dataset.error_policy.bad_samples() == []
