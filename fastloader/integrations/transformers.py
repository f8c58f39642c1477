"""Hugging Face transformers' ``Trainer`` with fastloader's loader: ``resume_from_checkpoint`` exact.

A Trainer whose ``get_train_dataloader`` returns ``fastloader.integrations.accelerate.prepare(...)`` of a
DataLoaderX resumes mid-epoch through ``get_resumed_dataloader(loader, n)``, which by default calls
accelerate's ``skip_first_batches``: that reads the loader's batches through a plain torch DataLoader,
which fastloader's loader refuses (``ValueError``) rather than train on it. Mix :class:`ExactResumeMixin`
in ahead of the Trainer class and the resumed epoch is the loader's own, from batch ``n``, in the order of
the uninterrupted run, with prefetch and the copy to the device::

    from fastloader.integrations.transformers import ExactResumeMixin

    class MyTrainer(ExactResumeMixin, Trainer):
        def get_train_dataloader(self):
            return prepare(self.accelerator, DataLoaderX(self.train_dataset, batch_size=32, shuffle=True))

``get_resumed_dataloader`` is the Trainer's hook for loaders that resume themselves (transformers 5; an
older Trainer calls ``skip_first_batches`` directly and so meets the refusal). A DataLoaderX returned
without ``prepare`` is neither sharded by the Trainer nor resumable by it: the mixin refuses to resume
it (``ValueError``) rather than let accelerate's ``skip_first_batches`` rebuild it as a torch DataLoader
in epoch 0's order. This module imports nothing from transformers.
"""

from __future__ import annotations

from typing import Any

from fastloader.integrations.accelerate_loader import PreparedLoader
from fastloader.loader.dataloader import DataLoaderX

__all__ = ["ExactResumeMixin"]


class ExactResumeMixin:
    """For a ``transformers.Trainer`` subclass: a loader from fastloader's ``prepare`` resumes by itself
    (:meth:`PreparedLoader.skip_first_batches`); any other loader goes to the Trainer's own resume."""

    def get_resumed_dataloader(self, dataloader: Any, num_batches: int) -> Any:
        if isinstance(dataloader, PreparedLoader):
            return dataloader.skip_first_batches(num_batches)
        if isinstance(dataloader, DataLoaderX):
            raise ValueError(
                "the Trainer's train dataloader is a DataLoaderX it did not prepare: the Trainer cannot resume it"
                " mid-epoch (accelerate's skip_first_batches would rebuild it as a torch DataLoader in another"
                " order). Return fastloader.integrations.accelerate.prepare(self.accelerator, loader) from"
                " get_train_dataloader"
            )
        return super().get_resumed_dataloader(dataloader, num_batches)  # type: ignore[misc]
