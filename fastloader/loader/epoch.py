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
    runtime.start_epoch(plan, workers=loader.num_workers > 0)
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
    )
    runtime.deliver(iterator)
    return iterator
