"""IN THE RAY ACTORS: :class:`BatchMaker` makes whole batches of a DataLoaderX's leases (``worker_method="ray"``).

Each actor holds a copy of the dataset and the loader's collate function (both shipped once, when the actor
starts) and, per lease, does what a torch worker does per batch: the dataset's items (``__getitems__`` where
the dataset has it, as torch's fetcher), the collate function, timed by the stage clock (``read``, ``decode``,
``transform`` as the dataset records them, ``collate``). The batch goes back as a Ray object: its tensors as
numpy arrays, which Ray stores out of band in its object store, so the training process maps them without a
copy on the same node and receives them once, whole, from another (``fastloader.loader.workers.ray_workers``).

Random draws do not depend on the actor: with ``seed=`` each sample draws from (seed, epoch, sample index)
(``fastloader.sample_seeds``), as in worker processes and thread workers, so the batches are process mode's,
pixel for pixel; without it, before each batch the global generators (``random``, torch, numpy) are seeded as
torch seeds a worker, with the batch's place in the epoch's order in place of the worker id, so a re-issued
lease makes the same pixels on another actor. An error in the dataset is raised to the
training process at that batch (the dataset's own error policy applies first, here, as in a worker).
"""

from __future__ import annotations

import os
import random
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fastloader import sample_seeds
from fastloader.loader.nested import map_tensors
from fastloader.loader.stage_clock import BatchTiming, TimedCollate, stamp
from fastloader.loader.workers.lease_book import Lease
from fastloader.torch_internals import numpy_seed


class RemoteBatch:
    """What an actor returns for a lease: the batch (tensors as numpy arrays), its timing, the actor's pid."""

    __slots__ = ("batch", "timing", "pid")

    def __init__(self, batch: Any, timing: BatchTiming | None, pid: int) -> None:
        self.batch, self.timing, self.pid = batch, timing, pid

    def __reduce__(self) -> tuple[Callable[..., RemoteBatch], tuple[Any, ...]]:
        return RemoteBatch, (self.batch, self.timing, self.pid)


class BatchMaker:
    """The body of one Ray actor (made a Ray actor class by ``ray.remote`` in the training process)."""

    def __init__(self, loaded: tuple[Any, Callable[[list[Any]], Any]], slot: int) -> None:
        dataset, collate_fn = loaded  # the loader's dataset and collate function, put in the object store once
        self.dataset = dataset
        self.collate = TimedCollate(collate_fn)
        self.slot = slot
        self.epoch: int | None = None

    def ready(self) -> int:
        """Answers once the actor is placed and its dataset unpickled: its pid."""
        return os.getpid()

    def make(self, lease: Lease, base_seed: int, seeds: tuple[int, int] | None = None) -> RemoteBatch:
        """The batch of ``lease``; ``seeds``: ``seed=``'s (seed, epoch), each sample then drawing from its own key
        (``fastloader.sample_seeds``), as in a worker process: the same pixels whichever actor or worker made it."""
        if lease.epoch != self.epoch:
            set_epoch = getattr(self.dataset, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(lease.epoch)  # the training process's dataset had it set by DataLoaderX.set_epoch
            self.epoch = lease.epoch
        _seed_for(base_seed, lease.number if lease.number is not None else lease.seq)
        # the fetch starts now (the stage clock; with seeds, sample_seeds.begin)
        indices = stamp(lease.indices, lease.number, in_workers=False, seeds=seeds)
        try:
            timed = self.collate(self._samples(indices, seeds is not None))
        finally:
            sample_seeds.end()
        if timed.timing is not None:
            timed.timing.worker = self.slot
        return RemoteBatch(map_tensors(timed.batch, _as_numpy), timed.timing, os.getpid())

    def _samples(self, indices: Any, seeded: bool) -> list[Any]:
        """The dataset's items, as torch's fetcher asks for them; under ``seed=`` the global generators seeded for
        each sample right before it is asked for (a dataset with ``__getitems__``: fastloader's seed each sample
        themselves, another's finds them seeded for the batch's first sample, as in a worker process)."""
        dataset = self.dataset
        getitems = getattr(dataset, "__getitems__", None)
        if callable(getitems):
            if seeded and not getattr(dataset, "seeds_each_sample", False) and len(indices):
                sample_seeds.seed_for(indices[0])
            return list(getitems(indices))
        items = []
        for index in indices:
            sample_seeds.seed_for(index)  # nothing without seed=
            items.append(dataset[index])
        return items


def _seed_for(base_seed: int, number: int) -> None:
    """The global generators as torch's worker loop seeds worker ``number`` (the batch's place, not the actor)."""
    seed = base_seed + number
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(numpy_seed(base_seed, number))


def _as_numpy(tensor: torch.Tensor) -> Any:
    # A CPU tensor's numpy view: Ray stores arrays out of band (zero-copy in the object store); others travel pickled.
    if tensor.device.type == "cpu" and tensor.layout == torch.strided and not tensor.requires_grad:
        try:
            return _TensorArray(tensor.numpy())
        except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16): the tensor travels as it is
            return tensor
    return tensor


class _TensorArray:
    """A tensor on its way to the training process as its numpy array (Ray keeps arrays out of band, in the object
    store): unpickled there straight into a tensor viewing the object store's memory, read-only."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce__(self) -> tuple[Callable[..., torch.Tensor], tuple[Any, ...]]:
        return _tensor_of, (self.array,)


def _tensor_of(array: np.ndarray) -> torch.Tensor:
    with warnings.catch_warnings():
        # The object store's buffers are read-only: torch warns that writing to the tensor is undefined. The
        # loader copies it before a training loop on the CPU gets it (a copy to the GPU reads it only).
        warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
        return torch.from_numpy(array)
