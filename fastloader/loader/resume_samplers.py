"""Where a loaded state puts each kind of sampler (see ``fastloader.loader.resume`` for the kinds)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.utils.data as tud
from torch.utils.data import IterableDataset

from fastloader.loader.dataset_protocols import stateful
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


def _accelerates(obj: Any, name: str) -> bool:
    """Whether ``obj`` is accelerate's class ``name`` (recognised by name: the loader never imports accelerate)."""
    kind = type(obj)
    return kind.__module__ == "accelerate.data_loader" and kind.__qualname__ == name


def _accelerate_shard(batch_sampler: Any) -> bool:
    """accelerate's BatchSamplerShard: its rank's part of another batch sampler's batches, a function of
    that one's order."""
    return _accelerates(batch_sampler, "BatchSamplerShard")


def replays_batches(loader: DataLoaderX[Any]) -> bool:
    """Whether the loader's batches come from a batch sampler of the user's whose batches follow its
    sampler's order alone (torch's BatchSampler, or accelerate's BatchSamplerShard over one, as
    ``fastloader.integrations.accelerate`` gives it): an epoch is replayed whole batches at a time."""
    if not loader._plan.user_batch_sampler or isinstance(loader.dataset, IterableDataset):
        return False
    target: Any = loader.batch_sampler
    if _accelerate_shard(target):
        target = target.batch_sampler
    return type(target) is tud.BatchSampler


def order_sampler(loader: DataLoaderX[Any]) -> Any:
    """The sampler whose order decides the epoch: the loader's, or the one inside a batch sampler replayed."""
    if not replays_batches(loader):
        return loader.sampler
    target: Any = loader.batch_sampler
    return target.batch_sampler.sampler if _accelerate_shard(target) else target.sampler


def loader_world(loader: DataLoaderX[Any]) -> tuple[int, int]:
    """``(world size, rank)`` the loader's order is split for."""
    target: Any = loader.batch_sampler
    if replays_batches(loader) and _accelerate_shard(target):
        return int(target.num_processes), int(target.process_index)
    return world_of(order_sampler(loader))


def ordering_generator(loader: DataLoaderX[Any]) -> torch.Generator | None:
    """The generator whose state decides an epoch's order: the sampler's own (torch's random samplers),
    else the loader's (it also draws the workers' base seed); None when torch's global RNG decides."""
    sampler = order_sampler(loader)
    generator = getattr(sampler, "generator", None) if isinstance(sampler, _GENERATOR_SAMPLERS) else None
    if generator is None:
        generator = loader.generator
    return generator if isinstance(generator, torch.Generator) else None


def sampler_epoch(loader: DataLoaderX[Any]) -> int | None:
    """The epoch the sampler itself holds (torch's and fastloader's samplers have ``epoch``), if any."""
    for target in (loader.sampler, getattr(loader.batch_sampler, "sampler", None), order_sampler(loader)):
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
    sampler = order_sampler(loader)
    if isinstance(sampler, TorchRandomSampler):
        return torch_seed if torch_seed is not None else 0
    seed = getattr(sampler, "seed", 0)
    return seed if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0 else 0


def stateful_indexer(loader: DataLoaderX[Any]) -> Any:
    """The sampler (or user batch sampler) whose own state is saved, or None (fastloader's, or replayed)."""
    if replays_batches(loader):
        return None
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
    fields["samples_before"] = values["samples_yielded"]
    fields.update(_workers(loader, values))
    if ordering_generator(loader) is not None:
        fields["rng"] = values["rng"]
        fields["rng_at_sampler"] = values["version"] >= 5
    world = values["world_size"]
    saved = values["batch_size"]
    unit = saved if saved is not None else (loader.batch_size or 1)
    # In samples: the saved batches were of the saved batch size, whatever this loader's is.
    position = values["start"] + values["batches_yielded"] * unit * world
    changed = _batch_size_changed(loader, values)
    if isinstance(loader.dataset, IterableDataset):
        if changed:
            _check_iterable(loader, values)
        fields["before"] = values["batches_yielded"]
        return fields
    if replays_batches(loader):
        fields.update(_replay_batches(loader, values, position))
        return fields
    indexer = stateful_indexer(loader)
    if indexer is not None:
        saved_state = values["sampler"]
        received = values["batches_yielded"] > 0 or values["after"]
        if received and (saved_state is None or (saved_state["sampler"] is None and saved_state["iterator"] is None)):
            raise _cannot(loader, indexer)
        if changed:
            _check_drop_last(loader, values, values["samples_yielded"])
        fields["sampler"], fields["before"] = saved_state, values["batches_yielded"]
        return fields
    if changed:
        if values["layout"] != world or world_of(loader.sampler)[0] != world:
            _check_drop_last(loader, values, None)
        else:
            _check_drop_last(loader, values, position // world)
    fields.update(_position(loader, values, position))
    return fields


def batch_unit(loader: DataLoaderX[Any]) -> int | None:
    """The samples in each of the loader's batches (the last may be short); None: a batch sampler's own."""
    if replays_batches(loader):
        target: Any = loader.batch_sampler
        if _accelerate_shard(target) and target.split_batches:
            return int(target.batch_size) // int(target.num_processes)
        return int(target.batch_size)
    if loader._plan.user_batch_sampler:
        return None
    return loader.batch_size or 1


def _batch_size_changed(loader: DataLoaderX[Any], values: dict[str, Any]) -> bool:
    """Whether the state's batches were of another size than this loader's, with some received already."""
    saved, now = values["batch_size"], batch_unit(loader)
    received = values["batches_yielded"] > 0 or bool(values["after"])
    if not received or saved is None or now is None or saved == now:
        return False
    if values["after"]:
        raise ValueError(
            f"the state comes from batch_size={saved} with in_order=False, and {len(values['after'])} of its"
            f" batches were received out of order: this loader has batch_size={now}; resume it with"
            f" batch_size={saved} (the next epoch can use any batch_size)"
        )
    return True


def _check_iterable(loader: DataLoaderX[Any], values: dict[str, Any]) -> None:
    """An IterableDataset resumes at another batch size only from each worker's own state."""
    states = values["workers"][2] if values["workers"] is not None else {}
    replayed = not states or any(
        state["batches"] > 0 and state["dataset"] is None and state["iterator"] is None for state in states.values()
    )
    if replayed:
        raise ValueError(
            f"the state comes from batch_size={values['batch_size']}, this loader has batch_size={batch_unit(loader)}:"
            f" {type(loader.dataset).__name__} (an IterableDataset without state_dict / load_state_dict) resumes by"
            " making its batches again, which needs the same batch_size: resume with"
            f" batch_size={values['batch_size']}, or give the dataset the Stateful protocol"
        )


def _check_drop_last(loader: DataLoaderX[Any], values: dict[str, Any], consumed: int | None) -> None:
    """With drop_last, another batch size drops another tail of the epoch's rest: refuse it where it would.

    ``consumed``: the samples of this rank's order already received (None: not known, the epoch re-split)."""
    if not loader.drop_last:
        return
    saved, now = values["batch_size"], batch_unit(loader)
    if saved is None or now is None:
        return
    try:
        length = len(loader.sampler)  # type: ignore[arg-type]
    except TypeError:
        length = None
    if consumed is not None and length is not None:
        rest = max(length - consumed, 0)
        if rest - rest % saved == rest - rest % now:
            return  # the same samples are dropped at either size
        detail = (
            f"of the {rest} samples left on this rank, batch_size={saved} would leave out {rest % saved},"
            f" batch_size={now} {rest % now}"
        )
    else:
        detail = "the epoch is re-split over another number of ranks, so the tail each rank leaves out would differ"
    raise ValueError(
        f"the state comes from batch_size={saved} with drop_last=True, this loader has batch_size={now}:"
        f" {detail}: resume with batch_size={saved}, or with drop_last=False"
    )


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
        if position == 0:  # the epoch's start: laid out for this world size, as its uninterrupted run has it
            layout = sampler.num_replicas
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


def _epoch_seed(sampler: Any, values: dict[str, Any], position: int) -> int | None:
    """The recorded seed of the epoch a TorchRandomSampler without a generator draws its order from (None for
    any other sampler). States before version 3 did not record the seed of an epoch not begun (0): a fresh
    draw then."""
    if isinstance(sampler, TorchRandomSampler) and sampler.generator is None:
        return cast(int, values["seed"]) if position > 0 or values["version"] >= 3 else None
    return None


def _replay(loader: DataLoaderX[Any], values: dict[str, Any], position: int) -> dict[str, Any]:
    """A torch sampler's iteration rebuilt as it began, its first batches skipped."""
    sampler = loader.sampler
    world, _rank = world_of(sampler)
    if values["layout"] != world:
        raise ValueError(
            f"the state comes from {values['layout']} ranks, this loader runs on {world}: {_name(sampler)} cannot"
            " re-split an epoch (DataLoaderX's own split, with local_rank= or distributed=True, can)"
        )
    seed = _epoch_seed(sampler, values, position)
    if (
        not isinstance(sampler, TorchRandomSampler)
        and isinstance(sampler, _GENERATOR_SAMPLERS)
        and getattr(sampler, "generator", None) is None
    ):
        raise ValueError(
            f"DataLoaderX.load_state_dict cannot resume a {_name(sampler)} without a generator (its order comes"
            " from torch's global RNG when the epoch begins, and nothing records that draw): use shuffle=True on"
            " the loader, pass generator= to the sampler, or seed="
        )
    if isinstance(sampler, (tud.DistributedSampler, TorchRandomSampler)):
        sampler.set_epoch(values["epoch"])
    size = sampler_size(sampler, world)
    position = min(position, size) if size is not None else position
    # Samples of this rank's order left out: a multiple of the new batch size or not.
    return {"start": position, "layout": world, "skip": position // world, "seed": seed}


def _replay_batches(loader: DataLoaderX[Any], values: dict[str, Any], position: int) -> dict[str, Any]:
    """A replayed batch sampler's epoch rebuilt as it began (what decides its sampler's order put back), the
    batches already received left out, unloaded. ``position``: in samples of the epoch's global order."""
    sampler = order_sampler(loader)
    world, _rank = loader_world(loader)
    unit = batch_unit(loader) or 1
    received = values["batches_yielded"] > 0 or bool(values["after"])
    if received and values["layout"] != world:
        raise ValueError(
            f"the state comes from {values['layout']} ranks, this loader runs on {world}: the batches of"
            f" {_name(loader.batch_sampler)} cannot be re-split over other ranks; resume with {values['layout']}"
        )
    if received and position % (unit * world):
        raise ValueError(
            f"the state stops at sample {position} of epoch {values['epoch']}, which is not at a batch of"
            f" {_name(loader.batch_sampler)} (batch_size={unit} on {world} ranks): resume with"
            f" batch_size={values['batch_size']}"
        )
    if received and not _reproducible(sampler):
        raise ValueError(
            f"cannot resume this loader mid-epoch exactly: the order of {_name(sampler)} is not known to be"
            " reproducible (pass it a generator=, or use seed= on DataLoaderX)"
        )
    seed = _epoch_seed(sampler, values, position)
    if callable(getattr(sampler, "set_epoch", None)):
        sampler.set_epoch(values["epoch"])
    skip = position // (unit * world)
    return {"start": 0, "layout": world, "skip": skip, "before": skip, "seed": seed}


def _reproducible(sampler: Any) -> bool:
    """Whether an epoch's order of ``sampler`` can be drawn again from what a state records."""
    if isinstance(sampler, (EpochSampler, TorchRandomSampler, tud.SequentialSampler, tud.DistributedSampler)):
        return True
    if _accelerates(sampler, "SeedableRandomSampler"):  # use_seedable_sampler: its order is (data_seed, epoch)
        return True
    return isinstance(sampler, _GENERATOR_SAMPLERS) and isinstance(getattr(sampler, "generator", None), torch.Generator)


def _cannot(loader: DataLoaderX[Any], indexer: Any) -> ValueError:
    return ValueError(
        f"DataLoaderX.load_state_dict cannot resume a {_name(indexer)}: give it (or its iterator) state_dict /"
        " load_state_dict (the Stateful protocol), pass seed=<int>, or use a fastloader.samplers sampler"
    )
