"""Loader-level resume (``DataLoaderX.state_dict`` / ``load_state_dict``) and the samplers that allow it.

The state is a handful of ints (JSON-serializable, no index copies, nothing to unpickle)::

    {"version": 1, "epoch": e, "samples_yielded": n, "batches_yielded": k, "seed": s,
     "world_size": W, "rank": r, "start": g, "layout": L}

``samples_yielded`` / ``batches_yielded`` count what *this rank's training loop received* in this
iteration (the producer thread and torch's workers run ahead; they are not counted). The position
reached in the epoch's global order (all ranks together, padded or cut for ``L`` ranks; ``L == W``
unless this iteration itself resumed at another world size) is ``g + k * batch_size * W``.

Assumption (DDP): ranks advance in lockstep, so when the state is taken every rank has delivered the
same ``k`` batches and together they consumed the next ``k * batch_size * W`` positions. That is what
a training loop that saves at step k on every rank (or on rank 0 only) does.

Loading applies to the next ``iter()`` (the torchdata StatefulDataLoader convention): that iteration
delivers the rest of the epoch, in the order an uninterrupted run would have, whatever ``num_workers``;
with another world size the rest is re-split over the new ranks (nothing lost, nothing repeated but
the padding that keeps ranks equal). A state taken after the last batch of an epoch names the next
epoch at position 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from torch.utils.data import IterableDataset, Sampler

from fastloader.samplers import DistributedSampler, RandomSampler, SequentialSampler, WeightedRandomSampler
from fastloader.samplers._epoch import check_nonnegative_int

VERSION = 1
KEYS = frozenset(
    {"version", "epoch", "samples_yielded", "batches_yielded", "seed", "world_size", "rank", "start", "layout"}
)
_SINGLE = (RandomSampler, SequentialSampler, WeightedRandomSampler)


def distributed_world_size() -> int:
    """World size of an initialized ``torch.distributed`` process group, else 1."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def choose_sampler(
    dataset: Any,
    shuffle: bool | None,
    sampler: Any,
    batch_sampler: Any,
    drop_last: bool,
    distributed: bool | None,
    seed: int | None,
) -> Sampler[int] | None:
    """The sampler DataLoaderX gives torch in place of torch's default one, or None (torch's default).

    Only when the user gave neither ``sampler`` nor ``batch_sampler`` and the dataset is map-style:
    a ``DistributedSampler`` when distributed (auto: an initialized process group of more than one
    rank), else, when a ``seed`` is given, our ``RandomSampler`` / ``SequentialSampler``. Without a
    seed torch's own samplers stay, so batches equal torch's exactly (but cannot be resumed).
    """
    if sampler is not None or batch_sampler is not None or isinstance(dataset, IterableDataset):
        return None
    if distributed is None:
        distributed = distributed_world_size() > 1
    if distributed:
        return DistributedSampler(dataset, shuffle=bool(shuffle), seed=seed or 0, drop_last=drop_last)
    if seed is not None:
        return RandomSampler(dataset, seed=seed) if shuffle else SequentialSampler(dataset, seed=seed)
    return None


def rebuilt_with(shuffle: bool | None, sampler: Any) -> bool:
    """True for ``shuffle=True`` with one of our shuffling samplers: a loader rebuilt from its own attributes
    (``type(loader)(**vars)``, as Lightning does) passes back the sampler DataLoaderX chose for ``shuffle``."""
    if not shuffle:
        return False
    return isinstance(sampler, (RandomSampler, WeightedRandomSampler)) or (
        isinstance(sampler, DistributedSampler) and sampler.shuffle
    )


@dataclasses.dataclass
class Progress:
    """Where one iteration of a DataLoaderX started and how many batches its consumer received."""

    epoch: int
    start: int = 0  # global position at which the iteration started
    layout: int | None = None  # world size the epoch's global order is laid out for; None: the current one
    batches: int = 0
    done: bool = False  # StopIteration reached


def world_of(sampler: Any) -> tuple[int, int]:
    if isinstance(sampler, DistributedSampler):
        return sampler.num_replicas, sampler.rank
    return 1, 0


def _layout_size(sampler: Any, layout: int) -> int:
    if isinstance(sampler, DistributedSampler):
        return sampler.layout_size(layout)
    return len(sampler)


def state_of(loader: Any, progress: Progress) -> dict[str, int]:
    """The loader state after ``progress`` (see the module docstring); never raises."""
    sampler = loader.sampler
    world, rank = world_of(sampler)
    layout = progress.layout or world
    seed = int(getattr(sampler, "seed", 0))
    batch = loader.batch_size or 1
    try:
        total = _layout_size(sampler, layout)
    except TypeError:  # a sampler without len(): report what was delivered
        total = None
    position = progress.start + progress.batches * batch * world
    samples = progress.batches * batch
    if total is not None:
        position = min(position, total)
        samples = min(samples, len(sampler))
        short = loader.drop_last and loader.batch_size is not None and total - position < batch * world
        if progress.done or position >= total or short:
            progress = Progress(progress.epoch + 1)
            position = samples = 0
            layout = world
    return {
        "version": VERSION,
        "epoch": progress.epoch,
        "samples_yielded": samples,
        "batches_yielded": progress.batches,
        "seed": seed,
        "world_size": world,
        "rank": rank,
        "start": position if progress.batches == 0 else progress.start,
        "layout": layout,
    }


def check_state(state: Mapping[str, Any]) -> dict[str, int]:
    if not isinstance(state, Mapping):
        raise ValueError(f"DataLoaderX state must be a mapping, got {type(state).__name__}")
    if set(state) != KEYS:
        raise ValueError(f"not a DataLoaderX state: expected the keys {sorted(KEYS)}, got {sorted(state)}")
    values = {key: check_nonnegative_int(state[key], f"state[{key!r}]") for key in sorted(KEYS)}
    if values["version"] != VERSION:
        raise ValueError(f"DataLoaderX state version {values['version']} is not supported (expected {VERSION})")
    if values["world_size"] < 1 or values["layout"] < 1:
        raise ValueError("state['world_size'] and state['layout'] must be >= 1")
    return values


def apply_state(loader: Any, state: Mapping[str, Any]) -> Progress:
    """Make the loader's sampler start the next iteration where ``state`` left off; the starting point."""
    values = check_state(state)
    sampler = loader.sampler
    if getattr(loader, "_user_batch_sampler", False) or isinstance(loader.dataset, IterableDataset):
        raise ValueError("DataLoaderX.load_state_dict needs a map-style dataset and no batch_sampler")
    world = values["world_size"]
    batch = loader.batch_size or 1
    position = values["start"] + values["batches_yielded"] * batch * world
    epoch, seed, layout = values["epoch"], values["seed"], values["layout"]
    if isinstance(sampler, DistributedSampler):
        position = min(position, sampler.layout_size(layout))
        if layout == sampler.num_replicas and position % layout == 0:
            sampler.load_state_dict({"epoch": epoch, "seed": seed, "offset": position // layout})
        else:
            sampler.resume_at(epoch, seed, position, layout)
    elif isinstance(sampler, _SINGLE):
        if layout != 1:
            raise ValueError(
                f"the state comes from {layout} ranks, but this loader is not distributed ({type(sampler).__name__})"
            )
        position = min(position, len(sampler))
        sampler.load_state_dict({"epoch": epoch, "seed": seed, "offset": position})
    else:
        raise ValueError(
            f"DataLoaderX.load_state_dict cannot resume a {type(sampler).__module__}.{type(sampler).__qualname__}: "
            "pass seed=<int> (or a fastloader.samplers sampler) to make the order resumable"
        )
    return Progress(epoch, start=position, layout=layout)
