"""torch's "more samples than ``len(dataloader)`` said" warning for an IterableDataset, given where torch gives it.

torch's iterator warns when an IterableDataset yields more batches than ``len(loader)`` reported. In a
DataLoaderX the producer thread drives torch's iterator, ahead of the training loop and where no
``catch_warnings`` of the loop sees it: the epoch takes the check over from torch's iterator and warns at the
``next()`` that delivers the extra batch, in the training loop's thread, with torch's words.
"""

from __future__ import annotations

import warnings
from typing import Any

from fastloader.torch_internals import take_reported_length


class LengthCheck:
    """The check of one epoch, taken from torch's iterator ``source`` before anything iterates it."""

    def __init__(self, source: Any) -> None:
        self.reported, self._dataset, self._num_workers = take_reported_length(source)

    def check(self, delivered: int) -> None:
        """The training loop has received ``delivered`` batches this epoch."""
        if self.reported is not None and delivered > self.reported:
            self._warn(delivered)

    def _warn(self, delivered: int) -> None:
        message = (
            f"Length of IterableDataset {self._dataset} was reported to be {self.reported}"
            f"(when accessing len(dataloader)), but {delivered} samples have been fetched. "
        )
        if self._num_workers > 0:
            message += (
                "For multiprocessing data-loading, this could be caused by not properly configuring the "
                "IterableDataset replica at each worker. Please see "
                "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples."
            )
        warnings.warn(message, UserWarning, stacklevel=4)
