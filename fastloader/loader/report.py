"""What a DataLoaderX says about itself: ``stats()``, and the verdict ``report_every`` logs.

The figures come from the stage clock's totals (``fastloader.loader.stage_stats``) and the dataset's error
policy; the verdict from ``fastloader.loader.verdict``, given the loader's setting (its workers, the cores, the
CPU use, where batches go).
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any

from fastloader.loader.verdict import Setting, judge

if TYPE_CHECKING:
    from fastloader.loader.dataloader import DataLoaderX

log = logging.getLogger("fastloader")


def loader_stats(loader: DataLoaderX[Any]) -> dict[str, Any]:
    """``DataLoaderX.stats()`` (see there)."""
    runtime = loader._runtime
    error_stats = getattr(loader.dataset, "error_stats", None)
    stats: dict[str, Any] = dict(error_stats()) if callable(error_stats) else {}
    progress = loader._cursor.current
    stats["epoch"] = loader._cursor.epoch
    stats["batches_yielded"] = progress.batches if progress is not None else 0
    stats["num_workers"] = int(loader.num_workers)
    stats["autotune"] = runtime.autotune.to_dict() if runtime.autotune is not None else None
    stats["gpu_decode"] = runtime.decoder.counts.to_dict() if runtime.decoder is not None else None
    stats["gpu_decoder"] = str(runtime.decoder.jpeg) if runtime.decoder is not None else None
    stats["batch_ring"] = runtime.ring.stats() if runtime.ring is not None else None
    stats.update(runtime.stats.summary())
    stats["verdict"] = judge(stats, setting_of(loader)).to_dict()
    return stats


def setting_of(loader: DataLoaderX[Any]) -> Setting:
    """What the verdict needs to know of the loader and the machine."""
    from fastloader import world
    from fastloader.loader.cpu_use import mean

    runtime = loader._runtime
    busy = mean(runtime.cpu_meter.read()) if runtime.cpu_meter is not None else None
    source = type(getattr(loader.dataset, "source", None)).__name__
    return Setting(
        num_workers=loader.num_workers,
        usable_cores=world.cores_per_rank(),
        pin_memory=loader.pin_memory,
        to_gpu=loader._plan.to_cuda,
        cores_busy=busy,
        small_files=source in ("FolderSource", "FileListSource"),
        gpu_decode=runtime.decoder.counts.to_dict() if runtime.decoder is not None else None,
        measured_workers=runtime.autotune is not None and runtime.autotune.reason.startswith("measured"),
    )


def log_verdict(loader: weakref.ref[DataLoaderX[Any]]) -> None:
    """Log the verdict of the loader's batches since the last one (``report_every``)."""
    owner = loader()
    if owner is None:
        return
    runtime = owner._runtime
    window = runtime.stats.summary(since=runtime.report_mark)
    runtime.report_mark = runtime.stats.mark()
    verdict = judge(window, setting_of(owner))
    advice = "; ".join(verdict.advice)
    rate = window["images_per_s"]
    log.info(
        "%s (%s images/s over the last %d batches)%s",
        verdict.summary,
        f"{rate:.0f}" if rate else "?",
        window["batches"],
        f" -> {advice}" if advice else "",
    )
