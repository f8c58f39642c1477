"""Which resume protocol a dataset (or sampler) speaks, and the loader's side of the ones libraries define.

Three protocols are called ``state_dict`` / ``load_state_dict``, and only the first is torchdata's:

* torchdata's Stateful: ``state_dict()`` takes no argument and returns where the object is. Its state travels
  with each batch from the worker that made it (``fastloader.loader.worker_state``), as torchdata's
  StatefulDataLoader takes it: a worker runs ahead of the training loop, so a state asked for later would
  describe batches the loop never received.
* litdata's ``StreamingDataset``: ``state_dict(num_samples_yielded, num_workers, batch_size)``, called in the
  training process by litdata's ``StreamingDataLoader`` with what the loop received; the dataset resumes
  itself in each worker from it. :class:`LitdataResume` is that loader's side.
* MosaicML streaming's ``StreamingDataset``: ``state_dict(num_samples, from_beginning)``, called by its
  ``StreamingDataLoader`` with the samples all ranks received since the iteration began.
  :class:`MosaicResume` is that loader's side.

Anything else with a ``state_dict`` (a torch module's weights, a signature nobody documented to us) is
iterated as torch's loader iterates it and never asked for a state; a mid-epoch resume of such an
IterableDataset is refused (``fastloader.loader.resume``), since nothing says where it stopped.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch


def stateful(obj: Any) -> bool:
    """torchdata's Stateful protocol: ``load_state_dict`` and a ``state_dict`` that takes no argument."""
    if isinstance(obj, torch.nn.Module):  # its state_dict is its weights, not a position
        return False
    method = getattr(obj, "state_dict", None)
    return callable(method) and callable(getattr(obj, "load_state_dict", None)) and _no_required_argument(method)


def foreign_state(obj: Any) -> str | None:
    """``state_dict(...)``'s signature when ``obj`` has one that no protocol here fits (None otherwise)."""
    method = getattr(obj, "state_dict", None)
    if not callable(method) or stateful(obj) or library_resume(obj) is not None:
        return None
    try:
        names = ", ".join(inspect.signature(method).parameters)
    except (TypeError, ValueError):
        names = "..."
    return f"state_dict({names})"


def _no_required_argument(method: Any) -> bool:
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):  # a builtin without a signature: callable as torchdata calls it, or not
        return True
    return all(
        parameter.default is not inspect.Parameter.empty
        or parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        for parameter in signature.parameters.values()
    )


class LibraryResume:
    """A library's resume protocol, driven as the library's own loader drives it (one per iteration)."""

    library = ""
    # Whether a resumed iteration's first batch comes from worker 0 (the dataset splits the rest of the epoch
    # over the workers afresh) rather than from the worker after the one that made the last batch received.
    first_worker_anew = False

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def start_epoch(self, epoch: int, loaded: Any, batch_size: int, num_workers: int) -> None:
        """At ``iter()``, before the workers copy the dataset: epoch ``epoch`` (the loader's, from 0) begins,
        afresh (``loaded`` None) or from a state :meth:`state` made."""
        raise NotImplementedError

    def state(self, epoch_samples: int, iteration_samples: int, batch_size: int, num_workers: int) -> Any:
        """The library's state after ``epoch_samples`` samples of the epoch reached this rank's training loop
        (``iteration_samples`` of them since this iteration began: the rest were before a resume)."""
        raise NotImplementedError


class LitdataResume(LibraryResume):
    """litdata's ``StreamingDataLoader``'s side of its ``StreamingDataset``: the dataset learns the batch size
    and worker count (its split over workers depends on them), each fresh epoch resets the dataset's state and
    sets its epoch (litdata counts from 1), a loaded state goes back into the dataset, which skips in each
    worker what the loop received."""

    library = "litdata"

    def start_epoch(self, epoch: int, loaded: Any, batch_size: int, num_workers: int) -> None:
        self.dataset.set_batch_size(batch_size)
        self.dataset.set_num_workers(num_workers)
        if loaded is None:
            self.dataset.reset_state_dict()
        else:
            self.dataset.load_state_dict(loaded)
        self.dataset.set_epoch(epoch + 1)  # ignored by litdata while a loaded state names the epoch

    def state(self, epoch_samples: int, iteration_samples: int, batch_size: int, num_workers: int) -> Any:
        return self.dataset.state_dict(epoch_samples, num_workers, batch_size)


class MosaicResume(LibraryResume):
    """MosaicML streaming's ``StreamingDataLoader``'s side: the dataset counts its epochs itself (in shared
    memory); its state is taken from the samples every rank received since the iteration began, and a loaded
    state goes back into the dataset before its next ``iter()``."""

    library = "MosaicML streaming"
    first_worker_anew = True

    def start_epoch(self, epoch: int, loaded: Any, batch_size: int, num_workers: int) -> None:
        if loaded is not None:
            self.dataset.load_state_dict(loaded)

    def state(self, epoch_samples: int, iteration_samples: int, batch_size: int, num_workers: int) -> Any:
        world = sys.modules["streaming.base.world"].World.detect()
        samples = iteration_samples * world.num_ranks
        replication = getattr(self.dataset, "replication", None)
        if replication is not None:
            samples //= replication
        return self.dataset.state_dict(samples, False)


def library_resume(dataset: Any) -> LibraryResume | None:
    """The library protocol ``dataset`` speaks, or None. A library's class is looked up only where the
    library is imported already: a dataset of it means it is, and nothing is imported for anyone else."""
    for module, name, kind in _LIBRARIES:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and isinstance(dataset, cls):
            return kind(dataset)
    return None


_LIBRARIES: tuple[tuple[str, str, type[LibraryResume]], ...] = (
    ("litdata.streaming.dataset", "StreamingDataset", LitdataResume),
    ("streaming.base.dataset", "StreamingDataset", MosaicResume),
)
