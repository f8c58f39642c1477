"""What a DataLoaderX does, decided once in its ``__init__``: a :class:`LoaderPlan`.

DataLoaderX keeps each argument under its own name, as torch's loader does (frameworks rebuild a loader
from them, ``type(loader)(**args)``); the plan is what the loader made of them, and each epoch is wired
from it (``fastloader.loader.epoch``). The arguments it is made of cannot be set after ``__init__``
(:data:`PLANNED`), as torch refuses it for ``batch_size`` or ``sampler``: build another loader.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastloader.loader.normalize import NormalizeSpec
from fastloader.loader.workers.ray_options import RayWorkers

# DataLoaderX's extras and local_rank: the plan (or the sampler chosen in __init__) is made of them
PLANNED = frozenset(
    {
        "local_rank",
        "device",
        "max_prefetch",
        "non_blocking",
        "normalize",
        "normalize_dtype",
        "channels_last",
        "random_flip",
        "decode_on",
        "distributed",
        "seed",
        "report_every",
        "stall_warning",
        "snapshot_every_n_steps",
        "ledger",
        "worker_method",
    }
)


@dataclass(frozen=True)
class LoaderPlan:
    """What one DataLoaderX does with each batch and around each epoch."""

    device: torch.device  # where batches go: CUDA (copied on the side stream) or the CPU (only prefetched)
    max_prefetch: int  # batches ready ahead of the training loop (the producer thread's bounded queue)
    non_blocking: bool  # the copy to CUDA is asynchronous
    normalize: NormalizeSpec | None  # uint8 image batches to normalized floats; None: batches as collated
    gpu_decode: bool  # JPEGs decoded with nvJPEG in this process, on the side stream (decode_on="cuda")
    stall_warning: float | None  # the watchdog: seconds without a batch before it reports; None: off
    report_every: int | None  # log the verdict every N batches; None: never
    autotune: bool  # num_workers / prefetch_factor were "auto": measured at the first iter()
    user_batch_sampler: bool  # the user gave the batch sampler (its own state is resumed, not torch's)
    ledger: str | None = None  # where each rank's training loop's deliveries are recorded (ledger_writer.py)
    stage_clock: bool = True  # time each stage of each batch (off only to measure the clock's cost)
    batch_ring: bool = True  # reuse batch buffers (fastloader.image.batch_ring; off only to measure the ring)
    worker_method: str = "process"  # where: "process", "thread", "subprocess" or "ray" (fastloader.loader.workers)

    @property
    def threads(self) -> bool:
        return self.worker_method == "thread"

    ray: RayWorkers | None = None  # worker_method="ray": batches made by Ray actors (fastloader.loader.workers)

    @property
    def to_cuda(self) -> bool:
        return self.device.type == "cuda"
