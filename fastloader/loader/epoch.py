"""Each epoch of a DataLoaderX, wired from its plan: what ``iter(loader)`` builds.

In order: the resume cursor says how the epoch starts (``fastloader.loader.resume``); persistent workers that
hold another run's state are stopped; torch's iterator is made (from a view of the loader,
``fastloader.loader.torch_iter``) with the loader's device current, so that torch's pin-memory thread pins
for it; the side stream's copier (made once per loader) and the epoch's flip seed; then the producer
thread and the training loop's side (``fastloader.loader.prefetch_iterator``), with the watchdog and the
``report_every`` verdicts if the plan has them.

Nothing here writes into the loader: what lasts across epochs lives in the loader's runtime
(``fastloader.loader.runtime``) and its cursor; torch's own ``DataLoader.__iter__`` keeps its persistent
iterator on the loader, as it does for torch's loader.
"""

from __future__ import annotations

import functools
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from fastloader.loader.device import on_device
from fastloader.loader.epoch_progress import Progress
from fastloader.loader.normalize import flip_seed, reseed_flips
from fastloader.loader.prefetch_iterator import PrefetchIterator
from fastloader.loader.report import log_verdict
from fastloader.torch_internals import base_seed, drop_persistent_iterator, persistent_iterator

if TYPE_CHECKING:
    from fastloader.loader.dataloader import DataLoaderX


def open_epoch(loader: DataLoaderX[Any]) -> PrefetchIterator:
    """The next epoch of ``loader``, its producer thread started."""
    plan, runtime, cursor = loader._plan, loader._runtime, loader._cursor
    start = cursor.next_plan()
    persistent = loader.persistent_workers and loader.num_workers > 0
    if persistent:
        # Torch hands out one shared iterator and resets it here: the previous epoch's producer
        # thread must stop pulling from it first.
        runtime.close_live()
        if persistent_iterator(loader) is not None and not cursor.reuses_workers(start):
            drop_persistent_iterator(loader)  # their processes hold another run's state: start them anew
    fresh = not cursor.reuses_workers(start)
    progress = cursor.begin(start, fresh)
    if plan.ledger is not None:
        progress.ledger = runtime.ledger_epoch(plan.ledger, loader.dataset, progress)
    runtime.start_epoch(plan, workers=loader.num_workers > 0 and not plan.threads and plan.ray is None)
    source: Any
    if plan.ray is not None:  # Ray actors in place of torch's iterator and its workers (they stay for the next epoch)
        from fastloader.loader.workers.ray_workers import open_ray_epoch

        source = open_ray_epoch(loader, progress, plan.ray, fresh)
    else:
        with on_device(plan.device):  # torch's pin-memory thread pins for the current device
            source = DataLoader.__iter__(loader)
        cursor.started_workers(progress, base_seed(source), fresh)
    copier = runtime.copier_for(plan, loader.dataset, loader.collate_fn)
    reseed_flips(copier.finish if copier is not None else None, loader.collate_fn, flip_seed(progress.base_seed or 0))
    if runtime.decoder is not None and plan.to_cuda:
        runtime.decoder.avoid(torch.cuda.current_stream(plan.device))  # the training loop's stream
    iterator = PrefetchIterator(
        source,
        copier,
        plan.max_prefetch,
        owns_workers=not persistent,
        progress=progress,
        stats=runtime.stats,
        report=functools.partial(log_verdict, weakref.ref(loader)) if plan.report_every else None,
        report_every=plan.report_every,
        stall_warning=plan.stall_warning,
        stack_dir=runtime.stack_dir,
        context=functools.partial(on_device, plan.device),
        moved_on=functools.partial(_next_epoch_instead, weakref.ref(loader), progress) if start.loaded else None,
    )
    runtime.deliver(iterator)
    return iterator


def _next_epoch_instead(
    loader_ref: weakref.ref[DataLoaderX[Any]], progress: Progress, iterator: PrefetchIterator
) -> PrefetchIterator | None:
    """At the first ``next()`` of an iteration a loaded state began: if the training loop went on to
    another epoch since ``iter()`` (``ResumeCursor.moved_on``), that epoch, opened in its place. A checkpoint
    taken at the last batch of an epoch the loop cut short (Lightning's ``limit_train_batches``) resumes
    into the next epoch, as the uninterrupted run went on, not into the rest of the cut one."""
    loader = loader_ref()
    if loader is None:
        return None
    cursor = loader._cursor
    epoch = cursor.moved_on(progress)
    if epoch is None:
        return None
    iterator.close()  # the producer stops (and the workers, unless persistent) before the cursor moves on
    cursor.end_loaded(progress, epoch)
    replacement = open_epoch(loader)
    loader._runtime.deliver(iterator)  # the iterator the loop holds delivers the new epoch
    return replacement
