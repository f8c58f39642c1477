"""Hugging Face accelerate with DataLoaderX: ``prepare`` instead of ``accelerator.prepare``.

``accelerator.prepare(loader)`` rebuilds every loader as accelerate's ``DataLoaderShard`` over a plain
``torch.utils.data.DataLoader`` made from the loader's public arguments, so the DataLoaderX itself never
runs: no prefetch thread, no side-stream copy, no normalize / flip / channels_last after the copy, no
``decode_on="cuda"``, nothing in ``stats()`` (a DataLoaderX warns when that happens, once:
``fastloader.loader.plain_prepare``). This ``prepare`` keeps it::

    from fastloader.integrations.accelerate import prepare
    model, optimizer, loader = prepare(accelerator, model, optimizer, loader)  # was accelerator.prepare(...)

Every DataLoaderX among the arguments becomes a :class:`PreparedLoader` (a DataLoaderX reading
accelerate's shard of the data, see ``fastloader.integrations.accelerate_loader``); everything else
goes to ``accelerator.prepare`` as before. The seam, and why it holds across accelerate versions:

* The sharding is accelerate's own, never re-implemented: ``accelerator.prepare_data_loader(loader,
  device_placement=False)`` (public) builds the ``DataLoaderShard`` this accelerator would build, with its
  configuration (``BatchSamplerShard`` with ``split_batches`` / ``even_batches``, ``IterableDatasetShard``,
  ``use_seedable_sampler``, the synchronized generator, device meshes). Its torch loader is never
  iterated: a DataLoaderX is rebuilt from the original's arguments (each stored under its own name)
  around that shard's batch sampler, delivering to ``accelerator.device``; the shard stays to answer
  accelerate's questions (``total_batch_size``, ``set_epoch``, ``get_sampler``) exactly as it would.
* ``accelerator.register_for_checkpointing`` (public since accelerate 0.6, unchanged) carries the loader's
  resume state through ``save_state()`` / ``load_state()``. accelerate's own stateful-loader path
  (``use_stateful_dataloader``, 0.34+) is not used: its state adjustments changed in several releases.
* ``DataLoaderStateMixin`` (accelerate's since 0.20, what ``DataLoaderShard`` uses) keeps ``GradientState``
  informed, so ``gather_for_metrics`` drops the padding and gradient accumulation syncs at the end.
* Beyond public API: ``accelerator._dataloaders`` (the list ``save_state``, ``join_uneven_inputs`` and
  ``free_memory`` read, since 0.15; the loader takes the shard's place there), and the shard's
  ``rng_types`` / ``synchronized_generator`` attributes (since 0.1 / 0.24) and ``set_epoch``,
  ``total_batch_size``, ``get_sampler`` (0.24, 0.11, 0.30). The result is marked ``_is_accelerate_prepared``
  (0.21), so a later ``accelerator.prepare`` leaves it as it is.

Not supported (ValueError): ``dispatch_batches=True`` (rank 0 would read for everyone), XLA and devices
other than CUDA and the CPU (DataLoaderX copies to CUDA only), and a DataLoaderX that already splits the
data over the ranks (``local_rank=`` before the Accelerator existed, ``distributed=True``, a
``DistributedSampler``): accelerate would split it a second time. An IterableDataset is sharded the way
accelerate does without dispatching (``IterableDatasetShard``: each rank reads it and keeps its part).
Not tried: DeepSpeed, FSDP, Megatron-LM and tensor / context parallel meshes (the sharding is accelerate's
for them too, but nothing here was run with them; DeepSpeed's ``"auto"`` micro batch size is read from
the DataLoaders passed to ``accelerator.prepare`` with the model: set it in the DeepSpeed config).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.utils.data as tud
from accelerate import Accelerator
from accelerate.utils import DistributedType

from fastloader.integrations.accelerate_loader import PreparedLoader
from fastloader.loader.dataloader import DataLoaderX
from fastloader.loader.plain_prepare import own_prepare

__all__ = ["PreparedLoader", "prepare", "prepare_loader"]


def prepare(accelerator: Accelerator, *objects: Any) -> Any:
    """``accelerator.prepare(*objects)``, with every DataLoaderX kept a DataLoaderX (:func:`prepare_loader`).
    Returns the objects in the same order (one object alone, as accelerate does)."""
    loaders = {i: prepare_loader(accelerator, obj) for i, obj in enumerate(objects) if isinstance(obj, DataLoaderX)}
    others = [obj for i, obj in enumerate(objects) if i not in loaders]
    prepared: Any = accelerator.prepare(*others) if others else ()
    rest = iter(prepared if len(others) > 1 else (prepared,))
    result = tuple(loaders[i] if i in loaders else next(rest) for i in range(len(objects)))
    return result[0] if len(result) == 1 else result


def prepare_loader(accelerator: Accelerator, loader: DataLoaderX[Any]) -> PreparedLoader:
    """The DataLoaderX ``loader`` on this rank's shard of the data, registered with ``accelerator`` for
    ``save_state()`` / ``load_state()`` and its gradient state (see the module docstring)."""
    if isinstance(loader, PreparedLoader):
        return loader
    if not isinstance(loader, DataLoaderX):
        raise ValueError(f"prepare_loader needs a fastloader.DataLoaderX, got {type(loader).__name__}")
    _refuse_unsupported(accelerator, loader)
    with own_prepare(loader):  # accelerate's sharding, without the warning its plain prepare gets
        shard = accelerator.prepare_data_loader(loader, device_placement=False)
    batch_sampler_as_sampler = isinstance(shard.sampler, tud.BatchSampler)  # DataLoader(sampler=BatchSampler)
    index_batches = shard.sampler if batch_sampler_as_sampler else shard.batch_sampler
    batches = None if isinstance(shard.dataset, tud.IterableDataset) else index_batches
    rebuilt = _rebuilt(loader, shard, batches, batch_sampler_as_sampler, _device(accelerator))
    prepared = PreparedLoader(rebuilt, shard, drop_last=loader.drop_last)
    _take_place(accelerator, shard, prepared)
    accelerator.register_for_checkpointing(prepared)
    prepared._is_accelerate_prepared = True
    return prepared


def _refuse_unsupported(accelerator: Accelerator, loader: DataLoaderX[Any]) -> None:
    if accelerator.distributed_type == DistributedType.XLA:
        raise ValueError("fastloader's accelerate prepare does not run on XLA: use accelerator.prepare(loader) there")
    if accelerator.dispatch_batches:
        raise ValueError(
            "dispatch_batches=True (DataLoaderConfiguration): rank 0 would read every batch for all ranks;"
            " DataLoaderX reads on each rank: use dispatch_batches=False or None"
        )
    device = torch.device(accelerator.device)
    if accelerator.device_placement and device.type not in ("cuda", "cpu"):
        raise ValueError(f"accelerator.device is {device}: DataLoaderX delivers to CUDA or the CPU only")
    samplers = (loader.sampler, getattr(loader.batch_sampler, "sampler", None))
    if accelerator.num_processes > 1 and any(getattr(s, "num_replicas", 1) > 1 for s in samplers):
        name = next(type(s).__name__ for s in samplers if getattr(s, "num_replicas", 1) > 1)
        raise ValueError(
            f"this DataLoaderX already splits the data over the ranks ({name}) and accelerate would shard it again:"
            " build it without local_rank= (or after the Accelerator), distributed=True and a DistributedSampler"
        )


def _device(accelerator: Accelerator) -> torch.device:
    """Where accelerate would put the batches: its device (on one GPU "cuda", the current one), or the CPU
    without device placement."""
    device = torch.device(accelerator.device) if accelerator.device_placement else torch.device("cpu")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _rebuilt(
    loader: DataLoaderX[Any],
    shard: Any,
    batches: Any,
    batch_sampler_as_sampler: bool,
    device: torch.device,
) -> DataLoaderX[Any]:
    """The DataLoaderX that runs: the original's arguments, accelerate's shard of the data, batches delivered
    to ``device``, and no split of its own (accelerate's is the split)."""
    names = list(inspect.signature(DataLoaderX.__init__).parameters)[1:]
    args = {name: getattr(loader, name) for name in names}
    args.update(dataset=shard.dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None, drop_last=False)
    args.update(device=device, local_rank=None, distributed=False)
    if batches is None:  # an IterableDataset: accelerate's IterableDatasetShard, batched as accelerate batches it
        args.update(batch_size=shard.batch_size, drop_last=shard.drop_last)
    elif batch_sampler_as_sampler:
        args.update(sampler=batches, batch_size=shard.batch_size)
    else:
        args.update(batch_sampler=batches)
    return DataLoaderX(**args)


def _take_place(accelerator: Accelerator, shard: Any, prepared: PreparedLoader) -> None:
    """Put ``prepared`` where ``prepare_data_loader`` put the shard in accelerate's list of loaders."""
    loaders = accelerator._dataloaders
    for index, item in enumerate(loaders):
        if item is shard:
            loaders[index] = prepared
            return
    loaders.append(prepared)
