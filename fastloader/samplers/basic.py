"""Random and sequential samplers: torch's, with orders a function of (seed, epoch) and resumable."""

from __future__ import annotations

from collections.abc import Iterator, Sized

import numpy as np

from fastloader.samplers._epoch import (
    EpochCursor,
    EpochSampler,
    check_nonnegative_int,
    epoch_rng,
    index_dtype,
    length_of,
    permutation,
)


class RandomSampler(EpochSampler):
    """Random order, reshuffled per epoch: ``torch.utils.data.RandomSampler`` made deterministic.

    The order of an epoch is ``np.random.Generator(PCG64([seed, epoch])).permutation(n)`` (the first
    ``num_samples`` of it, or successive permutations when ``num_samples > n``, as torch does), so it
    does not depend on the process or on ``num_workers``; it differs from torch's, which draws from
    torch's RNG. With ``replacement=True`` it is ``rng.integers(0, n, num_samples)``. Call
    ``set_epoch(epoch)`` before each epoch (DataLoaderX.set_epoch does) to reshuffle.

    The length is read once, at construction.
    """

    def __init__(
        self,
        data_source_or_length: Sized | int,
        *,
        seed: int = 0,
        replacement: bool = False,
        num_samples: int | None = None,
    ) -> None:
        super().__init__()
        self.data_source = data_source_or_length
        self.length = length_of(data_source_or_length)
        self.replacement = bool(replacement)
        self.num_samples = self.length if num_samples is None else check_nonnegative_int(num_samples, "num_samples")
        if self.length == 0 and self.num_samples > 0:
            raise ValueError(f"num_samples is {self.num_samples}, but there is nothing to sample from (length 0)")
        self._cursor = EpochCursor(seed)

    def epoch_indices(self, epoch: int) -> np.ndarray:
        """The whole order of ``epoch`` as a new array (int32 while indices fit, else int64)."""
        epoch = check_nonnegative_int(epoch, "epoch")
        rng = epoch_rng(self.seed, epoch)
        dtype = index_dtype(self.length)
        if self.replacement:
            return rng.integers(0, self.length, size=self.num_samples, dtype=dtype)
        if self.num_samples == self.length:
            return permutation(rng, self.length)  # the common case: no second array
        order = np.empty(self.num_samples, dtype=dtype)
        for begin in range(0, self.num_samples, self.length):
            count = min(self.length, self.num_samples - begin)
            order[begin : begin + count] = permutation(rng, self.length)[:count]
        return order


class SequentialSampler(EpochSampler):
    """``0, 1, ..., n - 1`` every epoch, in O(1) memory; resumable like the other samplers.

    ``set_epoch`` changes nothing in the order but is recorded, so that a state saved from it names
    the right epoch.
    """

    def __init__(self, data_source_or_length: Sized | int, *, seed: int = 0) -> None:
        super().__init__()
        self.data_source = data_source_or_length
        self.length = length_of(data_source_or_length)
        self.num_samples = self.length
        self._cursor = EpochCursor(seed)  # the seed only travels in the state, for uniformity

    def epoch_indices(self, epoch: int) -> np.ndarray:
        """``np.arange(n)`` (int32 while indices fit, else int64), as a new array."""
        check_nonnegative_int(epoch, "epoch")
        return np.arange(self.length, dtype=index_dtype(self.length))

    def __iter__(self) -> Iterator[int]:
        return self._cursor.iterate(lambda _epoch: range(self.length))  # no array needed
