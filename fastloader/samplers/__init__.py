"""Samplers for 10M+ sample datasets: deterministic in (seed, epoch), numpy memory, resumable.

Each sampler is a ``torch.utils.data.Sampler[int]`` and takes a dataset (``len()``) or an int length.
Each has ``set_epoch(epoch)``, ``__len__``, ``__iter__`` (Python ints), ``epoch_indices(epoch)`` (the
whole order of an epoch as a numpy array: int32 while indices fit, else int64) and
``state_dict()`` / ``load_state_dict(state)`` with ``state = {"epoch", "seed", "offset"}``; see
``fastloader.samplers._epoch`` for the resume protocol. Orders come from numpy's PCG64 seeded with
``[seed, epoch]`` in the main process, so they do not depend on the process or ``num_workers``.

``TorchRandomSampler`` is the exception: torch's own RandomSampler, draw for draw from torch's RNG
(``shuffle=True`` without ``seed=`` gets it), that a loader can resume.
"""

from fastloader.samplers._epoch import SamplerState
from fastloader.samplers.basic import RandomSampler, SequentialSampler
from fastloader.samplers.distributed import DistributedSampler
from fastloader.samplers.shard_window import ShardWindowSampler
from fastloader.samplers.torch_random import TorchRandomSampler
from fastloader.samplers.weighted import WeightedRandomSampler, class_balanced_weights

__all__ = [
    "DistributedSampler",
    "RandomSampler",
    "SamplerState",
    "SequentialSampler",
    "ShardWindowSampler",
    "TorchRandomSampler",
    "WeightedRandomSampler",
    "class_balanced_weights",
]
