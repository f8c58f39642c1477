"""The private parts of torch's tensors, storages, collate and profiler that fastloader relies on.

Tensors and the profiler:

* ``_utils.pin_memory.pin_memory``: torch's pin of a nested batch (the stage clock's timed pin);
* ``torch.UntypedStorage._new_shared``: a storage in shared memory, written by a worker and sent without a copy
  (:func:`shared_storage`);
* ``UntypedStorage._weak_ref`` / ``_expired`` / ``_free_weak_ref`` (what ``torch.multiprocessing``'s
  ``StorageWeakRef`` wraps): whether a storage still exists; the batch ring tells a storage freed from one that
  moved its data to shared memory (:func:`storage_ref`, :func:`storage_gone`, :func:`drop_storage_ref`);
* ``_utils.collate.collate`` and ``default_collate_fn_map``: default_collate with extra types
  (``fastloader.image.batching``);
* ``torch.autograd.profiler._is_profiler_enabled``: whether a profiler records, checked before each stage label
  (:func:`profiler_enabled`; read by the stage clock's worker half).
"""

from __future__ import annotations

from typing import cast

import torch
import torch.autograd.profiler as _profiler
from torch.utils.data._utils.collate import collate as collate_with
from torch.utils.data._utils.collate import default_collate_fn_map
from torch.utils.data._utils.pin_memory import pin_memory

__all__ = [
    "collate_with",
    "default_collate_fn_map",
    "drop_storage_ref",
    "pin_memory",
    "profiler_enabled",
    "shared_storage",
    "storage_gone",
    "storage_ref",
]

# --- tensors and the profiler -----------------------------------------------------------------------------


def shared_storage(nbytes: int) -> torch.UntypedStorage:
    """An uninitialised storage of ``nbytes`` in shared memory."""
    return torch.UntypedStorage._new_shared(nbytes)


def storage_ref(tensor: torch.Tensor) -> int:
    """A weak reference to ``tensor``'s storage (the storage itself, not its data), as a number: ask
    :func:`storage_gone`, then give it back with :func:`drop_storage_ref` (what ``StorageWeakRef`` of
    ``torch.multiprocessing.reductions`` wraps, without its object's cost: a few hundred ns, not microseconds)."""
    return cast(int, tensor.untyped_storage()._weak_ref())  # (typed as a storage; it is the number)


def storage_gone(ref: int) -> bool:
    """Whether the storage of :func:`storage_ref` no longer exists. While its data is being freed because the
    storage itself goes, it is gone already; when only its data was replaced (``share_memory_()`` moves a
    storage's data to new shared memory), it is not."""
    return bool(torch.UntypedStorage._expired(ref))


def drop_storage_ref(ref: int) -> None:
    """Give back a :func:`storage_ref` (once)."""
    torch.UntypedStorage._free_weak_ref(ref)


def profiler_enabled() -> bool:
    """True while a torch profiler records in this process."""
    return bool(_profiler._is_profiler_enabled)
