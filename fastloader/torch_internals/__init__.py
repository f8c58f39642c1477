"""Every private part of torch that fastloader relies on, and why: the one place to look at a torch upgrade.

``tests/test_torch_internals.py`` pins each of them on the installed torch (the attribute or function exists
and behaves as used here). A module of fastloader that needs one imports it from here, never from torch.
This package imports nothing of fastloader's outside it, so any layer may use it.

One module per part of torch it touches (CONTRIBUTING.md has the table of which feature needs which name):

* ``loader_iter``: the DataLoader and its iterators (the loader view, resume's start, worker restarts, the
  watchdog's view of the workers);
* ``worker_loop``: torch's worker loop, in worker processes and in thread workers (the fetcher factory, the
  result pipes, the seeds, the thread-local ``get_worker_info()``);
* ``tensors``: storages, pinning, collate and the profiler.

This door re-exports each of them, so that a caller names what it needs, not where it lives.
"""

from __future__ import annotations

from fastloader.torch_internals.loader_iter import (
    LoaderView,
    MultiProcessIterStartingAt,
    SingleProcessIterWith,
    TaggedResume,
    WorkerEvents,
    WorkerRecovery,
    WorkerSet,
    awaited_batch,
    base_seed,
    batches_in_workers,
    drop_persistent_iterator,
    fetcher_of,
    index_sampler,
    keep_persistent_iterator,
    persistent_iterator,
    resume_message,
    shutdown_workers,
    take_reported_length,
    worker_processes,
)
from fastloader.torch_internals.tensors import (
    collate_with,
    default_collate_fn_map,
    drop_storage_ref,
    pin_memory,
    profiler_enabled,
    shared_storage,
    storage_gone,
    storage_ref,
)
from fastloader.torch_internals.worker_loop import (
    FetcherFactory,
    enable_thread_workers,
    install_fetcher_factory,
    numpy_seed,
    send_results_with,
    set_thread_worker,
    set_worker_seed,
    thread_worker,
    thread_worker_info,
    thread_worker_parts,
    torch_fetcher_factory,
)

__all__ = [
    "FetcherFactory",
    "LoaderView",
    "MultiProcessIterStartingAt",
    "SingleProcessIterWith",
    "TaggedResume",
    "WorkerEvents",
    "WorkerRecovery",
    "WorkerSet",
    "awaited_batch",
    "base_seed",
    "batches_in_workers",
    "collate_with",
    "default_collate_fn_map",
    "drop_persistent_iterator",
    "drop_storage_ref",
    "enable_thread_workers",
    "fetcher_of",
    "index_sampler",
    "install_fetcher_factory",
    "keep_persistent_iterator",
    "numpy_seed",
    "persistent_iterator",
    "pin_memory",
    "profiler_enabled",
    "resume_message",
    "send_results_with",
    "set_thread_worker",
    "set_worker_seed",
    "shared_storage",
    "shutdown_workers",
    "storage_gone",
    "storage_ref",
    "take_reported_length",
    "thread_worker",
    "thread_worker_info",
    "thread_worker_parts",
    "torch_fetcher_factory",
    "worker_processes",
]
