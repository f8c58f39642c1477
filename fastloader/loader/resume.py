"""Loader-level resume (``DataLoaderX.state_dict`` / ``load_state_dict``) and the samplers that allow it.

The state is plain data (JSON-serializable, no index copies, nothing to unpickle)::

    {"version": 2, "epoch": e, "samples_yielded": n, "batches_yielded": k, "seed": s,
     "world_size": W, "rank": r, "start": g, "layout": L, "rng": "<base64>" or ""}

``samples_yielded`` / ``batches_yielded`` count what *this rank's training loop received* in this
iteration (the producer thread and torch's workers run ahead; they are not counted). The position
reached in the epoch's global order (all ranks together, padded or cut for ``L`` ranks; ``L == W``
unless this iteration itself resumed at another world size) is ``g + k * batch_size * W``.

Assumption (DDP): ranks advance in lockstep, so when the state is taken every rank has delivered the
same ``k`` batches and together they consumed the next ``k * batch_size * W`` positions. That is what
a training loop that saves at step k on every rank (or on rank 0 only) does.

Loading applies to the next ``iter()`` (the torchdata StatefulDataLoader convention): that iteration
delivers the rest of the epoch, in the order an uninterrupted run would have, whatever ``num_workers``.
A state taken after the last batch of an epoch names the next epoch at position 0.

Two kinds of sampler resume:

* fastloader's samplers (``seed=``, or a split by ``local_rank`` / ``distributed=True``) start the
  epoch's order at the position themselves; with another world size the rest of the epoch is re-split
  over the new ranks (nothing lost, nothing repeated but the padding that keeps ranks equal).
* torch's samplers are *replayed*: the iteration is rebuilt exactly as it began and its first
  ``position / (batch_size * W)`` batches of indices are skipped (no sample is loaded for them).
  That needs what decided the order: for ``shuffle=True`` without a generator, the seed that torch's
  RandomSampler drew for the epoch (``seed``; see ``TorchRandomSampler``); with a ``generator``, its
  state when the epoch began (``rng``, base64 of ``Generator.get_state()``; restoring it also replays
  the workers' base seed); ``SequentialSampler`` and ``DistributedSampler`` (seed + epoch) need
  nothing more. Same world size only.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
import torch.utils.data as tud
from torch.utils.data import IterableDataset

from fastloader.samplers import (
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    ShardWindowSampler,
    WeightedRandomSampler,
)
from fastloader.samplers._epoch import check_nonnegative_int
from fastloader.samplers.torch_random import TorchRandomSampler

VERSION = 2
_KEYS_V1 = frozenset(
    {"version", "epoch", "samples_yielded", "batches_yielded", "seed", "world_size", "rank", "start", "layout"}
)
KEYS = _KEYS_V1 | {"rng"}
_OURS = (RandomSampler, SequentialSampler, WeightedRandomSampler)
# torch's samplers whose order is decided by their own generator, when they have one
_GENERATOR_SAMPLERS = (tud.RandomSampler, tud.WeightedRandomSampler, tud.SubsetRandomSampler)


@dataclasses.dataclass
class Progress:
    """Where one iteration of a DataLoaderX started and how many batches its consumer received."""

    epoch: int
    start: int = 0  # global position at which the iteration started
    layout: int | None = None  # world size the epoch's global order is laid out for; None: the current one
    batches: int = 0
    done: bool = False  # StopIteration reached
    # Replay of torch's samplers (see the module docstring):
    skip: int = 0  # batches of indices the iteration skips
    rng: torch.Tensor | None = None  # the ordering generator's state when the iteration began
    seed: int | None = None  # the seed TorchRandomSampler uses for this epoch, when it is known up front


def ordering_generator(loader: Any) -> torch.Generator | None:
    """The generator whose state decides an epoch's order: the sampler's own (torch's random samplers),
    else the loader's (it also draws the workers' base seed); None when torch's global RNG decides."""
    sampler = loader.sampler
    generator = getattr(sampler, "generator", None) if isinstance(sampler, _GENERATOR_SAMPLERS) else None
    if generator is None:
        generator = loader.generator
    return generator if isinstance(generator, torch.Generator) else None


def begin(loader: Any, progress: Progress) -> None:
    """At ``iter()``, before torch's iterator exists: record the ordering generator's state, or, when the
    iteration resumes a replayed one, put back what decided its order."""
    generator = ordering_generator(loader)
    if progress.rng is not None and generator is not None:
        generator.set_state(progress.rng)
    elif generator is not None:
        progress.rng = generator.get_state()
    if progress.seed is not None and isinstance(loader.sampler, TorchRandomSampler):
        loader.sampler.pin_next_seed(progress.seed)


def world_of(sampler: Any) -> tuple[int, int]:
    if isinstance(sampler, (tud.DistributedSampler, ShardWindowSampler)):
        return sampler.num_replicas, sampler.rank
    return 1, 0


def _layout_size(sampler: Any, layout: int) -> int:
    if isinstance(sampler, DistributedSampler):
        return sampler.layout_size(layout)
    if isinstance(sampler, tud.DistributedSampler):
        return sampler.total_size
    if isinstance(sampler, ShardWindowSampler):
        return sampler.num_samples * sampler.num_replicas
    return len(sampler)


def _encode(rng: torch.Tensor | None) -> str:
    return "" if rng is None else base64.b64encode(rng.numpy().tobytes()).decode("ascii")


def _decode(text: str) -> torch.Tensor | None:
    if text == "":
        return None
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as error:
        raise ValueError(f"state['rng'] is not base64: {error}") from None
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def _seed_of(loader: Any, progress: Progress) -> int:
    sampler = loader.sampler
    if isinstance(sampler, TorchRandomSampler):
        if progress.seed is not None:
            return progress.seed
        return sampler.epoch_seed if sampler.epoch_seed is not None and progress.batches > 0 else 0
    return int(getattr(sampler, "seed", 0))


def state_of(loader: Any, progress: Progress) -> dict[str, Any]:
    """The loader state after ``progress`` (see the module docstring); never raises."""
    sampler = loader.sampler
    world, rank = world_of(sampler)
    layout = progress.layout or world
    seed = _seed_of(loader, progress)
    rng = progress.rng
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
            rng = None
            if isinstance(sampler, TorchRandomSampler):
                seed = 0  # the next epoch draws its own
    if rng is None:  # the next iteration starts where the generator is now
        generator = ordering_generator(loader)
        rng = generator.get_state() if generator is not None else None
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
        "rng": _encode(rng),
    }


def check_state(state: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(state, Mapping):
        raise ValueError(f"DataLoaderX state must be a mapping, got {type(state).__name__}")
    version = state.get("version")
    if version not in (1, VERSION) or isinstance(version, bool):
        raise ValueError(f"DataLoaderX state version {version!r} is not supported (expected 1 or {VERSION})")
    expected = _KEYS_V1 if version == 1 else KEYS
    if set(state) != expected:
        raise ValueError(f"not a DataLoaderX state: expected the keys {sorted(expected)}, got {sorted(state)}")
    values: dict[str, Any] = {key: check_nonnegative_int(state[key], f"state[{key!r}]") for key in sorted(_KEYS_V1)}
    if values["world_size"] < 1 or values["layout"] < 1:
        raise ValueError("state['world_size'] and state['layout'] must be >= 1")
    rng = state.get("rng", "")
    if not isinstance(rng, str):
        raise ValueError(f"state['rng'] must be a str, got {type(rng).__name__}")
    values["rng"] = _decode(rng)
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
    elif isinstance(sampler, ShardWindowSampler):
        if layout != sampler.num_replicas:
            raise ValueError(
                f"the state comes from {layout} ranks, this ShardWindowSampler splits over {sampler.num_replicas}:"
                " resume with the same number of ranks"
            )
        offset = min(position, _layout_size(sampler, layout)) // layout
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
    return Progress(epoch, start=position, layout=layout)


def _replay(loader: Any, values: dict[str, Any], position: int) -> Progress:
    """The starting point of a torch sampler's iteration rebuilt as it began, its first batches skipped."""
    sampler = loader.sampler
    name = f"{type(sampler).__module__}.{type(sampler).__qualname__}"
    world, _rank = world_of(sampler)
    if values["layout"] != world:
        raise ValueError(
            f"the state comes from {values['layout']} ranks, this loader runs on {world}: {name} cannot re-split an"
            " epoch (DataLoaderX's own split, with local_rank= or distributed=True, can)"
        )
    rng = values["rng"]
    if isinstance(sampler, TorchRandomSampler) and sampler.generator is None:
        seed = values["seed"] if position > 0 else None  # at position 0 a fresh draw is as good
    elif isinstance(sampler, _GENERATOR_SAMPLERS):
        if getattr(sampler, "generator", None) is None:
            raise ValueError(
                f"DataLoaderX.load_state_dict cannot resume a {name} without a generator (its order comes from"
                " torch's global RNG): use shuffle=True on the loader, pass generator= to the sampler, or seed="
            )
        seed = None
    elif isinstance(sampler, (tud.SequentialSampler, tud.DistributedSampler)):
        seed = None
    else:
        raise ValueError(
            f"DataLoaderX.load_state_dict cannot resume a {name}: pass seed=<int> (or a fastloader.samplers"
            " sampler) to make the order resumable"
        )
    if rng is not None and ordering_generator(loader) is None:
        rng = None  # a state from a loader with a generator, loaded into one without: nothing to restore
    if isinstance(sampler, tud.DistributedSampler):
        sampler.set_epoch(values["epoch"])
    position = min(position, _layout_size(sampler, world))
    unit = (loader.batch_size or 1) * world
    return Progress(values["epoch"], start=position, layout=world, skip=-(-position // unit), rng=rng, seed=seed)
