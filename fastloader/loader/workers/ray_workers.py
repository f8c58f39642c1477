"""``worker_method="ray"``: a DataLoaderX's batches made by Ray actors, on whichever nodes of the cluster Ray places
them, every sample exactly once, in order::

    training process (this module)                         Ray actors (ray_actor.py), num_workers of them
    resume cursor's index stream ─► LeaseBook (lease_book.py)
      hand out leases (bounded in flight) ──────────────►  dataset[i] ... ─► collate (uint8) ─► object store
      ray.wait on the leases out; ray.get each result once ◄──────────────────────────────────┘
      a dead actor's leases go out again, its late results are dropped; deliver in order
        └─► DataLoaderX's producer thread, side-stream copy, normalize (as with worker processes)

:class:`RayPool` holds the actors of one loader across its epochs (Ray stops them when the loader goes): it
starts them, knows which answered (placed, dataset unpickled), replaces a dead one (``max_replacements`` over
the loader's life) and raises :class:`~fastloader.errors.WorkersLost` when no actor is left or none could be
placed within ``placement_timeout``. :class:`RayEpoch` is one epoch, the iterator DataLoaderX's producer thread
drains in place of torch's: it draws the workers' base seed as torch's iterator does (the sampler's order and
the state are those of ``worker_method="process"``), and a batch counts as consumed only when the training loop
receives it (``Progress.record``, as ever), so ``state_dict()`` is the same small state as with worker processes.

Only the actor's death re-issues a lease (``RayActorError``, or its result lost with its node): an error the
dataset raises is the training loop's at that batch, as in torch. Ray is imported only here.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any

import torch

from fastloader.errors import BatchKillsWorkers, WorkersLost
from fastloader.loader.nested import map_tensors
from fastloader.loader.stage_clock import TimedBatch
from fastloader.loader.workers.lease_book import LeaseBook
from fastloader.loader.workers.ray_actor import BatchMaker, RemoteBatch
from fastloader.loader.workers.ray_options import RayWorkers
from fastloader.torch_internals import index_sampler, keep_persistent_iterator

if TYPE_CHECKING:
    from fastloader.loader.dataloader import DataLoaderX
    from fastloader.loader.epoch_progress import Progress

log = logging.getLogger("fastloader")

_POLL_S = 0.5  # how long one ray.wait blocks before the deadlines are looked at again


def import_ray() -> Any:
    try:
        import ray
    except ImportError as error:
        raise RuntimeError(f"worker_method='ray' needs Ray ({error}): pip install fastloader[ray]") from error
    return ray


@dataclass
class _Actor:
    handle: Any
    ready_ref: Any  # the answer of its ready() call, until it came
    started: float
    pid: int | None = None

    @property
    def ready(self) -> bool:
        return self.ready_ref is None


class RayPool:
    """The actors of one DataLoaderX (see the module docstring)."""

    def __init__(self, options: RayWorkers, dataset: Any, collate_fn: Any, size: int, per_actor: int) -> None:
        ray = import_ray()
        if not ray.is_initialized():
            ray.init(address=options.address, logging_level=logging.WARNING, log_to_driver=False)
        self.ray = ray
        self.options = options
        self.per_actor = per_actor
        self.replacements_left = options.max_replacements if options.max_replacements is not None else 2 * size
        self.deaths = 0
        self.last_death: str | None = None
        self._class = ray.remote(BatchMaker)
        self._payload = ray.put((dataset, collate_fn))  # shipped once, shared by every actor of this node
        self.actors: list[_Actor | None] = [self._start(slot) for slot in range(size)]

    def _start(self, slot: int) -> _Actor:
        # max_restarts=0: a dead actor is replaced by the pool (its leases re-issued under the driver's eyes).
        handle = self._class.options(num_cpus=self.options.num_cpus, max_restarts=0, max_task_retries=0).remote(
            self._payload, slot
        )
        return _Actor(handle, handle.ready.remote(), time.monotonic())

    def live(self) -> list[tuple[int, _Actor]]:
        return [(slot, actor) for slot, actor in enumerate(self.actors) if actor is not None]

    def died(self, slot: int, actor: _Actor, error: BaseException) -> None:
        """``actor``, in ``slot``, is dead: a new actor takes its place while replacements last (nothing when
        another epoch found it dead first: the slot holds its replacement)."""
        if self.actors[slot] is not actor:
            return
        self.deaths += 1
        self.last_death = f"actor {slot} (pid {actor.pid}): {type(error).__name__}: {_first_line(error)}"
        log.warning("worker_method='ray': %s; its leases go to other actors", self.last_death)
        self.ray.kill(actor.handle, no_restart=True)
        if self.replacements_left > 0:
            self.replacements_left -= 1
            self.actors[slot] = self._start(slot)
        else:
            self.actors[slot] = None

    def check_progress(self, waiting_since: float) -> None:
        """WorkersLost when no actor is left, or none is ready and the oldest has waited past the deadline."""
        live = self.live()
        if not live:
            raise WorkersLost(
                f"worker_method='ray': all {len(self.actors)} actors died and the {self.deaths - len(self.actors)}"
                f" replacements allowed are spent (RayWorkers.max_replacements); the last: {self.last_death}"
            )
        if any(actor.ready for _, actor in live):
            return
        waited = time.monotonic() - max(waiting_since, min(actor.started for _, actor in live))
        if waited > self.options.placement_timeout:
            raise WorkersLost(
                f"worker_method='ray': no actor of {len(live)} could be placed and started within"
                f" {self.options.placement_timeout:g} s (each asks for {self.options.num_cpus:g} CPUs;"
                f" the cluster has {self.ray.available_resources().get('CPU', 0):g} free)"
                + (f"; the last actor lost: {self.last_death}" if self.last_death else "")
            )

    def stop(self) -> None:
        for _, actor in self.live():
            self.ray.kill(actor.handle, no_restart=True)
        self.actors = []


class RayEpoch(Iterator[TimedBatch]):
    """One epoch made by a :class:`RayPool`: the iterator the producer thread drains (see the module docstring)."""

    def __init__(self, pool: RayPool, progress: Progress, batches: Iterator[tuple[int | None, Any]], length: int,
                 in_flight: int, writable: bool, pin: bool) -> None:  # fmt: skip
        self.pool = pool
        self.book = LeaseBook(progress.plan.epoch, batches, in_flight)
        self.base_seed = progress.base_seed or 0
        self.seeds = progress.sample_seeds  # seed=: each sample's draws from (seed, epoch, index)
        self.writable = writable  # batches stay on the CPU: copied out of the read-only object store
        self.pin = pin  # pin_memory=True on CUDA: pinned here, as torch's pin-memory thread would
        self._length = length
        self._refs: dict[Any, tuple[int, int, _Actor]] = {}  # result ref -> (ticket, actor slot, actor)
        # This epoch's leases out on each actor (an epoch another iter() left behind has its own)
        self._held: dict[int, int] = collections.Counter()
        self._fatal: BaseException | None = None
        self._waiting_since = time.monotonic()

    def __iter__(self) -> RayEpoch:
        return self

    def __len__(self) -> int:
        return self._length

    def __next__(self) -> TimedBatch:
        if self._fatal is not None:
            raise self._fatal  # the cluster cannot go on: every next() says so, none ends the epoch short
        try:
            while True:
                delivered = self.book.deliver()
                if delivered is not None:
                    self._waiting_since = time.monotonic()
                    result = delivered[1]
                    if isinstance(result, _Raise):
                        raise result.error
                    return result
                if self.book.finished:
                    raise StopIteration
                self._hand_out()
                self._wait()
        except (WorkersLost, BatchKillsWorkers) as error:
            self._fatal = error
            self._shutdown_workers()
            raise
        except StopIteration:
            self._shutdown_workers()
            raise

    def _hand_out(self) -> None:
        book = self.book
        while (free := self._free()) is not None:
            taken = book.take()
            if taken is None:
                return
            ticket, lease = taken
            slot, actor = free
            self._held[slot] += 1
            self._refs[actor.handle.make.remote(lease, self.base_seed, self.seeds)] = (ticket, slot, actor)

    def _free(self) -> tuple[int, _Actor] | None:
        """The ready actor holding the fewest of this epoch's leases, if it has room for another."""
        ready = [(self._held[slot], slot, actor) for slot, actor in self.pool.live() if actor.ready]
        if not ready:
            return None
        held, slot, actor = min(ready, key=lambda item: item[:2])
        return (slot, actor) if held < self.pool.per_actor else None

    def _wait(self) -> None:
        ray, pool = self.pool.ray, self.pool
        starting = {actor.ready_ref: slot for slot, actor in pool.live() if not actor.ready}
        waiting = [*self._refs, *starting]
        if not waiting:
            pool.check_progress(self._waiting_since)
            time.sleep(_POLL_S)
            return
        done, _ = ray.wait(waiting, num_returns=1, timeout=_POLL_S)
        for ref in done:
            if ref in starting:
                self._started(starting[ref], ref)
            else:
                self._arrived(ref)
        pool.check_progress(self._waiting_since)

    def _started(self, slot: int, ref: Any) -> None:
        actor = self.pool.actors[slot]
        if actor is None or actor.ready_ref is not ref:
            return
        try:
            actor.pid = self.pool.ray.get(ref)
        except self.pool.ray.exceptions.RayError as error:  # it died starting (its dataset did not unpickle...)
            self._lost(slot, actor, error)
            return
        actor.ready_ref = None
        self._waiting_since = time.monotonic()

    def _arrived(self, ref: Any) -> None:
        ticket, slot, actor = self._refs.pop(ref)
        self._held[slot] -= 1
        exceptions = self.pool.ray.exceptions
        start = perf_counter()
        try:
            remote: RemoteBatch = self.pool.ray.get(ref)
        except (exceptions.RayActorError, exceptions.ObjectLostError) as error:
            self._lost(slot, actor, error, ticket)
            return
        except exceptions.RayTaskError as error:
            # The dataset or collate function raised: the training loop's error at this batch (as in torch).
            self.book.done(ticket, _Raise(error.as_instanceof_cause()))
            return
        batch = remote.batch
        if self.writable:
            batch = map_tensors(batch, torch.Tensor.clone)
        timing = remote.timing
        if timing is not None:
            timing.handoff = perf_counter() - start
        timed = TimedBatch(batch, timing)
        self.book.done(ticket, timed.pin_memory() if self.pin else timed)

    def _lost(self, slot: int, actor: _Actor, error: BaseException, ticket: int | None = None) -> None:
        """``actor`` (in ``slot``) died (``ticket``: the lease whose answer said so): its leases go out again."""
        self.pool.died(slot, actor, error)
        tickets = {ticket} if ticket is not None else set()
        for ref, (other, held_by, holder) in list(self._refs.items()):
            if holder is actor:
                del self._refs[ref]  # a dead actor's answer never comes: do not wait for it
                tickets.add(other)
                self._held[held_by] -= 1
        for lost in sorted(tickets):
            self.book.lost(lost)

    def _shutdown_workers(self) -> None:
        """The epoch is over (or abandoned): forget its leases; the actors stay for the next epoch."""
        self._refs.clear()
        self._held.clear()


class _Raise:
    """A batch whose making raised: raised again where the training loop would have received the batch."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def open_ray_epoch(loader: DataLoaderX[Any], progress: Progress, options: RayWorkers, fresh: bool) -> RayEpoch:
    """The epoch ``progress`` of ``loader`` on its actors (started at its first epoch, kept in its runtime).
    ``fresh``: torch would make a new iterator here (else, with ``persistent_workers``, it would reuse its
    workers, their base seed unchanged: the sampler's draws then follow as torch's do)."""
    runtime = loader._runtime
    workers = int(loader.num_workers)
    per_actor = loader.prefetch_factor or 2
    if runtime.ray_pool is None:
        runtime.ray_pool = RayPool(options, loader.dataset, loader.collate_fn, workers, per_actor)
    # As torch's iterator: the index stream first (nothing is drawn until it is iterated), then the workers' base
    # seed from the loader's generator (or, on a resumed state's new iterator, a generator of its own).
    batches = progress.batches_of(index_sampler(loader))
    drawn = 0
    if fresh:
        generator = torch.Generator() if progress.base_draw_aside else loader.generator
        drawn = int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
        if loader.persistent_workers:
            keep_persistent_iterator(loader, _Persistent())  # the resume cursor asks for torch's persistent iterator
    loader._cursor.started_workers(progress, drawn, fresh)
    to_cuda = loader._plan.to_cuda
    in_flight = workers * per_actor
    return RayEpoch(
        runtime.ray_pool, progress, batches, len(loader), in_flight, not to_cuda, loader.pin_memory and to_cuda
    )


class _Persistent:
    """Stands for torch's persistent iterator (``loader._iterator``) with ``persistent_workers=True``: the actors
    of the next epoch go on with this base seed, as torch's workers would; ``load_state_dict`` drops it."""


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""
