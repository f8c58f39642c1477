"""Which sampler DataLoaderX hands torch when the user gave none, and when it splits the data over ranks.

The rule (docs/guide/distributed.md): DataLoaderX splits a map-style dataset over the ranks only when
asked, by ``local_rank=`` (with more than one rank running) or ``distributed=True``. Frameworks that
split the data themselves (Lightning, accelerate, DeepSpeed, Composer) then see exactly what torch's
loader gives them; a split they did not ask for would be split a second time, silently training on
half of the data. When DataLoaderX does split, its sampler is a subclass of torch's
``DistributedSampler``, which Lightning recognises and keeps. accelerate re-shards the batches of any
loader it prepares, whatever its sampler, so inside an initialised ``accelerate`` state
``local_rank=`` alone does not split (with a warning); ``distributed=True`` still does.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import torch
from torch.utils.data import IterableDataset, Sampler

from fastloader.samplers import DistributedSampler, RandomSampler, SequentialSampler, WeightedRandomSampler
from fastloader.samplers.distributed import default_world
from fastloader.samplers.torch_random import TorchRandomSampler


def splits(distributed: bool | None, local_rank: int | None) -> bool:
    """Whether DataLoaderX splits the dataset over the ranks (see the module docstring)."""
    if distributed is not None:
        return distributed
    if local_rank is None or default_world()[0] <= 1:
        return False
    if _accelerate_initialized():
        warnings.warn(
            "DataLoaderX(local_rank=...) inside accelerate: accelerate.prepare() shards the batches itself, so"
            " DataLoaderX does not split the data too (pass distributed=True to split anyway)",
            RuntimeWarning,
            stacklevel=4,
        )
        return False
    return True


def _accelerate_initialized() -> bool:
    state = sys.modules.get("accelerate.state")  # only if the user imported it: never import it here
    is_initialized = getattr(state, "is_initialized", None)
    return bool(callable(is_initialized) and is_initialized())


def choose_sampler(
    dataset: Any,
    shuffle: bool | None,
    sampler: Any,
    batch_sampler: Any,
    drop_last: bool,
    distributed: bool | None,
    local_rank: int | None,
    seed: int | None,
    generator: torch.Generator | None,
) -> Sampler[int] | None:
    """The sampler DataLoaderX gives torch in place of torch's default one, or None (torch's default).

    Only when the user gave neither ``sampler`` nor ``batch_sampler`` and the dataset is map-style:
    a ``DistributedSampler`` when splitting (:func:`splits`); else, with a ``seed``, our numpy
    ``RandomSampler`` / ``SequentialSampler``; else, for ``shuffle=True``, :class:`TorchRandomSampler`,
    torch's own sampler draw for draw (batches equal torch's loader for the same seed) that can resume.
    """
    if sampler is not None or batch_sampler is not None or isinstance(dataset, IterableDataset):
        return None
    if splits(distributed, local_rank):
        return DistributedSampler(dataset, shuffle=bool(shuffle), seed=seed or 0, drop_last=drop_last)
    if seed is not None:
        return RandomSampler(dataset, seed=seed) if shuffle else SequentialSampler(dataset, seed=seed)
    if shuffle:
        return TorchRandomSampler(dataset, generator=generator)
    return None


def rebuilt_with(shuffle: bool | None, sampler: Any) -> bool:
    """True for ``shuffle=True`` with one of our shuffling samplers: a loader rebuilt from its own attributes
    (``type(loader)(**vars)``, as Lightning does) passes back the sampler DataLoaderX chose for ``shuffle``."""
    if not shuffle:
        return False
    return isinstance(sampler, (RandomSampler, WeightedRandomSampler, TorchRandomSampler)) or (
        isinstance(sampler, DistributedSampler) and sampler.shuffle
    )
