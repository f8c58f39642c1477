"""What the framework runs share: a dataset whose items name themselves, and the loaders under test."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from fastloader import DataLoaderX
from tests.helpers import DDP_WORKER_CONTEXT

LENGTH = 101  # odd: torch's DistributedSampler pads it, accelerate's even_batches pads it
BATCH = 8

# The Lightning DDP runs of tests/integrations/lightning_ddp.py, each with torch's loader and DataLoaderX:
# name -> (Trainer's use_distributed_sampler, make_loader's split)
LIGHTNING_DDP_CONFIGS: dict[str, tuple[bool, str | None]] = {
    "lightning_sampler": (True, None),  # Lightning inserts its DistributedSampler
    "lightning_sampler_local_rank": (True, "local_rank"),  # DataLoaderX splits itself
    "user_sampler": (False, "sampler"),  # torch's DistributedSampler passed by the user
    "user_local_rank": (False, "local_rank"),
}


class Images(Dataset[tuple[torch.Tensor, int]]):
    """Item i is a 3x2x2 uint8 image of value i and its index: an image batch that says what it holds."""

    def __len__(self) -> int:
        return LENGTH

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.full((3, 2, 2), index, dtype=torch.uint8), index


class Items(Dataset[tuple[torch.Tensor, int]]):
    """Item i is ``(tensor([i.]), i)``: every batch says which samples it holds."""

    def __len__(self) -> int:
        return LENGTH

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.tensor([float(index)]), index


def make_loader(
    kind: str,
    split: str | None = None,
    dataset: Dataset[Any] | None = None,
    batch_size: int = BATCH,
    num_workers: int = 1,
    **extra: Any,
) -> DataLoader[Any]:
    """torch's DataLoader ("torch") or DataLoaderX ("fastloader") with the same arguments.

    split: None (shuffle=True, the framework splits), "sampler" (the user passes torch's
    DistributedSampler) or "local_rank" (DataLoaderX's own split; torch's loader gets the sampler).
    dataset: Items() unless given.
    """
    cls = DataLoaderX if kind == "fastloader" else DataLoader
    dataset = dataset if dataset is not None else Items()
    if num_workers > 0:
        extra.setdefault("multiprocessing_context", DDP_WORKER_CONTEXT)
    if split == "sampler" or (split == "local_rank" and kind == "torch"):
        sampler = DistributedSampler(dataset, shuffle=True)
        return cls(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers, **extra)
    if split == "local_rank":
        extra["local_rank"] = int(os.environ["LOCAL_RANK"])
    return cls(dataset, batch_size=batch_size, shuffle=True, num_workers=num_workers, **extra)


def reset_accelerate() -> None:
    """Forget the accelerate state an in-process ``Accelerator`` left (as accelerate's own tests do)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
