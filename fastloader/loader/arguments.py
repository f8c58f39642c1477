"""DataLoaderX's arguments, checked, and what torch's ``DataLoader.__init__`` gets in place of the user's.

DataLoaderX hands torch its own sampler when the user gave none (``fastloader.loader.default_sampler``),
``"auto"`` placeholders for ``num_workers`` / ``prefetch_factor`` (``fastloader.loader.autotune``), and
here: a collate function that takes fastloader's pre-assembled batches (normalizing in the workers when
there is no GPU), and, for ``decode_on="cuda"``, a copy of the dataset that sends encoded images.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import IterableDataset, default_convert

from fastloader.loader.normalize import NormalizeSpec, NormalizingCollate
from fastloader.samplers._epoch import check_nonnegative_int


def check_extras(
    max_prefetch: int,
    decode_on: str,
    distributed: bool | None,
    seed: int | None,
    report_every: int | None,
    stall_warning: float | None,
    snapshot_every_n_steps: int | None,
) -> None:
    """ValueError naming the argument for a keyword-only extra of DataLoaderX that is out of its range."""
    if isinstance(max_prefetch, bool) or not isinstance(max_prefetch, int) or max_prefetch < 1:
        raise ValueError(f"max_prefetch must be an int >= 1, got {max_prefetch!r}")
    if decode_on not in ("cpu", "cuda"):
        raise ValueError(f"decode_on must be 'cpu' or 'cuda', got {decode_on!r}")
    if distributed is not None and not isinstance(distributed, bool):
        raise ValueError(f"distributed must be True, False or None, got {distributed!r}")
    if seed is not None:
        check_nonnegative_int(seed, "seed")
    if report_every is not None and (
        isinstance(report_every, bool) or not isinstance(report_every, int) or report_every < 1
    ):
        raise ValueError(f"report_every must be None or an int >= 1, got {report_every!r}")
    if stall_warning is not None and (isinstance(stall_warning, bool) or not stall_warning > 0):
        raise ValueError(f"stall_warning must be None or > 0 seconds, got {stall_warning!r}")
    if snapshot_every_n_steps is not None:
        check_nonnegative_int(snapshot_every_n_steps, "snapshot_every_n_steps")


def check_ledger(ledger: Any) -> None:
    """ValueError naming ``ledger`` unless it is None or a path."""
    if ledger is not None and not isinstance(ledger, (str, os.PathLike)):
        raise ValueError(f"ledger must be None or a path, got {ledger!r}")
    if ledger is not None and not os.fspath(ledger):
        raise ValueError("ledger must be None or a path, got an empty one")


def check_ray(
    dataset: Any,
    num_workers: Any,
    batch_size: int | None,
    batch_sampler: Any,
    worker_init_fn: Any,
    decode_on: str,
    ledger: Any,
) -> None:
    """ValueError naming the argument that ``worker_method="ray"`` cannot take (yet)."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"worker_method='ray' needs num_workers >= 1 (the number of Ray actors), got {num_workers!r}")
    if isinstance(dataset, IterableDataset):
        raise ValueError(
            "worker_method='ray' takes a map-style dataset (indices leased to actors), not an IterableDataset"
        )
    if batch_size is None and batch_sampler is None:
        raise ValueError(
            "worker_method='ray' makes whole batches: batch_size=None (one sample at a time) is not supported"
        )
    if worker_init_fn is not None:
        raise ValueError("worker_init_fn runs in torch's worker processes: worker_method='ray' has none to run it in")
    if decode_on != "cpu":
        raise ValueError("decode_on='cuda' with worker_method='ray' is not supported: the actors decode on their CPUs")
    if ledger is not None:
        raise ValueError("ledger= is not supported with worker_method='ray' yet")


def collate_for(
    collate_fn: Callable[[list[Any]], Any] | None,
    batch_size: int | None,
    batch_sampler: Any,
    normalize: NormalizeSpec | None,
    device: torch.device,
) -> Callable[[list[Any]], Any] | None:
    """The collate function torch's loader runs for DataLoaderX."""
    if isinstance(collate_fn, NormalizingCollate):
        collate_fn = collate_fn.inner  # a loader rebuilt from our attributes (Lightning): no double normalization
    if collate_fn is None and (batch_size is not None or batch_sampler is not None):
        # Takes fastloader datasets' pre-assembled uint8 batches as they are (no copy) and
        # falls back to default_collate for everything else: the same batches as torch.
        from fastloader.image.batching import collate

        collate_fn = collate
    if normalize is not None and device.type != "cuda":
        # No GPU: normalize where torch's loader does, in the workers, in parallel.
        collate_fn = NormalizingCollate(collate_fn or default_convert, normalize)
    return collate_fn


def dataset_for_decode(dataset: Any, decode_on: str, device: torch.device) -> tuple[Any, bool]:
    """The dataset this loader reads, and whether batches are decoded on the GPU.

    GPU decode needs the dataset to send encoded images: a per-loader choice, so the loader works on
    its own shallow copy (sharing the source, index and error policy) and leaves the user's dataset
    as it found it: another loader over it may still decode on the CPU."""
    gpu = decode_on == "cuda"
    if gpu and device.type != "cuda":
        warnings.warn(
            f"decode_on='cuda' but batches go to {device}: decoding on the CPU instead", RuntimeWarning, stacklevel=3
        )
        gpu = False
    wanted = "cuda" if gpu else "cpu"
    if getattr(dataset, "decode_device", "cpu") == wanted:
        return dataset, gpu
    if not callable(getattr(dataset, "set_decode_device", None)):
        raise ValueError(
            f"decode_on='cuda' needs a fastloader dataset with a fastloader transform, got {type(dataset).__name__}"
        )
    own = copy.copy(dataset)
    own.set_decode_device(wanted)
    return own, gpu


def advise_workers(num_workers: int) -> None:
    """Warn when the workers exceed this rank's share of the cores: torch's own check counts the
    affinity mask only, not a container's cgroup quota nor the other ranks of the machine."""
    from fastloader import world

    share, ranks = world.cores_per_rank(), world.local_world_size()
    if num_workers > share and (ranks > 1 or world.usable_cpus() < len(os.sched_getaffinity(0))):
        warnings.warn(
            f"num_workers={num_workers} but this rank's share is {share} cores ({world.usable_cpus()} usable"
            f" cores / {ranks} local ranks): more workers than cores thrash; suggested"
            f" num_workers={world.suggested_num_workers()} (fastloader.world.suggested_num_workers())",
            RuntimeWarning,
            stacklevel=3,
        )
