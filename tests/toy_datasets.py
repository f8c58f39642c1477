"""Tiny datasets for loader tests (module-level so worker processes can import them)."""

from __future__ import annotations

import os
import time
from collections import namedtuple
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

Pair = namedtuple("Pair", ["image", "label"])


@dataclass
class Sample:
    image: torch.Tensor
    label: int
    key: str


class Squares(Dataset[tuple[torch.Tensor, int]]):
    """Item i is (a 3x4x4 tensor derived from i and a worker-dependent offset, label i)."""

    def __init__(self, n: int = 50) -> None:
        self.n = n
        self.offset = 0  # set by worker_init_fn in tests

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return torch.full((3, 4, 4), float(i * i + self.offset)), i


def add_offset(worker_id: int) -> None:
    info = get_worker_info()
    assert info is not None
    info.dataset.offset = 1000 * (worker_id + 1)  # type: ignore[attr-defined]


class RandomNoise(Dataset[torch.Tensor]):
    """Draws from torch's RNG in the worker: the result depends on the loader's seeding."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.rand(2)


class Counting(IterableDataset[int]):
    """0..n-1, split between workers the way torch documents it."""

    def __init__(self, n: int = 40) -> None:
        self.n = n

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))


class Failing(Dataset[int]):
    """Raises on item ``bad``."""

    def __init__(self, n: int, bad: int) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == self.bad:
            raise ValueError(f"bad sample {i}")
        return i


class Slow(Dataset[int]):
    """Each item takes ``delay`` seconds (a slow disk, a big image)."""

    def __init__(self, n: int = 1000, delay: float = 0.05) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(self.delay)
        return i


class Pids(Dataset[int]):
    """Returns the pid of the process that produced the item."""

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, i: int) -> int:
        time.sleep(0.01)
        return os.getpid()


class Epochs(Dataset[int]):
    """Records set_epoch calls."""

    def __init__(self) -> None:
        self.epochs: list[int] = []

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return i

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


class MadeBy(Dataset[tuple[torch.Tensor, int, int]]):
    """Item i is (a 3x4x4 uint8 image of i, i, the pid that made it), after ``delay`` seconds; with ``log_dir``
    each index is appended to ``log_dir/<pid>.log`` first (which process was making what when it was killed)."""

    def __init__(self, n: int = 60, delay: float = 0.0, log_dir: str | None = None) -> None:
        self.n, self.delay, self.log_dir = n, delay, log_dir

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        if self.log_dir is not None:
            with open(os.path.join(self.log_dir, f"{os.getpid()}.log"), "a") as log:
                log.write(f"{i}\n")
        time.sleep(self.delay)
        return torch.full((3, 4, 4), i % 251, dtype=torch.uint8), i, os.getpid()


class KillsItsProcess(Dataset[int]):
    """Item ``bad`` SIGKILLs the process that reads it (a decoder crash); the others are their index."""

    def __init__(self, n: int, bad: int) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == self.bad:
            os.kill(os.getpid(), 9)
        return i
