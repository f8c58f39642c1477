"""Where batches go, and the CUDA side-stream copy that takes them there.

The stream protocol (one ``CudaCopier`` per loader, created on the first ``iter()``, never per epoch:
a per-epoch stream made reserved GPU memory grow every epoch in a popular prefetcher):

1. Producer thread, per batch: the side stream waits on the consumer stream (so copies run at most
   a few batches ahead of the GPU work already queued), then every tensor is copied with
   ``non_blocking=True`` (asynchronous from pinned memory) on the side stream, and an event is
   recorded after the last copy.
2. Consumer (training) thread, when it takes the batch: its current stream waits on that event,
   and every tensor gets ``record_stream(consumer)`` so the caching allocator cannot hand the memory
   to someone else while the consumer's kernels may still read it.
3. The host batch stays referenced by the copier until that event has completed (checked with
   ``Event.query()`` at each send and receive, never by timing): the copy engine reads it asynchronously,
   and memory torch's pinned allocator did not make (a batch ring slot, ``fastloader.image.batch_ring``)
   would otherwise be freed, and written again by a worker, while the copy still reads it.

No CUDA call is ever made in a worker process: all of this runs in the main process.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from fastloader.loader.nested import iter_tensors, map_tensors

DeviceLike = torch.device | str | int


def _env_local_rank() -> int | None:
    from fastloader.world import env_int

    return env_int("LOCAL_RANK", None)


def resolve_device(local_rank: int | None, device: DeviceLike | None) -> torch.device:
    """The device batches are delivered to.

    ``device`` wins when given; ``local_rank`` picks ``cuda:local_rank``; with neither, ``cuda:LOCAL_RANK``
    (from the environment, as set by torchrun) when CUDA is present, else the CPU. Without CUDA a
    ``local_rank`` is accepted and batches stay on the CPU, so one DDP script runs everywhere.
    """
    if local_rank is not None and (isinstance(local_rank, bool) or not isinstance(local_rank, int) or local_rank < 0):
        raise ValueError(f"local_rank must be a non-negative int, got {local_rank!r}")
    cuda = torch.cuda.is_available()
    if device is None:
        rank = local_rank if local_rank is not None else _env_local_rank()
        if not cuda:
            return torch.device("cpu")
        if rank is None:
            rank = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
        return _checked_cuda(rank, "local_rank")

    target = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if target.type == "cuda":
        if not cuda:
            raise ValueError(f"device={device!r} but CUDA is not available on this machine")
        if target.index is None:
            rank = local_rank if local_rank is not None else _env_local_rank()
            target = torch.device("cuda", rank if rank is not None else 0)
        if local_rank is not None and target.index != local_rank:
            raise ValueError(f"device={device!r} disagrees with local_rank={local_rank}")
        return _checked_cuda(target.index or 0, "device")
    return target  # e.g. device="cpu" under DDP with gloo: the caller asked for it explicitly


def _checked_cuda(index: int, argument: str) -> torch.device:
    count = torch.cuda.device_count()
    if index >= count:
        raise ValueError(f"{argument} selects cuda:{index} but this machine has {count} CUDA device(s)")
    return torch.device("cuda", index)


def on_device(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Make ``device`` current (so torch's pin-memory thread pins for it, not for cuda:0)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


@dataclass(frozen=True)
class InFlight:
    """A batch whose copy was queued on the side stream; ``ready`` fires when it has landed."""

    batch: Any
    ready: torch.cuda.Event


class CudaCopier:
    """Copies batches to one CUDA device on one side stream (see the module docstring)."""

    def __init__(
        self,
        device: torch.device,
        non_blocking: bool,
        prepare: Callable[[Any], Any] | None = None,
        finish: Callable[..., Any] | None = None,
    ) -> None:
        if device.type != "cuda":
            raise ValueError(f"CudaCopier needs a CUDA device, got {device}")
        self.device = device
        self.non_blocking = non_blocking
        self.prepare = prepare  # on the side stream, before the copy (GPU decode)
        self.finish = finish  # on the side stream, after the copy (float + normalize; with the batch's flips)
        self.stream = torch.cuda.Stream(device=device)
        self._copying: collections.deque[tuple[torch.cuda.Event, Any]] = collections.deque()  # (event, host batch)
        self._lock = threading.Lock()

    def send(self, batch: Any, consumer: torch.cuda.Stream, flips: Any = None) -> InFlight:
        """Queue the copy of ``batch`` (producer thread); ``flips``: its samples' random_flip draws (seed=)."""
        host = batch
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            self.stream.wait_stream(consumer)
            if self.prepare is not None:
                batch = self.prepare(batch)
            moved = map_tensors(batch, self._copy)
            if self.finish is not None:
                moved = self.finish(moved, flips)
            ready = torch.cuda.Event()
            ready.record(self.stream)
        self._hold(ready, host)
        return InFlight(moved, ready)

    def _hold(self, ready: torch.cuda.Event | None, host: Any = None) -> None:
        """Keep ``host`` until ``ready`` has completed; let go of the host batches whose copies have (in order:
        one stream's events complete in the order they were recorded)."""
        with self._lock:
            if ready is not None:
                self._copying.append((ready, host))
            while self._copying and self._copying[0][0].query():
                self._copying.popleft()

    def copying(self) -> int:
        """Host batches still referenced because their copies may not have completed."""
        self._hold(None)
        return len(self._copying)

    def _copy(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device, non_blocking=self.non_blocking)

    def receive(self, item: InFlight) -> Any:
        """Hand a copied batch to the consumer's current stream (consumer thread)."""
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(item.ready)
        for tensor in _device_tensors(item.batch, self.device):
            tensor.record_stream(consumer)
        self._hold(None)
        return item.batch


def _device_tensors(batch: Any, device: torch.device) -> Iterator[torch.Tensor]:
    return (t for t in iter_tensors(batch) if t.device == device)
