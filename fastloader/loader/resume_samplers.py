"""Where a loaded state puts each kind of sampler (see ``fastloader.loader.resume`` for the three kinds)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch
import torch.utils.data as tud
from torch.utils.data import IterableDataset

from fastloader.loader.worker_state import stateful
from fastloader.samplers import (
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    ShardWindowSampler,
    WeightedRandomSampler,
)
from fastloader.samplers._epoch import EpochSampler
from fastloader.samplers.torch_random import TorchRandomSampler

if TYPE_CHECKING:
    from fastloader.loader.dataloader import DataLoaderX

_OURS = (RandomSampler, SequentialSampler, WeightedRandomSampler)
# torch's samplers whose order is decided by their own generator, when they have one
_GENERATOR_SAMPLERS = (tud.RandomSampler, tud.WeightedRandomSampler, tud.SubsetRandomSampler)
# torch's samplers an epoch's order can be rebuilt for (replayed)
_REPLAYED = (*_GENERATOR_SAMPLERS, tud.SequentialSampler, tud.DistributedSampler)


def ordering_generator(loader: DataLoaderX[Any]) -> torch.Generator | None:
    """The generator whose state decides an epoch's order: the sampler's own (torch's random samplers),
    else the loader's (it also draws the workers' base seed); None when torch's global RNG decides."""
    sampler = loader.sampler
    generator = getattr(sampler, "generator", None) if isinstance(sampler, _GENERATOR_SAMPLERS) else None
    if generator is None:
        generator = loader.generator
    return generator if isinstance(generator, torch.Generator) else None


def sampler_epoch(loader: DataLoaderX[Any]) -> int | None:
    """The epoch the sampler itself holds (torch's and fastloader's samplers have ``epoch``), if any."""
    for target in (loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        epoch = getattr(target, "epoch", None)
        if isinstance(epoch, int) and not isinstance(epoch, bool):
            return epoch
    return None


def world_of(sampler: Any) -> tuple[int, int]:
    if isinstance(sampler, (tud.DistributedSampler, ShardWindowSampler)):
        return sampler.num_replicas, sampler.rank
    return 1, 0


def sampler_size(sampler: Any, layout: int) -> int | None:
    """Positions in an epoch's global order laid out for ``layout`` ranks; None for a sampler without len()."""
    if isinstance(sampler, DistributedSampler):
        return sampler.layout_size(layout)
    if isinstance(sampler, tud.DistributedSampler):
        return int(sampler.total_size)
    if isinstance(sampler, ShardWindowSampler):
        return sampler.num_samples * sampler.num_replicas
    try:
        return len(sampler)
    except TypeError:
        return None


def seed_of(loader: DataLoaderX[Any], torch_seed: int | None) -> int:
    if isinstance(loader.sampler, TorchRandomSampler):
        return torch_seed if torch_seed is not None else 0
    return int(getattr(loader.sampler, "seed", 0))


def stateful_indexer(loader: DataLoaderX[Any]) -> Any:
    """The sampler (or user batch sampler) whose own state is saved, or None (fastloader's, or replayed)."""
    target = loader.batch_sampler if loader._plan.user_batch_sampler else loader.sampler
    if isinstance(target, (EpochSampler, ShardWindowSampler, TorchRandomSampler)):
        return None
    if stateful(target) or not isinstance(target, _REPLAYED):
        return target
    return None


def snapshot_indexer(indexer: Any, iterator: Any) -> dict[str, Any]:
    return {
        "sampler": copy.deepcopy(indexer.state_dict()) if stateful(indexer) else None,
        "iterator": copy.deepcopy(iterator.state_dict()) if stateful(iterator) else None,
    }


def _name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def place(loader: DataLoaderX[Any], values: dict[str, Any]) -> dict[str, Any]:
    """The fields of the Plan that resumes ``values`` (a checked state); fastloader's samplers are positioned
    now (their next ``iter()`` starts there). ValueError when this loader cannot resume that state exactly."""
    fields: dict[str, Any] = {"epoch": values["epoch"], "base_seed": values["base_seed"], "after": values["after"]}
    fields.update(_workers(loader, values))
    if ordering_generator(loader) is not None:
        fields["rng"] = values["rng"]
    world = values["world_size"]
    position = values["start"] + values["batches_yielded"] * (loader.batch_size or 1) * world
    if isinstance(loader.dataset, IterableDataset):
        fields["before"] = values["batches_yielded"]
        return fields
    indexer = stateful_indexer(loader)
    if indexer is not None:
        saved = values["sampler"]
        received = values["batches_yielded"] > 0 or values["after"]
        if received and (saved is None or (saved["sampler"] is None and saved["iterator"] is None)):
            raise _cannot(loader, indexer)
        fields["sampler"], fields["before"] = saved, values["batches_yielded"]
        return fields
    fields.update(_position(loader, values, position))
    return fields


def _workers(loader: DataLoaderX[Any], values: dict[str, Any]) -> dict[str, Any]:
    if values["workers"] is None:
        return {}
    count, next_worker, states = values["workers"]
    if count == int(loader.num_workers):
        return {"next_worker": next_worker % max(count, 1), "workers": states}
    if isinstance(loader.dataset, IterableDataset):
        raise ValueError(
            f"the state comes from num_workers={count}, this loader has num_workers={int(loader.num_workers)}:"
            f" an IterableDataset ({type(loader.dataset).__name__}) is split by worker, so resume it with the same"
            " num_workers"
        )
    return {}  # map-style: the order resumes exactly; the workers' own state starts afresh


def _position(loader: DataLoaderX[Any], values: dict[str, Any], position: int) -> dict[str, Any]:
    sampler = loader.sampler
    epoch, seed, layout = values["epoch"], values["seed"], values["layout"]
    if isinstance(sampler, DistributedSampler):
        position = min(position, sampler.layout_size(layout))
        if layout == sampler.num_replicas and position % layout == 0:
            sampler.load_state_dict({"epoch": epoch, "seed": seed, "offset": position // layout})
        else:
            sampler.resume_at(epoch, seed, position, layout)
    elif isinstance(sampler, ShardWindowSampler):
        if layout != sampler.num_replicas:
            raise ValueError(
                f"the state comes from {layout} ranks, this ShardWindowSampler splits over {sampler.num_replicas}:"
                " resume with the same number of ranks"
            )
        offset = min(position, sampler.num_samples * sampler.num_replicas) // layout
        sampler.load_state_dict({"epoch": epoch, "seed": seed, "offset": offset})
    elif isinstance(sampler, _OURS):
        if layout != 1:
            raise ValueError(
                f"the state comes from {layout} ranks, but this loader is not distributed ({type(sampler).__name__})"
            )
        position = min(position, len(sampler))
        sampler.load_state_dict({"epoch": epoch, "seed": seed, "offset": position})
    else:
        return _replay(loader, values, position)
    return {"start": position, "layout": layout}


def _replay(loader: DataLoaderX[Any], values: dict[str, Any], position: int) -> dict[str, Any]:
    """A torch sampler's iteration rebuilt as it began, its first batches skipped."""
    sampler = loader.sampler
    world, _rank = world_of(sampler)
    if values["layout"] != world:
        raise ValueError(
            f"the state comes from {values['layout']} ranks, this loader runs on {world}: {_name(sampler)} cannot"
            " re-split an epoch (DataLoaderX's own split, with local_rank= or distributed=True, can)"
        )
    seed = None
    if isinstance(sampler, TorchRandomSampler) and sampler.generator is None:
        # states before version 3 did not record the seed of an epoch not begun (0): a fresh draw then
        seed = values["seed"] if position > 0 or values["version"] >= 3 else None
    elif isinstance(sampler, _GENERATOR_SAMPLERS) and getattr(sampler, "generator", None) is None:
        raise ValueError(
            f"DataLoaderX.load_state_dict cannot resume a {_name(sampler)} without a generator (its order comes"
            " from torch's global RNG when the epoch begins, and nothing records that draw): use shuffle=True on"
            " the loader, pass generator= to the sampler, or seed="
        )
    if isinstance(sampler, tud.DistributedSampler):
        sampler.set_epoch(values["epoch"])
    size = sampler_size(sampler, world)
    position = min(position, size) if size is not None else position
    unit = (loader.batch_size or 1) * world
    return {"start": position, "layout": world, "skip": -(-position // unit), "seed": seed}


def _cannot(loader: DataLoaderX[Any], indexer: Any) -> ValueError:
    return ValueError(
        f"DataLoaderX.load_state_dict cannot resume a {_name(indexer)}: give it (or its iterator) state_dict /"
        " load_state_dict (the Stateful protocol), pass seed=<int>, or use a fastloader.samplers sampler"
    )
