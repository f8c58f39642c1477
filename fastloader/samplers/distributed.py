"""DistributedSampler: torch's layout and padding, with the shuffle a function of (seed, epoch)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sized
from typing import Any

import numpy as np
import torch.utils.data
from torch.utils.data import Sampler

from fastloader.samplers._epoch import (
    EpochCursor,
    EpochSampler,
    check_nonnegative_int,
    epoch_rng,
    index_dtype,
    length_of,
    permutation,
)


def default_world() -> tuple[int, int]:
    """``(world_size, rank)`` of an initialized ``torch.distributed``, else ``WORLD_SIZE`` / ``RANK``
    (torchrun sets them before the process group exists), else ``(1, 0)``."""
    from fastloader.world import World

    world = World.current()
    return world.world_size, world.rank


class DistributedSampler(EpochSampler, torch.utils.data.DistributedSampler):  # type: ignore[override]
    """The part of each epoch that belongs to one rank: ``torch.utils.data.DistributedSampler``'s semantics.

    A subclass of torch's ``DistributedSampler``, so that frameworks that split the data themselves
    recognise the split as done: Lightning keeps such a sampler instead of wrapping it in a second one.

    Every rank computes the same epoch order (``np.random.Generator(PCG64([seed, epoch]))``, the same
    order as ``RandomSampler(n, seed=seed)``; with ``shuffle=True`` it differs from torch's, which uses
    ``torch.randperm``), then, as torch does:

    * without ``drop_last``, pads the order to a multiple of ``num_replicas`` by repeating its start
      (so up to ``num_replicas - 1`` indices appear twice in an epoch, on different ranks);
    * with ``drop_last``, drops its tail to the largest multiple of ``num_replicas``;
    * gives rank r the positions ``r, r + num_replicas, r + 2 * num_replicas, ...``.

    Ranks are therefore disjoint (but for the padding) and together cover the epoch; every rank has
    ``len(self)`` indices. With ``shuffle=False`` the indices of each rank equal torch's exactly.

    ``num_replicas`` and ``rank`` default to an initialized ``torch.distributed``, else the
    ``WORLD_SIZE`` / ``RANK`` environment variables, else 1 and 0.
    """

    def __init__(
        self,
        data_source_or_length: Sized | int,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        # Not torch's __init__: it requires an initialized process group and a sized dataset, and
        # every attribute it sets is set here (epoch and seed live in the cursor).
        Sampler.__init__(self)
        if num_replicas is None or rank is None:
            world_size, world_rank = default_world()
            num_replicas = world_size if num_replicas is None else num_replicas
            rank = world_rank if rank is None else rank
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, (int, np.integer)) or num_replicas < 1:
            raise ValueError(f"num_replicas must be an int >= 1, got {num_replicas!r}")
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < num_replicas:
            raise ValueError(
                f"rank must be an int in [0, {num_replicas - 1}] for num_replicas={num_replicas}, got {rank!r}"
            )
        self.dataset = data_source_or_length  # type: ignore[assignment]  # torch's attribute name
        self.length = length_of(data_source_or_length)
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        if self.drop_last:
            self.num_samples = self.length // self.num_replicas  # = torch's ceil((n - R) / R) when R does not divide n
        else:
            self.num_samples = math.ceil(self.length / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        self._cursor = EpochCursor(seed)
        self._resume: tuple[int, int] | None = None  # (global position, layout's num_replicas) for the next iter()

    def global_indices(self, epoch: int) -> np.ndarray:
        """The epoch order of all ranks together, padded or cut to ``total_size`` (before the split)."""
        return self._laid_out(epoch, self.total_size)

    def _laid_out(self, epoch: int, total_size: int) -> np.ndarray:
        epoch = check_nonnegative_int(epoch, "epoch")
        if self.shuffle:
            order = permutation(epoch_rng(self.seed, epoch), self.length)
        else:
            order = np.arange(self.length, dtype=index_dtype(self.length))
        if total_size > self.length:
            return np.resize(order, total_size)  # repeats the order cyclically: torch's padding
        return order[:total_size]

    def layout_size(self, num_replicas: int) -> int:
        """``total_size`` of this dataset and ``drop_last`` laid out for ``num_replicas`` ranks."""
        if self.drop_last:
            return (self.length // num_replicas) * num_replicas
        return math.ceil(self.length / num_replicas) * num_replicas

    def remaining_indices(self, epoch: int, position: int, num_replicas: int) -> np.ndarray:
        """This rank's part of what is left of ``epoch`` after ``position`` indices of the global order
        laid out for ``num_replicas`` ranks: the rest is split ``[rank::self.num_replicas]``, padded (by
        repeating its start) or cut (``drop_last``) so that every rank gets as many indices."""
        rest = self._laid_out(epoch, self.layout_size(num_replicas))[position:]
        world = self.num_replicas
        size = len(rest) // world if self.drop_last else math.ceil(len(rest) / world)
        if size * world > len(rest):
            rest = np.resize(rest, size * world)
        return rest[self.rank : size * world : world].copy()

    def resume_at(self, epoch: int, seed: int, position: int, num_replicas: int) -> None:
        """Start the next ``iter()`` at ``position`` of ``epoch``'s global order as laid out for
        ``num_replicas`` ranks (another world size than this one, after a restart), re-split over this
        sampler's ranks: nothing of the rest is lost and, but for padding, nothing is repeated.

        Until that iteration ends, ``state_dict()['offset']`` counts indices of the re-split rest;
        ``DataLoaderX.state_dict`` records the global position instead.
        """
        if position > self.layout_size(num_replicas):
            raise ValueError(f"position {position} is past the end of an epoch laid out for {num_replicas} ranks")
        self._cursor.load({"epoch": epoch, "seed": seed, "offset": 0}, self.num_samples)
        self._resume = (position, num_replicas)

    def epoch_indices(self, epoch: int) -> np.ndarray:
        """This rank's order of ``epoch`` as a new contiguous array (int32 while indices fit)."""
        order = self.global_indices(epoch)
        # A copy, so that the full order (n indices) is freed and only this rank's n / R remain.
        return order[self.rank : self.total_size : self.num_replicas].copy()

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self._resume = None
        super().set_epoch(epoch)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self._resume = None

    def __iter__(self) -> Iterator[int]:
        if self._resume is not None:
            position, num_replicas = self._resume
            self._resume = None
            return self._cursor.iterate(lambda epoch: self.remaining_indices(epoch, position, num_replicas))
        return super().__iter__()
