"""What a DataLoaderX makes as it runs: its :class:`LoaderRuntime`, the one mutable part of the loader
besides its resume cursor (``fastloader.loader.resume``).

The plan (``fastloader.loader.plan``) says what the loader does; the runtime holds what doing it needs across
epochs: the stage clock's totals, the autotune's choice, the side stream's copier and the GPU decoder (made
at the first ``iter()``, one per loader, never per epoch), the watchdog's stack directory, the CPU meter,
the epoch being delivered, the delivery ledger's file, the Ray actors (``worker_method="ray"``), and the batch
ring (``fastloader.loader.batch_slots``: made before the first workers start, kept while the batch shape fits).
A copy of the loader (pickle, ``copy.deepcopy``) keeps the totals and the choice and makes its own stream,
decoder, directory, meter, ring, ledger file and actors.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from fastloader.image.gpu_decode import GpuDecoder
from fastloader.loader.autotune import Choice
from fastloader.loader.device import CudaCopier
from fastloader.loader.normalize import Normalizer
from fastloader.loader.plan import LoaderPlan
from fastloader.loader.stage_stats import Mark, StageStats
from fastloader.loader.watchdog import StackDir

if TYPE_CHECKING:
    from fastloader.loader.batch_slots import LoaderRing
    from fastloader.loader.cpu_use import CpuMeter
    from fastloader.loader.epoch_progress import Progress
    from fastloader.loader.ledger_writer import EpochLedger, LedgerWriter
    from fastloader.loader.prefetch_iterator import PrefetchIterator
    from fastloader.loader.workers.ray_workers import RayPool


class LoaderRuntime:
    """A DataLoaderX's state across epochs (see the module docstring)."""

    def __init__(self) -> None:
        self.stats = StageStats()
        self.autotune: Choice | None = None  # what "auto" measured at the first iter()
        self.report_mark: Mark | None = None  # where the last report_every verdict ended
        self.cpu_meter: CpuMeter | None = None  # how busy the cores were, from the first iter()
        self.stack_dir: StackDir | None = None  # where workers dump their stacks (watchdog), made on demand
        self.copier: CudaCopier | None = None  # one side stream per loader, made on the first iter()
        self.decoder: GpuDecoder | None = None  # decode_on="cuda": made with the copier
        self.ring: LoaderRing | None = None  # the batch ring, made by the first iterator that can use one
        self.ledger: LedgerWriter | None = None  # ledger=: this rank's file, opened at the first iter()
        self._live: weakref.ref[PrefetchIterator] | None = None  # the epoch being delivered
        self.ray_pool: RayPool | None = None  # worker_method="ray": the actors, started at the first iter()

    def start_epoch(self, plan: LoaderPlan, workers: bool) -> None:
        """Before an epoch's torch iterator exists: the CPU meter, and the stack directory its workers need."""
        if self.cpu_meter is None:
            from fastloader.loader.cpu_use import CpuMeter

            self.cpu_meter = CpuMeter()
        if plan.stall_warning is not None and workers and self.stack_dir is None:
            self.stack_dir = StackDir()

    def copier_for(self, plan: LoaderPlan, dataset: Any, collate_fn: Any) -> CudaCopier | None:
        """The loader's copier to CUDA (None: batches stay on the CPU), made the first time."""
        if not plan.to_cuda:
            return None
        if self.copier is None:
            finish = Normalizer(plan.normalize, plan.device) if plan.normalize is not None else None
            if plan.gpu_decode:
                self.decoder = GpuDecoder(plan.device, dataset, collate_fn)
            self.copier = CudaCopier(plan.device, plan.non_blocking, self.decoder, finish)
        return self.copier

    def ledger_epoch(self, path: str, dataset: Any, progress: Progress) -> EpochLedger:
        """An iteration's side of the ledger (``fastloader.loader.ledger_writer``), its beginning written: the
        epoch, and where a loaded state resumes it (samples; batches for an IterableDataset)."""
        from fastloader.loader.ledger_writer import EpochLedger, LedgerWriter

        if self.ledger is None:
            self.ledger = LedgerWriter(path, dataset)
        plan = progress.plan
        return EpochLedger(self.ledger, plan.epoch, plan.before if self.ledger.iterable else plan.samples_before)

    def deliver(self, iterator: PrefetchIterator) -> None:
        self._live = weakref.ref(iterator)

    def close_live(self) -> None:
        """Stop the epoch being delivered, if any (its producer thread must not go on pulling batches)."""
        live = self._live() if self._live is not None else None
        if live is not None:
            live.close()

    def __getstate__(self) -> dict[str, Any]:
        # Streams and weak references cannot be pickled or deep-copied; a copy makes its own.
        state = self.__dict__.copy()
        state.update(copier=None, decoder=None, _live=None, cpu_meter=None, stack_dir=None, report_mark=None, ring=None)
        state.update(ledger=None, ray_pool=None)
        return state
