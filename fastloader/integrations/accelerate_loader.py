"""The loader ``fastloader.integrations.accelerate.prepare`` returns: a DataLoaderX over accelerate's shard.

What accelerate's ``DataLoaderShard`` does around its loader, this does around a DataLoaderX, so the
training loop sees accelerate's semantics with fastloader's pipeline underneath:

* each ``iter()`` synchronizes the random generators accelerate synchronizes (``rng_types``: the
  sampler's generator by default, so every rank shuffles alike), sets the epoch (accelerate's
  ``iteration`` counter) and registers the loader with accelerate's ``GradientState``
  (``DataLoaderStateMixin``);
* it runs one batch ahead, as ``DataLoaderShard`` does, so that ``end_of_dataloader`` is already true
  while the loop holds the last batch: ``gather_for_metrics`` then drops the ``even_batches`` padding
  (``remainder``) and gradient accumulation syncs. DataLoaderX's prefetch thread is ahead anyway: the
  look-ahead takes a batch that is already waiting. ``stats()`` (DataLoaderX's) counts it as delivered;
* ``state_dict()`` / ``load_state_dict()`` (called by ``accelerator.save_state()`` / ``load_state()``)
  resume mid-epoch: the state holds the epoch, the batches this rank's loop received and what decided
  the epoch's order; loading applies to the next ``iter()``, which rebuilds the order and leaves out the
  batches already received at the index level (no sample of them is read), in accelerate's shard, so
  the ``even_batches`` padding at the end stays where it was. Ranks are assumed to advance in lockstep
  (one state serves all ranks: accelerate saves custom states from the main process);
* ``skip_first_batches(n)`` starts its next epoch at batch ``n`` (what ``accelerator.skip_first_batches``
  and Hugging Face Trainer's resume are for): the order rebuilt, the skipped batches never read, and
  ``end_of_dataloader`` at the epoch's last batch. accelerate's own function cannot do it on this loader:
  it iterates the loader's ``batch_sampler`` through a plain torch DataLoader, past this loader (no
  prefetch, no copy, no ``end_of_dataloader``), so the batch sampler is handed out for reading, not
  iterating, and iterating it raises, naming ``loader.skip_first_batches(n)`` (over an IterableDataset,
  which accelerate reads through its ``SkipDataLoader``, the ``collate_fn`` handed out raises so).

The order of an epoch can be rebuilt when it comes from a sampler's generator (``shuffle=True`` on
several processes: accelerate gives the sampler one, or ``generator=``), from a seed (``seed=``,
accelerate's ``use_seedable_sampler``), from torch's global RNG through DataLoaderX's ``shuffle=True``
sampler (one process: its epoch seed is saved), or is sequential. Otherwise ``load_state_dict`` of a
mid-epoch state raises, naming the sampler, rather than resuming into another order.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.utils.data as tud
from accelerate.data_loader import DataLoaderStateMixin, SeedableRandomSampler
from accelerate.state import GradientState
from accelerate.utils import synchronize_rng_states

from fastloader.loader.dataloader import DataLoaderX
from fastloader.samplers import RandomSampler, SequentialSampler, WeightedRandomSampler
from fastloader.samplers._epoch import check_nonnegative_int
from fastloader.samplers.torch_random import TorchRandomSampler

FORMAT = "fastloader.integrations.accelerate/1"
_KEYS = frozenset({"format", "epoch", "batches_yielded", "num_processes", "total_batch_size", "rng", "seed"})
# Their order is a function of (seed, epoch): fastloader's, accelerate's use_seedable_sampler, torch's sequential
_SEEDED = (RandomSampler, SequentialSampler, WeightedRandomSampler, SeedableRandomSampler, tud.SequentialSampler)


class ResumableBatches:
    """The batch sampler the DataLoaderX reads: accelerate's, whose next iteration can start at a batch.

    ``__iter__`` is a generator, so ``skip`` is spent when that iteration yields its first batch: torch's
    multi-process iterator calls ``iter()`` twice when it starts and uses the second, and a persistent
    one calls it on this same object again each epoch, so a resume reaches it there too.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.skip = 0

    def __iter__(self) -> Iterator[Any]:
        skip, self.skip = self.skip, 0
        yield from itertools.islice(iter(self.inner), skip, None)

    def __len__(self) -> int:
        return len(self.inner)


SKIP_REFUSED = (
    "a loader from fastloader.integrations.accelerate.prepare reads its batches itself: iterating its"
    " batch sampler elsewhere, as accelerator.skip_first_batches(loader, n) does (through a plain torch"
    " DataLoader: no prefetch, no copy to the device, no end_of_dataloader at the last batch), would not be"
    " this loader's epoch. Call loader.skip_first_batches(n) (the loader's own method) instead: its next"
    " epoch starts at batch n, exactly; after accelerator.load_state(path) nothing is needed, the loader"
    " continues where save_state() was called. With Hugging Face's Trainer, mix"
    " fastloader.integrations.transformers.ExactResumeMixin into the Trainer class"
)


class ReadByTheLoader(tud.BatchSampler):
    """accelerate's batch sampler as ``PreparedLoader.batch_sampler`` hands it out: its attributes read and
    set as they are (``join_uneven_inputs`` sets ``even_batches``), its length, but no iteration: only the
    loader reads its batches (``accelerator.skip_first_batches`` would read them past it, see ``SKIP_REFUSED``).
    A BatchSampler, as what it stands for is: accelerate's ``get_sampler`` tells the two layouts apart so."""

    def __init__(self, inner: Any) -> None:  # torch's __init__ is not run: every attribute is the inner one's
        object.__setattr__(self, "inner", inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.inner, name, value)

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[Any]:
        # Code other than accelerate's skip_first_batches may iterate it (a callback inspecting the order, a
        # length check): the message says what was done before why.
        raise ValueError(f"the batch sampler of a prepared loader (loader.batch_sampler) was iterated: {SKIP_REFUSED}")


class _RefusedElsewhere:
    """A collate_fn handed out, not to be called: the loader itself calls its own (see ``collate_fn``)."""

    def __init__(self, collate: Any) -> None:
        self.collate = collate

    def __call__(self, batch: Any) -> Any:
        raise ValueError(f"the collate_fn of a prepared loader (loader.collate_fn) was called: {SKIP_REFUSED}")


@dataclasses.dataclass
class Cursor:
    """Where one epoch of the training loop is, and what decided that epoch's order."""

    epoch: int
    batches: int = 0  # batches this rank's loop received
    rng: torch.Tensor | None = None  # the order's generator state when the epoch began
    seed: int | None = None  # a generator-less TorchRandomSampler: the seed it drew for the epoch
    done: bool = False  # the epoch's last batch was delivered


class PreparedLoader(DataLoaderStateMixin):
    """A DataLoaderX reading accelerate's shard of the data, with ``DataLoaderShard``'s behaviour (module
    docstring). Anything not defined here is the DataLoaderX's (``stats()``, ``num_workers``, ...)."""

    use_stateful_dataloader = False  # accelerate's own stateful path stays off: register_for_checkpointing saves us

    def __init__(self, loader: DataLoaderX[Any], shard: Any, batches: ResumableBatches | None, drop_last: bool) -> None:
        self.base_dataloader = loader  # DataLoaderShard's name for the loader it wraps
        self._shard = shard  # accelerate's DataLoaderShard over the same batch sampler: it answers accelerate
        self._batches = batches  # None for an IterableDataset (accelerate shards the dataset itself)
        self._drop_last = drop_last  # the user's; read by DataLoaderStateMixin.begin (the remainder)
        self.gradient_state = GradientState()
        self.rng_types = shard.rng_types
        self.synchronized_generator = shard.synchronized_generator
        self.iteration = 0  # accelerate's epoch counter (DataLoaderShard.iteration)
        sharded = batches.inner if batches is not None else shard.dataset
        self._num_processes = int(getattr(sharded, "num_processes", 1))
        self._cursor: Cursor | None = None  # the epoch being (or last) delivered
        self._pending: Cursor | None = None  # a loaded state, for the next iter()
        self._skip_next = 0  # skip_first_batches: batches the next iter() leaves out

    def __iter__(self) -> Iterator[Any]:
        if self.rng_types is not None:
            synchronize_rng_states(self.rng_types, self.synchronized_generator)
        self.set_epoch(self.iteration)
        cursor = self._cursor = self._start()
        self.begin()
        yield from self._deliver(cursor, drop=cursor.batches if self._batches is None else 0)
        self.end()  # as DataLoaderShard: after the last batch only (a loop that breaks leaves it registered)

    def _deliver(self, cursor: Cursor, drop: int) -> Iterator[Any]:
        batches = iter(self.base_dataloader)
        try:
            for _ in range(drop):  # an IterableDataset's order is its own: read past them, as accelerate does
                next(batches)
            current = next(batches)
        except StopIteration:
            return
        while True:
            try:
                following = next(batches)
            except StopIteration:
                self.end_of_dataloader = True
                cursor.batches, cursor.done = cursor.batches + 1, True
                yield current
                break
            cursor.batches += 1
            yield current
            current = following
        self.iteration += 1
        self._cursor = None

    def _start(self) -> Cursor:
        """At ``iter()``: this epoch's cursor; resuming, what decided the order is put back first."""
        pending, self._pending = self._pending, None
        sampler = self._order_sampler()
        generator = _generator_of(sampler)
        skip, self._skip_next = self._skip_next, 0
        if pending is not None:
            if pending.rng is not None and generator is not None:
                generator.set_state(pending.rng)  # after the rng synchronization: every rank loaded the same
            if pending.seed is not None and isinstance(sampler, TorchRandomSampler) and generator is None:
                sampler.pin_next_seed(pending.seed)
            skip = pending.batches or skip  # skip_first_batches after a state of an epoch's start
        if self._batches is not None:
            self._batches.skip = skip
        return Cursor(self.iteration, skip, generator.get_state() if generator is not None else None)

    def skip_first_batches(self, num_batches: int) -> PreparedLoader:
        """Start the next epoch at its batch ``num_batches``; returns this loader.

        What ``accelerate.skip_first_batches(loader, num_batches)`` is for, done by the loader: the epoch is
        the one the next ``set_epoch`` names (or the next in line), in the order an uninterrupted run has, its
        first ``num_batches`` left out at the index level (an IterableDataset's are read and dropped), with
        prefetch, the copy to the device and ``end_of_dataloader`` at its last batch; the epoch after it is
        whole. After ``accelerator.load_state``, which already puts the loader at the batch saved, the same
        ``num_batches`` changes nothing and any other is a ValueError (the two would skip twice)."""
        count = check_nonnegative_int(num_batches, "num_batches")
        length = _length_of(self.base_dataloader)
        if length is not None and count > length:
            raise ValueError(f"skip_first_batches({count}): the epoch has {length} batches")
        pending = self._pending
        if pending is not None and pending.batches:
            if count != pending.batches:
                raise ValueError(
                    f"skip_first_batches({count}) after load_state, which resumes this loader at batch"
                    f" {pending.batches} of epoch {pending.epoch} already: the two would skip twice; drop the call"
                )
            return self
        self._skip_next = count
        return self

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch everywhere accelerate sets it (its batch sampler, their sampler, the dataset) and
        DataLoaderX's (no epoch advances by itself). A loaded state of another epoch is dropped."""
        self.iteration = epoch
        self._shard.set_epoch(epoch)
        self.base_dataloader.set_epoch(epoch)
        if self._pending is not None and self._pending.epoch != epoch:
            self._pending = None

    def state_dict(self) -> dict[str, Any]:
        """Where this rank's loop is: plain data (JSON-safe), for ``accelerator.save_state()``."""
        cursor = self._pending or self._cursor
        sampler = self._order_sampler()
        if cursor is None or cursor.done:  # between epochs: the next one from its start (or skip_first_batches')
            generator = _generator_of(sampler)
            epoch = cursor.epoch + 1 if cursor is not None else self.iteration
            cursor = Cursor(epoch, self._skip_next, generator.get_state() if generator is not None else None)
        elif cursor is self._pending and self._skip_next:
            cursor = dataclasses.replace(cursor, batches=self._skip_next)
        elif cursor.seed is None and cursor.batches and isinstance(sampler, TorchRandomSampler):
            cursor.seed = sampler.epoch_seed  # drawn when the epoch's first index was taken
        return {
            "format": FORMAT,
            "epoch": cursor.epoch,
            "batches_yielded": cursor.batches,
            "num_processes": self._num_processes,
            "total_batch_size": self.total_batch_size,
            "rng": _encode(cursor.rng),
            "seed": cursor.seed if cursor.seed is not None else -1,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state_dict()``'s output at the next ``iter()``. ValueError for a foreign state, one
        from another number of processes or batch size, or a mid-epoch one whose order cannot be rebuilt."""
        cursor = _parse(state)
        here = {"num_processes": self._num_processes, "total_batch_size": self.total_batch_size}
        there = {key: state[key] for key in here}
        if there != here:
            raise ValueError(f"the loader state comes from {there}, this loader runs with {here}: resume with the same")
        if cursor.batches:
            problem = _why_not_replayable(self.dataset, self._order_sampler())
            if problem is not None:
                raise ValueError(f"cannot resume this loader mid-epoch exactly: {problem}")
        self._pending, self.iteration = cursor, cursor.epoch

    def _order_sampler(self) -> Any:
        """The sampler whose order decides the epoch (inside accelerate's batch sampler), if any."""
        batches = self._batches.inner if self._batches is not None else None
        inner = getattr(batches, "batch_sampler", batches)  # BatchSamplerShard wraps the loader's batch sampler
        return getattr(inner, "sampler", None)

    # What accelerate and its users read from a DataLoaderShard, answered as it answers them.
    @property
    def dataset(self) -> Any:
        return self.base_dataloader.dataset

    @property
    def batch_sampler(self) -> Any:
        inner = self._shard.batch_sampler  # join_uneven_inputs sets its even_batches
        return ReadByTheLoader(inner) if inner is not None else None

    @property
    def sampler(self) -> Any:
        sampler = self._shard.sampler
        return ReadByTheLoader(sampler) if isinstance(sampler, tud.BatchSampler) else sampler

    @property
    def collate_fn(self) -> Any:
        """The loader's collate_fn; for an IterableDataset one that refuses to run in another loader: what
        rebuilds this one from its attributes (``accelerator.skip_first_batches``'s ``SkipDataLoader``) would
        read the data past it, where no batch sampler of ours is iterated to refuse it."""
        collate = self.base_dataloader.collate_fn
        return _RefusedElsewhere(collate) if self._batches is None else collate

    @property
    def total_batch_size(self) -> int:
        return int(self._shard.total_batch_size)

    @property
    def total_dataset_length(self) -> int:
        return int(self._shard.total_dataset_length)

    def get_sampler(self) -> Any:
        return self._shard.get_sampler()

    def set_sampler(self, sampler: Any) -> None:
        self._shard.set_sampler(sampler)

    def __len__(self) -> int:
        return len(self.base_dataloader)

    def __getattr__(self, name: str) -> Any:
        base = self.__dict__.get("base_dataloader")
        if base is None:
            raise AttributeError(name)
        return getattr(base, name)


def _length_of(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:  # an IterableDataset without __len__
        return None


def _generator_of(sampler: Any) -> torch.Generator | None:
    generator = getattr(sampler, "generator", None)
    return generator if isinstance(generator, torch.Generator) else None


def _why_not_replayable(dataset: Any, sampler: Any) -> str | None:
    if isinstance(dataset, tud.IterableDataset):
        return f"{type(dataset).__name__} is an IterableDataset, whose order is its own (save at the end of an epoch)"
    if sampler is None:
        return "its batch sampler has no sampler whose order could be rebuilt"
    if isinstance(sampler, (*_SEEDED, TorchRandomSampler)) or _generator_of(sampler) is not None:
        return None
    name = f"{type(sampler).__module__}.{type(sampler).__qualname__}"
    return f"the order of {name} is not known to be reproducible (pass it a generator=, or use seed= on DataLoaderX)"


def _parse(state: Mapping[str, Any]) -> Cursor:
    if not isinstance(state, Mapping) or state.get("format") != FORMAT or set(state) != _KEYS:
        found = sorted(state) if isinstance(state, Mapping) else type(state).__name__
        raise ValueError(f"not a {FORMAT} loader state: expected the keys {sorted(_KEYS)}, got {found}")
    values = {key: check_nonnegative_int(state[key], f"state[{key!r}]") for key in ("epoch", "batches_yielded")}
    seed = state["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < -1:
        raise ValueError(f"state['seed'] must be an int >= -1, got {seed!r}")
    return Cursor(values["epoch"], values["batches_yielded"], _decode(state["rng"]), seed if seed >= 0 else None)


def _encode(rng: torch.Tensor | None) -> str:
    return "" if rng is None else base64.b64encode(rng.numpy().tobytes()).decode("ascii")


def _decode(text: Any) -> torch.Tensor | None:
    if not isinstance(text, str):
        raise ValueError(f"state['rng'] must be a str, got {type(text).__name__}")
    if text == "":
        return None
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as error:
        raise ValueError(f"state['rng'] is not base64: {error}") from None
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)
