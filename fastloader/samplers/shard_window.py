"""Shard-aware shuffling for datasets read shard by shard (tar shards in object storage).

A fully random order over 10M samples touches a different shard at almost every sample: from object
storage, each shard would be fetched again and again. :class:`ShardWindowSampler` shuffles in two
levels instead, as WebDataset's shard shuffle + sample buffer does, but as a map-style order that
stays a pure function of ``(seed, epoch)``:

1. the shards are put in a random order;
2. that order is cut into windows of ``window`` consecutive shards, and the samples of each window are
   shuffled among themselves.

So an epoch reads ``window`` shards at a time, each shard once, and every sample once. When the
dataset's source can prefetch (remote tar shards), entering a window asks it to fetch the next
window's shards in the background, so downloads overlap decoding (the shard cache then needs room for
about two windows per machine). Under DDP each rank takes every
``num_replicas``-th index of the same order (padded as torch's DistributedSampler pads), so the ranks
of a machine read the same shards at the same time and share the cache. Resumable mid-epoch like every
fastloader sampler; the same for any ``num_workers``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from fastloader.samplers._epoch import EpochCursor, EpochSampler, check_nonnegative_int, epoch_rng, index_dtype


class ShardWindowSampler(EpochSampler):
    """Shuffle shards, then samples within windows of ``window`` shards (module docstring).

    ``shards``: a dataset whose source has ``shard_starts()`` (remote and local tar shards), or the
    starts themselves: ``[0, n0, n0 + n1, ..., total]``. ``shuffle=False`` reads shards and samples in
    order. ``num_replicas`` / ``rank``: the DDP split (default: one replica).
    """

    def __init__(
        self,
        shards: Any,
        *,
        window: int = 4,
        seed: int = 0,
        shuffle: bool = True,
        num_replicas: int = 1,
        rank: int = 0,
        drop_last: bool = False,
    ) -> None:
        super().__init__()
        starts = _starts_of(shards)
        if window < 1:
            raise ValueError(f"window must be >= 1 shard, got {window}")
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, num_replicas), got rank={rank}, num_replicas={num_replicas}")
        self.starts = starts
        source = getattr(shards, "source", shards)
        self._prefetch = getattr(source, "prefetch", None)  # remote shards: fetch ahead
        self._plan: tuple[int, np.ndarray, list[np.ndarray]] | None = None  # epoch, window of each shard, windows
        self.window = int(window)
        self.shuffle = bool(shuffle)
        self.num_replicas, self.rank, self.drop_last = int(num_replicas), int(rank), bool(drop_last)
        total = int(starts[-1])
        if drop_last:
            self.num_samples = total // self.num_replicas
        else:
            self.num_samples = -(-total // self.num_replicas)
        self._cursor = EpochCursor(check_nonnegative_int(seed, "seed"))

    def epoch_indices(self, epoch: int) -> np.ndarray:
        """This rank's order of ``epoch``."""
        epoch = check_nonnegative_int(epoch, "epoch")
        starts = self.starts
        total = int(starts[-1])
        dtype = index_dtype(total)
        count = len(starts) - 1
        rng = epoch_rng(self.seed, epoch)
        shard_order = rng.permutation(count) if self.shuffle else np.arange(count)
        order = np.empty(total, dtype=dtype)
        filled = 0
        windows = [shard_order[begin : begin + self.window] for begin in range(0, count, self.window)]
        window_of = np.zeros(count, dtype=np.int64)
        for number, group in enumerate(windows):
            window_of[group] = number
        self._plan = (epoch, window_of, windows)
        for group in windows:
            pieces = [np.arange(starts[s], starts[s + 1], dtype=dtype) for s in group]
            samples = np.concatenate(pieces) if pieces else np.zeros(0, dtype)
            if self.shuffle:
                rng.shuffle(samples)
            order[filled : filled + len(samples)] = samples
            filled += len(samples)
        size = self.num_samples * self.num_replicas
        if size > total and total:  # pad with the start of the order, as torch's DistributedSampler does
            order = np.concatenate([order, np.resize(order, size - total)])
        return order[:size][self.rank :: self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        indices = super().__iter__()
        if not callable(self._prefetch):
            yield from indices
            return
        current = -1
        for index in indices:
            plan = self._plan
            if plan is not None:
                window = int(plan[1][int(np.searchsorted(self.starts, index, side="right")) - 1])
                if window != current:  # entering a window: fetch the next one meanwhile
                    current = window
                    upcoming = plan[2][window + 1] if window + 1 < len(plan[2]) else plan[2][window][:0]
                    self._prefetch([*plan[2][window].tolist(), *upcoming.tolist()])
            yield index


def _starts_of(shards: Any) -> np.ndarray:
    source = getattr(shards, "source", shards)
    starts_of = getattr(source, "shard_starts", None)
    raw: Sequence[int] | np.ndarray = starts_of() if callable(starts_of) else shards
    starts = np.asarray(raw, dtype=np.int64)
    if starts.ndim != 1 or len(starts) < 1 or starts[0] != 0 or np.any(np.diff(starts) < 0):
        raise ValueError("shards must be a dataset of shards (shard_starts()) or shard starts [0, ..., total]")
    return starts
