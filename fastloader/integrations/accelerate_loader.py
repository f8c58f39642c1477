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
* its resume is DataLoaderX's own: ``state_dict()`` / ``load_state_dict()`` (called by
  ``accelerator.save_state()`` / ``load_state()``) are the DataLoaderX's (``fastloader.loader.resume``), whose
  cursor replays accelerate's batch sampler whole batches at a time (``replays_batches``: what decided the
  order put back, the batches already received left out at the index level, in accelerate's shard, so the
  ``even_batches`` padding at the end stays where it was). One state format: a prepared loader's state loads
  in a plain DataLoaderX over the same order and the reverse; a state of this module's own former format
  (``fastloader.integrations.accelerate/1``) is converted. Ranks are assumed to advance in lockstep (one
  state serves all ranks: accelerate saves custom states from the main process). What accelerate adds:
  its ``iteration`` counter follows the loaded epoch; the look-ahead never counts a batch the loop does not
  hold yet (``PrefetchIterator.at_end``), and a state taken at an epoch's last batch names the next epoch;
* ``skip_first_batches(n)`` starts its next epoch at batch ``n`` (what ``accelerator.skip_first_batches``
  and Hugging Face Trainer's resume are for): the cursor's ``skip_first``, the skipped batches never read
  (an IterableDataset's are read and dropped, as accelerate does), and ``end_of_dataloader`` at the epoch's
  last batch. accelerate's own function cannot do it on this loader:
  it iterates the loader's ``batch_sampler`` through a plain torch DataLoader, past this loader (no
  prefetch, no copy, no ``end_of_dataloader``), so the batch sampler is handed out for reading, not
  iterating, and iterating it raises, naming ``loader.skip_first_batches(n)`` (over an IterableDataset,
  which accelerate reads through its ``SkipDataLoader``, the ``collate_fn`` handed out raises so).

Which orders resume mid-epoch is DataLoaderX's rule: a sampler's generator (``shuffle=True`` on several
processes: accelerate gives the sampler one, or ``generator=``), a seed (``seed=``, accelerate's
``use_seedable_sampler``), torch's global RNG through DataLoaderX's ``shuffle=True`` sampler (one process:
its epoch seed is saved), or sequential. Otherwise ``load_state_dict`` of a mid-epoch state raises, naming
the sampler, rather than resuming into another order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch.utils.data as tud
from accelerate.data_loader import DataLoaderStateMixin
from accelerate.state import GradientState
from accelerate.utils import synchronize_rng_states

from fastloader.loader.dataloader import DataLoaderX
from fastloader.loader.prefetch_iterator import PrefetchIterator
from fastloader.samplers._epoch import check_nonnegative_int

OLD_FORMAT = "fastloader.integrations.accelerate/1"  # before the state was DataLoaderX's own (fastloader 0.x)
_OLD_KEYS = frozenset({"format", "epoch", "batches_yielded", "num_processes", "total_batch_size", "rng", "seed"})


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


class PreparedLoader(DataLoaderStateMixin):
    """A DataLoaderX reading accelerate's shard of the data, with ``DataLoaderShard``'s behaviour (module
    docstring). Anything not defined here is the DataLoaderX's (``stats()``, ``num_workers``, ...)."""

    use_stateful_dataloader = False  # accelerate's own stateful path stays off: register_for_checkpointing saves us

    def __init__(self, loader: DataLoaderX[Any], shard: Any, drop_last: bool) -> None:
        self.base_dataloader = loader  # DataLoaderShard's name for the loader it wraps
        self._shard = shard  # accelerate's DataLoaderShard over the same batch sampler: it answers accelerate
        self._iterable = isinstance(loader.dataset, tud.IterableDataset)  # accelerate shards the dataset itself
        self._drop_last = drop_last  # the user's; read by DataLoaderStateMixin.begin (the remainder)
        self.gradient_state = GradientState()
        self.rng_types = shard.rng_types
        self.synchronized_generator = shard.synchronized_generator
        self.iteration = 0  # accelerate's epoch counter (DataLoaderShard.iteration)
        self._loaded_at: tuple[int, int] | None = None  # (epoch, batch) of a state loaded for the next iter()
        self._drop_next = 0  # skip_first_batches of an IterableDataset: batches the next iter() reads and drops

    def __iter__(self) -> Iterator[Any]:
        if self.rng_types is not None:
            synchronize_rng_states(self.rng_types, self.synchronized_generator)
        self.set_epoch(self.iteration)
        self._loaded_at = None
        self.begin()
        batches: PrefetchIterator = iter(self.base_dataloader)
        drop, self._drop_next = self._drop_next, 0
        for _ in range(drop):  # an IterableDataset's order is its own: read past them, as accelerate does
            if next(batches, None) is None:
                break
        for batch in batches:
            # As DataLoaderShard, one batch ahead: the loop holds the last batch with end_of_dataloader set.
            if batches.at_end():
                self.end_of_dataloader = True
            yield batch
        self.iteration += 1
        self.end()  # as DataLoaderShard: after the last batch only (a loop that breaks leaves it registered)

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
        if self._loaded_at is not None and self._loaded_at[1]:
            epoch, batch = self._loaded_at
            if count != batch:
                raise ValueError(
                    f"skip_first_batches({count}) after load_state, which resumes this loader at batch"
                    f" {batch} of epoch {epoch} already: the two would skip twice; drop the call"
                )
            return self
        if self._iterable:
            self._drop_next = count
        else:
            self.base_dataloader._cursor.skip_first(count)
        return self

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch everywhere accelerate sets it (its batch sampler, their sampler, the dataset) and
        DataLoaderX's (no epoch advances by itself)."""
        self.iteration = epoch
        self._shard.set_epoch(epoch)
        self.base_dataloader.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where this rank's loop is, for ``accelerator.save_state()``: the DataLoaderX's own state."""
        state = self.base_dataloader.state_dict()
        if self._drop_next:  # an IterableDataset's skip_first_batches, not begun: it counts as received
            state["batches_yielded"] = self._drop_next
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state_dict()``'s output at the next ``iter()`` (DataLoaderX's rules: ValueError for
        a foreign state, one from another number of processes or batch size, or a mid-epoch one whose order
        cannot be rebuilt). A state of the former ``fastloader.integrations.accelerate/1`` format is converted."""
        if isinstance(state, Mapping) and state.get("format") == OLD_FORMAT:
            state = self._from_old_format(state)
        self.base_dataloader.load_state_dict(state)
        self.iteration = self.base_dataloader._cursor.epoch
        batches = state.get("batches_yielded", 0) if isinstance(state, Mapping) else 0
        self._loaded_at, self._drop_next = (self.iteration, int(batches)), 0

    def _from_old_format(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """A ``fastloader.integrations.accelerate/1`` state as DataLoaderX's (version 5)."""
        if set(state) != _OLD_KEYS:
            expected = sorted(_OLD_KEYS)
            raise ValueError(f"not a {OLD_FORMAT} loader state: expected the keys {expected}, got {sorted(state)}")
        processes = check_nonnegative_int(state["num_processes"], "state['num_processes']")
        total = check_nonnegative_int(state["total_batch_size"], "state['total_batch_size']")
        batches = check_nonnegative_int(state["batches_yielded"], "state['batches_yielded']")
        if processes < 1 or total < processes:
            raise ValueError(f"{OLD_FORMAT} state: num_processes={processes}, total_batch_size={total}")
        size = total // processes  # split_batches or not: each rank's batches of total_batch_size / num_processes
        seed = state["seed"]
        return {
            "version": 5,
            "epoch": state["epoch"],
            "samples_yielded": batches * size,
            "batches_yielded": batches,
            "batch_size": size,
            "seed": seed if isinstance(seed, int) and seed >= 0 else 0,
            "world_size": processes,
            "rank": 0,
            "start": 0,
            "layout": processes,
            "rng": state["rng"],
            "base_seed": None,
            "after": [],
            "sampler": None,
            "workers": None,
            "dataset": None,
            "next_rng": "",
        }

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
        return _RefusedElsewhere(collate) if self._iterable else collate

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
