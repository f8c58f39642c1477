"""The datasets the oracle draws: each sample says which it is and carries what the worker's random
generators gave it, so a delivered batch names its samples and the state they were made in.

They live in a module of their own (not a test file) so that worker processes unpickle them by name.
"""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from fastloader.datasets.error_policy import ErrorPolicy


def _draws(index: int) -> float:
    """What a user transform takes from the worker's three generators, in odd amounts that depend on the
    sample (timm's RandAugment with ``mstd`` leaves a cached ``random.gauss`` value half the time): a worker
    process's globals, or a thread worker's own (``get_worker_info().rng``, seeded as a process's globals)."""
    info = get_worker_info()
    rng = info.rng if info is not None and info.worker_method == "thread" else None
    python = rng.random_generator if rng is not None else random
    numpy = rng.numpy_generator if rng is not None else np.random
    total = 0.0
    for _ in range(index % 3 + 1):
        total += python.gauss(0, 1)
    total += float(numpy.standard_normal(index % 2 + 1).sum())
    total += float(torch.rand(index % 4 + 1, generator=torch.random.thread_safe_generator()).sum())
    return round(total, 6)


class Indexed(Dataset[tuple[int, float]]):
    """Map-style: sample ``i`` is ``(i, the draws made for it)``."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[int, float]:
        index = int(index)
        return index, _draws(index)


class Killing(Indexed):
    """Indexed, whose sample ``at`` SIGKILLs its worker: the first time only (``flag``, a file made right
    before the kill), or every time (``flag`` None: it is quarantined). Keeps an error policy as fastloader's
    datasets do (worker restarts need ``skip`` or ``replace``). With ``payload``, each sample made in a worker
    carries that many bytes more (a result bigger than a pipe: its worker blocks writing it until it is read)."""

    def __init__(self, size: int, at: int, flag: Path | None, mode: str, quarantine: Path, payload: int = 0) -> None:
        super().__init__(size)
        self.at, self.flag, self.payload = at, flag, payload
        self.error_policy = ErrorPolicy(mode, size, quarantine=quarantine)

    def key(self, index: int) -> str:
        return f"sample-{index}"

    def __getitem__(self, index: int) -> Any:
        in_worker = get_worker_info() is not None
        if int(index) == self.at and in_worker:
            if self.flag is None:
                os.kill(os.getpid(), signal.SIGKILL)
            elif not self.flag.exists():
                self.flag.touch()
                os.kill(os.getpid(), signal.SIGKILL)
        sample = super().__getitem__(index)
        return (*sample, bytes(self.payload)) if self.payload and in_worker else sample


class Stream(IterableDataset[tuple[int, float]]):
    """An IterableDataset split by worker (worker ``w`` of ``n`` yields ``w, w + n, ...``), without state of
    its own: a resume makes its batches again and drops them."""

    def __init__(self, size: int) -> None:
        self.size = size

    def _mine(self) -> range:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return range(worker, self.size, workers)

    def __iter__(self) -> Iterator[tuple[int, float]]:
        for index in self._mine():
            yield index, _draws(index)


class StatefulStream(Stream):
    """Stream with torchdata's Stateful protocol: where it is in its part of the data."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.at = 0
        self.resumed: int | None = None

    def __iter__(self) -> Iterator[tuple[int, float]]:
        mine = self._mine()
        self.at, self.resumed = self.resumed or 0, None
        while self.at < len(mine):
            index = mine[self.at]
            self.at += 1
            yield index, _draws(index)

    def state_dict(self) -> dict[str, Any]:
        return {"at": self.at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.resumed = int(state["at"])


class NumpyOrder(torch.utils.data.Sampler[Any]):
    """A user's sampler yielding numpy integers (``np.random.permutation``), its order fixed by ``seed``."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed = size, seed

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[Any]:
        return iter(np.random.default_rng(self.seed).permutation(self.size))


class BatchesOf(torch.utils.data.Sampler[Any]):
    """A user's batch sampler yielding each batch as ``kind`` makes it (a tuple or a numpy array)."""

    def __init__(self, size: int, batch: int, kind: str) -> None:
        self.size, self.batch, self.kind = size, batch, kind

    def __len__(self) -> int:
        return -(-self.size // self.batch)

    def __iter__(self) -> Iterator[Any]:
        for start in range(0, self.size, self.batch):
            items = list(range(start, min(start + self.batch, self.size)))
            yield tuple(items) if self.kind == "tuple" else np.asarray(items, dtype=np.int64)
