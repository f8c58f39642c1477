"""Small datasets the worker-mode tests share (thread workers, the subprocess pipeline): importable by path, so
that a child process started by forkserver unpickles them."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset


class Numbers(Dataset[Any]):
    """Sample i: i, and a number drawn from the worker's generator (the thread's own in a thread worker)."""

    def __init__(self, size: int = 24) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[int, int]:
        drawn = torch.randint(0, 1 << 30, (1,), generator=torch.random.thread_safe_generator())
        return index, int(drawn)


class Raising(Numbers):
    """Sample 7 raises a KeyError."""

    def __getitem__(self, index: int) -> tuple[int, int]:
        if index == 7:
            raise KeyError(f"sample {index} is broken")
        return super().__getitem__(index)


class Sharded(IterableDataset[int]):
    """torch's first sharding example: each worker takes its part in ``__iter__``."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        if info is None:
            return iter(range(self.start, self.end))
        per_worker = int(math.ceil((self.end - self.start) / float(info.num_workers)))
        start = self.start + info.id * per_worker
        return iter(range(start, min(start + per_worker, self.end)))
