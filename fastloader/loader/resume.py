"""Loader-level resume: one :class:`ResumeCursor` per DataLoaderX holds its epoch state.

The cursor is the one home of what ``state_dict()`` saves and ``load_state_dict()`` restores (the format:
``fastloader.loader.resume_state``). torchdata's StatefulDataLoader contract is the model:

* ``load_state_dict`` applies to the next ``iter()``, which delivers the rest of that epoch in the order an
  uninterrupted run would have (the same sequence with ``in_order=True``; exactly the batches not yet
  received with ``in_order=False``), whatever ``num_workers`` for a map-style dataset. Persistent workers
  that already run are restarted for it (their processes hold the state of the run they made).
* A state taken after the last batch of an epoch, before the loop saw its end, resumes into that finished
  epoch (it delivers nothing; the next ``iter()`` is the next epoch); a state taken after the end names the
  next epoch at its first batch. A state taken before the first batch of an epoch (before or after ``iter()``)
  fixes that epoch's seeds: loading it gives the very batches the interrupted run had.
* A loop that cut the loaded epoch short (Lightning's ``limit_train_batches``) goes on with the next epoch:
  ``set_epoch`` after the load, or the sampler's epoch set after ``iter()`` (Lightning's order). The loaded
  iteration begins as the interrupted one did (its draws of torch's RNGs), and its first ``next()`` opens
  that epoch in its place (``moved_on`` / ``end_loaded``; ``fastloader.loader.epoch``): the uninterrupted
  run's order, not the rest of the cut epoch.
* What the order is made of, per sampler: fastloader's samplers (``seed=``, or the split by ``local_rank`` /
  ``distributed=True``) start at the position themselves (with another world size the rest of the epoch is
  re-split over the new ranks; ranks are assumed to advance in lockstep, as DDP makes them); a sampler with
  its own ``state_dict`` (the Stateful protocol, on the sampler or its iterator) has its state after the last
  received batch restored; torch's samplers are *replayed*: the epoch's order is rebuilt from what decided it
  (the seed torch's RandomSampler draws, see ``TorchRandomSampler``; a generator's state when the epoch
  began; the epoch of a DistributedSampler) and the batches already received are left out, unloaded. A
  ``RandomSampler`` without a generator that the user passed is refused: nothing records its draw.
* Positions are in samples of the epoch's order (the state records the size of the batches it counts), so a
  loader with another ``batch_size`` resumes at the very sample reached and batches the rest at its own size;
  where the rest cannot be the same samples (``drop_last``, out-of-order batches, a replayed IterableDataset)
  ``load_state_dict`` refuses it (``fastloader.loader.resume_samplers``).
* The workers' side (each worker's dataset / iterator state and random generators, restored in the worker
  that plays its role): ``fastloader.loader.worker_state``.
"""

from __future__ import annotations

import copy
import dataclasses
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterableDataset

from fastloader.loader.dataset_protocols import foreign_state, library_resume
from fastloader.loader.epoch_progress import Indexing, Plan, Progress
from fastloader.loader.resume_samplers import (
    batch_unit,
    loader_world,
    order_sampler,
    ordering_generator,
    place,
    replays_batches,
    sampler_epoch,
    sampler_size,
    seed_of,
)
from fastloader.loader.resume_state import VERSION, check_state, encode_rng, encode_workers
from fastloader.loader.worker_state import WorkerState
from fastloader.samplers.torch_random import TorchRandomSampler
from fastloader.torch_internals import index_sampler, persistent_iterator

if TYPE_CHECKING:
    from fastloader.loader.dataloader import DataLoaderX


class ResumeCursor:
    """A DataLoaderX's epoch and resume state: the epoch counter, a loaded state waiting for the next
    ``iter()``, and the progress of the current iteration."""

    def __init__(self, loader: DataLoaderX[Any]) -> None:
        self.bind(loader)
        self.epoch = 0  # the epoch of the current (or next) iteration
        self.epoch_set = False  # set_epoch or load_state_dict since the last iter()
        self.started = False
        self.sampler_epoch_at_iter: int | None = None  # the sampler's own epoch at the last iter()
        self.pending: Plan | None = None
        self.current: Progress | None = None
        self.workers_base_seed: int | None = None  # of the workers running now
        # After a resume: torch's global RNG as the uninterrupted run's draws would have left it (the state's
        # next_rng), from which the epochs after the loaded one draw their seeds in place of the global RNG,
        # so they are the uninterrupted run's (the training loop's own draws in between aside). None: the
        # global RNG itself decides, as in torch's loader.
        self.seed_stream: torch.Generator | None = None
        self.skip_next = 0  # skip_first: batches the next iteration leaves out (a replayed batch sampler's)

    def bind(self, loader: DataLoaderX[Any]) -> None:
        # A weak reference: a loader <-> cursor cycle would leave every loader (and its persistent workers'
        # iterator) to the garbage collector, which may then run torch's __del__ in a forked worker.
        self._loader = weakref.ref(loader)

    @property
    def loader(self) -> DataLoaderX[Any]:
        loader = self._loader()
        if loader is None:
            raise RuntimeError("the DataLoaderX of this ResumeCursor is gone")
        return loader

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_loader"]  # DataLoaderX.__setstate__ binds the copy to its loader
        return state

    # --- epochs -----------------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        pending = self.pending
        if pending is not None and pending.epoch != epoch and pending.loaded is None:
            self.pending = None  # another epoch than the one pinned: start it from the beginning
        # A loaded state stays: its iteration begins as the interrupted one did (the same draws of torch's
        # RNGs), and its first next() moves on to this epoch (moved_on), from where the loaded one stopped.
        self.epoch, self.epoch_set = epoch, True

    def next_plan(self) -> Plan:
        """At ``iter()``: advance the epoch (unless it was set since the last one) and say how the iteration starts."""
        loader = self.loader
        if self.started and not self.epoch_set:
            external = sampler_epoch(loader)
            if external is not None and external != self.sampler_epoch_at_iter:
                loader.set_epoch(external)  # a framework set the sampler's epoch itself (Lightning does): keep it
            else:
                loader.set_epoch(self.epoch + 1)
        self.started, self.epoch_set = True, False
        current = self.current
        if self.pending is not None:
            plan = self.pending
        elif current is not None and current.done and current.plan.epoch + 1 == self.epoch:
            plan = self._after(current)
        else:
            plan = Plan(self.epoch)
        plan, self.skip_next = self._skipping(plan), 0
        return plan

    def skip_first(self, batches: int) -> None:
        """Start the next iteration (the epoch ``set_epoch`` names, or the next in line) at its batch
        ``batches``, those before it left out unloaded: what ``skip_first_batches`` asks of a loader whose
        batches are replayed (``fastloader.loader.resume_samplers.replays_batches``). A loaded state takes
        precedence (it names its own batch)."""
        if not replays_batches(self.loader):
            raise ValueError("skip_first needs a loader whose batch sampler is replayed (torch's BatchSampler)")
        self.skip_next = batches

    def _skipping(self, plan: Plan) -> Plan:
        skip = self.skip_next
        if not skip or plan.loaded is not None:
            return plan
        samples = skip * (batch_unit(self.loader) or 1)
        return dataclasses.replace(plan, skip=skip, before=skip, samples_before=samples)

    def moved_on(self, progress: Progress) -> int | None:
        """At the first ``next()`` of an iteration a loaded state began: the epoch the training loop went on
        to since (None: it goes on with the loaded one). Lightning restores a checkpoint taken at the last
        batch of an epoch it cut short (``limit_train_batches``) by loading the state, calling ``iter()``, then
        setting the sampler's epoch to the next one; a loop of one's own calls ``set_epoch``."""
        if progress is not self.current or progress.batches or progress.plan.loaded is None:
            return None
        epoch = progress.plan.epoch
        external = sampler_epoch(self.loader)
        if external is not None and external != self.sampler_epoch_at_iter and external != epoch:
            return external
        return self.epoch if self.epoch != epoch else None

    def end_loaded(self, progress: Progress, epoch: int) -> None:
        """The training loop ended the loaded iteration where the state was taken and is in ``epoch`` now:
        the next ``iter()`` starts it as an uninterrupted run would have after that point (the next epoch's
        seeds follow from the loaded one's draws). The iteration's producer has stopped."""
        loader = self.loader
        if not progress.drawn and progress.indexing.indexer is None and not progress.indexing.iterable:
            # The epoch's order was not drawn yet (the producer had not asked for indices): draw it as the
            # interrupted run did (torch's RandomSampler's seed or permutation), so the next epoch's follows.
            next(progress.batches_of(index_sampler(loader)), None)
        progress.done = True
        self.epoch, self.epoch_set = epoch, True

    def reuses_workers(self, plan: Plan) -> bool:
        """Whether the iteration runs on the persistent workers already running (they keep their state)."""
        loader = self.loader
        running = loader.persistent_workers and loader.num_workers > 0 and persistent_iterator(loader) is not None
        return running and plan.loaded is None

    def begin(self, plan: Plan, fresh: bool) -> Progress:
        """Before torch's iterator exists: put back (or record) what decides the order, fix the seeds."""
        generator = ordering_generator(self.loader)
        aside = False
        if plan.rng is not None and generator is not None:
            generator.set_state(plan.rng)
            # The state is at the sampler's draw: on a new iterator torch's base seed is drawn elsewhere.
            aside = fresh and plan.rng_at_sampler and generator is self.loader.generator
        rng = self._at_sampler(generator, fresh and not aside)
        if plan.next_rng is None:  # the epoch's draws are still to come: say what they will be
            plan = self._with_draws(plan, fresh)
        elif plan.loaded is not None:
            self.seed_stream = torch.Generator()  # the uninterrupted run's draws go on from the loaded epoch's
            self.seed_stream.set_state(plan.next_rng)
        sampler = order_sampler(self.loader)
        if isinstance(sampler, TorchRandomSampler) and sampler.generator is None and plan.seed is not None:
            sampler.pin_next_seed(plan.seed)
        library = library_resume(self.loader.dataset)
        if library is not None:  # before torch's iterator copies the dataset into its workers
            loaded = plan.loaded.get("dataset") if plan.loaded is not None else None
            library.start_epoch(plan.epoch, loaded, self.loader.batch_size or 1, int(self.loader.num_workers))
        progress = Progress(plan, rng, plan.seed, Indexing.of(self.loader))
        progress.base_draw_aside = aside
        seed = self.loader.seed
        if seed is not None and not progress.indexing.iterable:  # a map-style sample's draws: (seed, epoch, index)
            progress.sample_seeds = (seed, plan.epoch)
        self.pending, self.current = None, progress
        self.sampler_epoch_at_iter = sampler_epoch(self.loader)
        return progress

    def started_workers(self, progress: Progress, base_seed: int, fresh: bool) -> None:
        """torch's iterator exists: the seed its workers got (a pinned one, or the one torch drew)."""
        if fresh:
            self.workers_base_seed = progress.base_seed if progress.base_seed is not None else base_seed
        progress.base_seed = self.workers_base_seed

    def _with_draws(self, plan: Plan, fresh: bool) -> Plan:
        """``plan`` with the seeds its iteration draws from torch's global RNG (the workers' base seed when
        torch makes a new iterator, then TorchRandomSampler's seed when it has no generator) and the RNG's
        state after them. Without a seed stream nothing is drawn here: torch's own draws, made later from
        the same state, give these very numbers. With one (after a resume) they are drawn from it, pinned."""
        loader = self.loader
        own = loader.generator
        sampler = order_sampler(loader)
        needs_seed = isinstance(sampler, TorchRandomSampler) and sampler.generator is None
        if not needs_seed and (own is not None or loader.num_workers == 0):
            return plan  # no seed that matters comes from the global RNG: a seeded order, or no workers
        stream = self.seed_stream
        source = torch.Generator()
        source.set_state(stream.get_state() if stream is not None else torch.get_rng_state())
        base: int | None = None
        if fresh and own is not None:  # torch draws the base seed from the loader's generator: peek at it
            peek = torch.Generator()
            peek.set_state(own.get_state())
            base = _draw(peek)
        elif fresh:
            base = _draw(source)
        seed = _draw(source) if needs_seed else None
        if stream is not None:
            stream.set_state(source.get_state())
        elif own is None:
            base = plan.base_seed  # torch draws it itself, from the same state
        return dataclasses.replace(
            plan,
            seed=plan.seed if plan.seed is not None else seed,
            base_seed=plan.base_seed if plan.base_seed is not None else base,
            next_rng=source.get_state(),
        )

    # --- state_dict / load_state_dict ---------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The state after what the training loop received (see the module docstring); never raises."""
        pending = self.pending
        if pending is not None:
            if pending.loaded is not None:
                return copy.deepcopy(pending.loaded)
            return self._encode_plan(self._skipping(pending))
        current = self.current
        if current is None or current.plan.epoch != self.epoch:
            plan = Plan(self.epoch)
        elif current.done:
            plan = self._after(current)
        else:
            return self._encode_progress(current)
        self.pending = self._pinned(plan)  # the next iteration keeps the seeds this state names
        return self._encode_plan(self._skipping(self.pending))

    def load(self, state: Mapping[str, Any]) -> None:
        """Resume from a state (applies to the next ``iter()``); ValueError for a foreign or impossible one."""
        if isinstance(state, Mapping) and len(state) == 0:
            return  # torchdata's convention: an empty state changes nothing
        values = check_state(state)
        plan = Plan(**place(self.loader, values))
        library = library_resume(self.loader.dataset) if _resumes_itself(self.loader, values) else None
        if library is not None:
            plan.workers = {}  # nothing fast-forwarded: the dataset starts where its own state says
            if library.first_worker_anew:
                plan.next_worker = 0
        plan.next_rng = values["next_rng"]
        plan.loaded = copy.deepcopy(dict(state))
        self.pending = plan
        self.epoch, self.epoch_set = plan.epoch, True

    def _after(self, progress: Progress) -> Plan:
        """The next epoch's start: the workers' state goes on only where their processes would have."""
        loader = self.loader
        keeps = loader.num_workers == 0 or loader.persistent_workers
        # An IterableDataset's state at the end of its data says "ran out": the next epoch begins, as torch's
        # persistent worker begins it, with a new iter() of the dataset, never by loading that end (a worker
        # resumed there before its first batch of the epoch would deliver nothing). Its generators go on.
        ended = {"dataset": None} if isinstance(loader.dataset, IterableDataset) else {}
        workers = {}
        if keeps:
            workers = {
                key: {**state, "batches": 0, "iterator": None, **ended} for key, state in progress.workers.items()
            }
        return Plan(progress.plan.epoch + 1, workers=workers)

    def _at_sampler(self, generator: torch.Generator | None, base_first: bool) -> torch.Tensor | None:
        """The ordering generator's state when the sampler will draw: after torch's draw of the workers' base
        seed from it (``base_first``: a new iterator, the loader's generator ordering the epoch), else now."""
        if generator is None:
            return None
        if not (base_first and generator is self.loader.generator):
            return generator.get_state()
        after = torch.Generator()
        after.set_state(generator.get_state())
        _draw(after)
        return after.get_state()

    def _pinned(self, plan: Plan) -> Plan:
        generator = ordering_generator(self.loader)
        fresh = not self.reuses_workers(plan)
        pinned = self._with_draws(plan, fresh=fresh)
        return dataclasses.replace(
            pinned,
            rng=self._at_sampler(generator, fresh),
            base_seed=pinned.base_seed if pinned.base_seed is not None else self._next_base_seed(plan),
        )

    def _next_base_seed(self, plan: Plan) -> int | None:
        """The workers' base seed of the iteration ``plan`` starts: the one torch will draw for a new
        iterator, else that of the workers running now."""
        if self.reuses_workers(plan) or self.loader.generator is not None:
            return self.workers_base_seed
        peek = torch.Generator()
        peek.set_state(torch.get_rng_state())
        return _draw(peek)

    def _encode_plan(self, plan: Plan) -> dict[str, Any]:
        seeds = (plan.rng, plan.seed, plan.base_seed)
        # before: batches left out before the iteration begins (skip_first); 0 for any other plan not loaded
        encoded = self._encode(plan, *seeds, plan.before, plan.sampler, plan.workers, plan.next_worker)
        encoded["next_rng"] = encode_rng(plan.next_rng)
        return encoded

    def _encode_progress(self, progress: Progress) -> dict[str, Any]:
        loader = self.loader
        iterable = isinstance(loader.dataset, IterableDataset)
        next_worker = progress.plan.next_worker
        workers: Mapping[int, WorkerState] = progress.workers
        if loader.num_workers > 0:
            if loader.in_order and progress.last_worker is not None:
                next_worker = (progress.last_worker + 1) % int(loader.num_workers)
            elif not loader.in_order and not iterable:
                workers, next_worker = {}, 0  # batches went to whichever worker was free: no order to keep
        if not iterable:  # a map-style dataset's workers need their count for nothing
            workers = {key: state for key, state in workers.items() if _kept(state)}
        count = progress.plan.before + (progress.batches if iterable else progress.prefix)
        received = progress.batches * (loader.batch_size or 1) if iterable else progress.prefix_samples
        sampler_state = progress.sampler_after_prefix()
        after = sorted(ordinal - progress.prefix for ordinal in progress.received)
        seeds = (progress.rng, progress.seed, progress.base_seed)
        samples = progress.plan.samples_before + received
        library = library_resume(loader.dataset)
        dataset_state = None
        if library is not None:
            dataset_state = library.state(samples, received, loader.batch_size or 1, int(loader.num_workers))
        encoded = self._encode(progress.plan, *seeds, count, sampler_state, workers, next_worker, after, samples)
        encoded["dataset"] = copy.deepcopy(dataset_state)
        encoded["next_rng"] = encode_rng(progress.next_rng)
        return encoded

    def _encode(
        self,
        plan: Plan,
        rng: torch.Tensor | None,
        seed: int | None,
        base_seed: int | None,
        count: int,
        sampler_state: dict[str, Any] | None,
        workers: Mapping[int, WorkerState],
        next_worker: int,
        after: list[int] | None = None,
        samples: int | None = None,
    ) -> dict[str, Any]:
        loader = self.loader
        world, rank = loader_world(loader)
        layout = plan.layout or world
        batch = batch_unit(loader) or 1
        total = sampler_size(order_sampler(loader), layout)
        # The iteration's batches, all of `batch` samples but the epoch's last: the cut at `total` covers it.
        position = plan.start + count * batch * world
        if total is not None:
            position = min(position, total)
        encoded = encode_workers(int(loader.num_workers), next_worker, workers) if workers else None
        return {
            "version": VERSION,
            "epoch": plan.epoch,
            "samples_yielded": plan.samples_before if samples is None else samples,
            "batches_yielded": count,
            "batch_size": batch_unit(loader),
            "seed": seed_of(loader, seed),
            "world_size": world,
            "rank": rank,
            "start": position if count == 0 else plan.start,
            "layout": layout,
            "rng": encode_rng(rng),
            "base_seed": base_seed,
            "after": after or [],
            "sampler": copy.deepcopy(sampler_state),
            "workers": encoded,
            "dataset": None,
            "next_rng": "",
        }


def _draw(generator: torch.Generator) -> int:
    """One draw as torch's loader and RandomSampler make theirs (a 64-bit seed)."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def _resumes_itself(loader: DataLoaderX[Any], values: dict[str, Any]) -> bool:
    """Whether the loaded position is the dataset's own to restore (a library's resume protocol); ValueError
    where it cannot be restored at all: an IterableDataset mid-epoch whose ``state_dict`` no protocol fits."""
    dataset = loader.dataset
    library = library_resume(dataset)
    received = values["batches_yielded"] > 0 or bool(values["after"])
    if library is not None:
        if received and values["dataset"] is None:
            raise ValueError(
                f"the state was taken {values['batches_yielded']} batches into epoch {values['epoch']} without the"
                f" state of {type(dataset).__name__} ({library.library}'s resume protocol): it cannot resume there"
            )
        return True
    if values["dataset"] is not None:
        raise ValueError(
            f"the state holds the state of a dataset with its library's resume protocol (litdata's or MosaicML"
            f" streaming's StreamingDataset), and this loader's dataset is a {type(dataset).__name__}"
        )
    foreign = foreign_state(dataset)
    if foreign is not None and received and isinstance(dataset, IterableDataset):
        raise ValueError(
            f"{type(dataset).__name__} has {foreign}, which is not torchdata's state_dict() and not a resume"
            f" protocol DataLoaderX drives (torchdata's, litdata's, MosaicML streaming's): nothing says where it"
            f" stopped {values['batches_yielded']} batches into epoch {values['epoch']}; resume it with the loader"
            " its library provides, or at an epoch's start"
        )
    return False


def _kept(state: WorkerState) -> bool:
    return any(state.get(key) is not None for key in ("dataset", "iterator", "rng"))
