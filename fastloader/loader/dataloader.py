"""DataLoaderX: torch's DataLoader, with batches prefetched in a thread and copied to the GPU on a side stream.

Data flow of one epoch::

    torch iterator (workers, pin-memory thread)
        └─► producer thread (background.py): next(batch) ─► CudaCopier.send on the side stream (device.py)
              └─► bounded queue ─► consumer: CudaCopier.receive (wait event, record_stream) ─► training loop
"""

from __future__ import annotations

import copy
import functools
import itertools
import os
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_convert

from fastloader.image.gpu_decode import decode_encoded
from fastloader.loader.background import BackgroundGenerator
from fastloader.loader.default_sampler import choose_sampler, rebuilt_with
from fastloader.loader.device import CudaCopier, DeviceLike, on_device, resolve_device
from fastloader.loader.normalize import Normalizer, NormalizeSpec, NormalizingCollate
from fastloader.loader.resume import Progress, apply_state, begin, state_of
from fastloader.samplers._epoch import check_nonnegative_int

T_co = TypeVar("T_co", covariant=True)
_QUICK_JOIN_S = 0.5  # how long the training loop waits for a finished producer thread to end


class DataLoaderX(DataLoader[T_co]):
    """A drop-in ``torch.utils.data.DataLoader`` whose batches arrive prefetched, on the device.

    The positional and keyword parameters are exactly torch's, with the same defaults, and every
    argument is stored under its own name (Lightning rebuilds loaders as ``type(loader)(**args)``;
    accelerate reads them with ``getattr``). The extras are keyword-only:

    Args:
        local_rank: this process's rank on its machine (DDP): batches go to ``cuda:local_rank`` (without
            CUDA they stay on the CPU), and with more than one rank the dataset is split over the ranks.
        device: where batches go; overrides ``local_rank``. Default: ``cuda:$LOCAL_RANK`` when CUDA is
            present, else the CPU (then nothing is copied, only prefetched).
        max_prefetch: batches held ready ahead of the training loop (a bounded queue).
        non_blocking: copy asynchronously (needs ``pin_memory=True`` to overlap with compute).
        normalize: ``(mean, std)`` in [0, 1] units, as torchvision's Normalize after ToTensor: uint8
            image batches (N×C×H×W) become ``normalize_dtype`` and are normalized after the copy,
            on the GPU (on the CPU without CUDA).
        normalize_dtype: float32 (default), float16, bfloat16 or float64.
        channels_last: deliver normalized images in channels_last memory format.
        random_flip: probability of flipping each image horizontally, on the device.
        decode_on: "cuda" decodes JPEGs with nvJPEG in this process, on the side stream; the
            dataset (a fastloader dataset with a ``fastloader.transforms`` transform) then sends
            encoded bytes and crop plans. Without CUDA it falls back to "cpu" with a warning.
        distributed: split a map-style dataset over the ranks (a ``fastloader.samplers.DistributedSampler``,
            a subclass of torch's, with ``shuffle``, ``seed`` and ``drop_last``) when neither ``sampler``
            nor ``batch_sampler`` is given. None (default): only when ``local_rank`` is given and more
            than one rank runs (never under an initialised accelerate, which shards by itself); frameworks
            that split the data themselves then see torch's behaviour. See ``fastloader.loader.default_sampler``.
        seed: the shuffle seed; orders are a function of (seed, epoch), from numpy. None keeps torch's
            orders exactly (the same batches as torch's loader for the same ``torch.manual_seed`` or
            ``generator``), still resumable by ``load_state_dict``.

    Epochs advance by themselves: each ``iter()`` after the first calls ``set_epoch(previous + 1)``
    unless ``set_epoch`` was called since the last ``iter()`` (an explicit epoch wins).
    ``state_dict()`` / ``load_state_dict()`` resume mid-epoch; see ``fastloader.loader.resume``.
    """

    def __init__(
        self,
        dataset: Dataset[T_co],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: Sampler[list[Any]] | Iterable[list[Any]] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        local_rank: int | None = None,
        device: DeviceLike | None = None,
        max_prefetch: int = 2,
        non_blocking: bool = True,
        normalize: tuple[Sequence[float], Sequence[float]] | None = None,
        normalize_dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
        random_flip: float = 0.0,
        decode_on: str = "cpu",
        distributed: bool | None = None,
        seed: int | None = None,
    ) -> None:
        if isinstance(max_prefetch, bool) or not isinstance(max_prefetch, int) or max_prefetch < 1:
            raise ValueError(f"max_prefetch must be an int >= 1, got {max_prefetch!r}")
        if decode_on not in ("cpu", "cuda"):
            raise ValueError(f"decode_on must be 'cpu' or 'cuda', got {decode_on!r}")
        if distributed is not None and not isinstance(distributed, bool):
            raise ValueError(f"distributed must be True, False or None, got {distributed!r}")
        if seed is not None:
            check_nonnegative_int(seed, "seed")
        ours = choose_sampler(
            dataset, shuffle, sampler, batch_sampler, drop_last, distributed, local_rank, seed, generator
        )
        normalize_spec = NormalizeSpec.create(normalize, normalize_dtype, channels_last, random_flip)
        target = resolve_device(local_rank, device)
        dataset, gpu_decode = _dataset_for_decode(dataset, decode_on, target)
        if isinstance(collate_fn, NormalizingCollate):
            collate_fn = collate_fn.inner  # a loader rebuilt from our attributes (Lightning): no double normalization
        if collate_fn is None and (batch_size is not None or batch_sampler is not None):
            # Takes fastloader datasets' pre-assembled uint8 batches as they are (no copy) and
            # falls back to default_collate for everything else: the same batches as torch.
            from fastloader.image.batching import collate

            collate_fn = collate
        if normalize_spec is not None and target.type != "cuda":
            # No GPU: normalize where torch's loader does, in the workers, in parallel.
            collate_fn = NormalizingCollate(collate_fn or default_convert, normalize_spec)
        super().__init__(
            dataset,
            batch_size,
            None if ours is not None or rebuilt_with(shuffle, sampler) else shuffle,  # torch: no shuffle with a sampler
            ours if ours is not None else sampler,
            batch_sampler,
            num_workers,
            collate_fn,
            pin_memory,
            drop_last,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        self.shuffle = shuffle  # torch does not keep it; Lightning and accelerate look for it
        self.local_rank = local_rank
        self.device = target
        self.max_prefetch = max_prefetch
        self.non_blocking = non_blocking
        self.normalize = normalize
        self.normalize_dtype = normalize_dtype
        self.channels_last = channels_last
        self.random_flip = random_flip
        self.decode_on = decode_on
        _advise_workers(num_workers)
        self.distributed = distributed
        self.seed = seed
        self._user_batch_sampler = batch_sampler is not None
        self._epoch = 0  # the epoch of the current (or next) iteration
        self._epoch_set = False  # set_epoch or load_state_dict since the last iter()
        self._sampler_epoch_at_iter: int | None = None  # the sampler's own epoch at the last iter()
        self._skip_batches = 0  # index batches the iteration being created skips (resume by replay)
        self._started = False
        self._pending: Progress | None = None  # a loaded state, for the next iter()
        self._progress: Progress | None = None  # the current iteration
        self._normalize_spec = normalize_spec
        self._gpu_decode = gpu_decode
        self._copier: CudaCopier | None = None  # one side stream per loader, made on the first iter()
        self._live: weakref.ref[_PrefetchIterator] | None = None

    def __iter__(self) -> _PrefetchIterator:  # type: ignore[override]
        if self._started and not self._epoch_set:
            external = self._sampler_epoch()
            if external is not None and external != self._sampler_epoch_at_iter:
                self._epoch = external  # a framework set the sampler's epoch itself (Lightning does): keep it
            else:
                self.set_epoch(self._epoch + 1)
        self._started, self._epoch_set = True, False
        progress = self._pending if self._pending is not None else Progress(self._epoch)
        self._pending, self._progress = None, progress
        self._sampler_epoch_at_iter = self._sampler_epoch()
        begin(self, progress)
        persistent = self.persistent_workers and self.num_workers > 0
        if persistent:
            # Torch hands out one shared iterator and resets it here: the previous epoch's producer
            # thread must stop pulling from it first.
            previous = self._live() if self._live is not None else None
            if previous is not None:
                previous.close()
        self._skip_batches = progress.skip
        try:
            with on_device(self.device):  # torch's pin-memory thread pins for the current device
                source = super().__iter__()
        finally:
            self._skip_batches = 0
        iterator = _PrefetchIterator(
            source, self._get_copier(), self.max_prefetch, owns_workers=not persistent, progress=progress
        )
        self._live = weakref.ref(iterator)
        return iterator

    @property
    def _index_sampler(self) -> Any:
        # torch's iterator takes its indices from here when it is created; a resumed replay skips the
        # batches the interrupted run delivered (once: see _SkipFirst)
        inner = super()._index_sampler
        return _SkipFirst(inner, self._skip_batches) if self._skip_batches else inner

    def _sampler_epoch(self) -> int | None:
        """The epoch the sampler itself holds (torch's and our samplers have ``epoch``), if any."""
        for target in (self.sampler, getattr(self.batch_sampler, "sampler", None)):
            epoch = getattr(target, "epoch", None)
            if isinstance(epoch, int) and not isinstance(epoch, bool):
                return epoch
        return None

    def _get_copier(self) -> CudaCopier | None:
        if self.device.type != "cuda":
            return None
        if self._copier is None:
            spec = self._normalize_spec
            finish = Normalizer(spec, self.device) if spec is not None else None
            prepare = functools.partial(decode_encoded, device=self.device) if self._gpu_decode else None
            self._copier = CudaCopier(self.device, self.non_blocking, prepare, finish)
        return self._copier

    def set_epoch(self, epoch: int) -> None:
        """Forward ``set_epoch`` to the sampler, the batch sampler (and its sampler) and the dataset."""
        seen: set[int] = set()
        batch_sampler = self.batch_sampler
        for target in (self.sampler, batch_sampler, getattr(batch_sampler, "sampler", None), self.dataset):
            method = getattr(target, "set_epoch", None)
            if target is None or not callable(method) or id(target) in seen:
                continue
            seen.add(id(target))
            method(epoch)
        if self._pending is not None and self._pending.epoch != epoch:
            self._pending = None  # another epoch than the loaded one: start it from the beginning
        self._epoch, self._epoch_set = epoch, True

    def stats(self) -> dict[str, Any]:
        """Where the loader is (epoch, batches delivered this epoch) and the bad samples its dataset
        met, in every worker process (``dataset.set_error_policy``; counted from its quarantine file)."""
        error_stats = getattr(self.dataset, "error_stats", None)
        stats: dict[str, Any] = dict(error_stats()) if callable(error_stats) else {}
        progress = self._progress
        stats["epoch"] = self._epoch
        stats["batches_yielded"] = progress.batches if progress is not None else 0
        return stats

    def state_dict(self) -> dict[str, int]:
        """Where the training loop is: plain ints, JSON-serializable (see ``fastloader.loader.resume``)."""
        progress = self._pending
        if progress is None:
            current = self._progress
            progress = current if current is not None and current.epoch == self._epoch else Progress(self._epoch)
        return state_of(self, progress)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state_dict()``'s output; applies to the next ``iter()``. ValueError for a foreign
        state or a sampler that cannot resume (torch's own: pass ``seed=``)."""
        progress = apply_state(self, state)
        self._pending = progress
        self._epoch, self._epoch_set = progress.epoch, True

    def __getstate__(self) -> dict[str, Any]:
        # Streams and weak references cannot be pickled or deep-copied; a copy makes its own.
        state = self.__dict__.copy()
        state["_copier"] = None
        state["_live"] = None
        return state


class _PrefetchIterator(Iterator[Any]):
    """One epoch of a DataLoaderX: torch's iterator drained by a producer thread.

    Only the producer thread touches torch's iterator, and it also shuts its workers down when it
    stops (end of epoch, error, close), so no two threads ever drive the iterator at once.
    """

    def __init__(
        self,
        source: Iterator[Any],
        copier: CudaCopier | None,
        max_prefetch: int,
        owns_workers: bool,
        progress: Progress | None = None,
    ) -> None:
        self._source = source
        self._progress = progress if progress is not None else Progress(0)
        self._reported_length = _take_length_check(source)
        self._copier = copier
        produced: Iterator[Any] = source
        if copier is not None:
            consumer = torch.cuda.current_stream(copier.device)
            produced = map(functools.partial(copier.send, consumer=consumer), produced)
        self._background: BackgroundGenerator[Any] = BackgroundGenerator(
            produced,
            max_prefetch,
            name="fastloader-dataloaderx",
            on_exit=functools.partial(_shutdown_workers, source) if owns_workers else None,
        )

    def __iter__(self) -> _PrefetchIterator:
        return self

    def __next__(self) -> Any:
        try:
            item = next(self._background)
        except StopIteration:
            self._progress.done = True
            # The producer has handed over its last word; it stops the workers on its own, which
            # may take torch 5 s for a stuck worker: the training loop does not wait for that.
            self._background.close(timeout=_QUICK_JOIN_S)
            raise
        except BaseException:
            # An error from a worker / collate / the copy: as with torch's iterator, the next next()
            # continues the epoch. A traceback kept by the caller must not keep this epoch (its thread
            # and workers) alive: dropping the iterator stops them.
            del self
            raise
        if self._copier is not None:
            item = self._copier.receive(item)
        self._progress.batches += 1  # counted here, in the consumer: the producer thread runs ahead
        if self._reported_length is not None and self._progress.batches > self._reported_length:
            _warn_past_length(self._source, self._reported_length, self._progress.batches)
        return item

    def __len__(self) -> int:
        return len(self._source)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # Anything else is torch's iterator's: code written against torch reads its state (``_workers``,
        # ``_num_yielded``, ``_shutdown``...) from the object iter() returned.
        source = self.__dict__.get("_source")
        if source is None:
            raise AttributeError(name)
        return getattr(source, name)

    def close(self) -> None:
        """Stop prefetching now; the producer stops the workers too unless they are persistent."""
        self._background.close()

    def __del__(self) -> None:
        # An early ``break`` drops the iterator: stop the thread and the workers now, not whenever
        # the producer happens to notice.
        try:
            self._background.close(timeout=_QUICK_JOIN_S)
        except Exception:  # noqa: BLE001 - never raise from __del__ (interpreter may be shutting down)
            pass


class _SkipFirst:
    """An index sampler whose next iteration leaves out its first ``skip`` items (batches of indices).

    ``__iter__`` is a generator, so the skip is spent when that iteration yields its first item: torch's
    multi-process iterator calls ``iter()`` twice when it starts and uses the second, and with persistent
    workers it keeps this object for later epochs, which then skip nothing.
    """

    def __init__(self, inner: Any, skip: int) -> None:
        self.inner = inner
        self.skip = skip

    def __iter__(self) -> Iterator[Any]:
        skip, self.skip = self.skip, 0
        yield from itertools.islice(iter(self.inner), skip, None)

    def __len__(self) -> int:
        return len(self.inner)


def _take_length_check(source: Iterator[Any]) -> int | None:
    """Take over torch's "more samples than len(dataloader) said" check of an IterableDataset from its
    iterator, so that the warning comes at the ``next()`` that delivers the extra batch, in the training
    loop's thread, not earlier in the producer thread (where no ``catch_warnings`` sees it)."""
    reported = getattr(source, "_IterableDataset_len_called", None)
    if reported is not None:
        source._IterableDataset_len_called = None  # type: ignore[attr-defined]
    return reported


def _warn_past_length(source: Iterator[Any], reported: int, delivered: int) -> None:
    message = (
        f"Length of IterableDataset {getattr(source, '_dataset', None)} was reported to be {reported}"
        f"(when accessing len(dataloader)), but {delivered} samples have been fetched. "
    )
    if getattr(source, "_num_workers", 0) > 0:
        message += (
            "For multiprocessing data-loading, this could be caused by not properly configuring the "
            "IterableDataset replica at each worker. Please see "
            "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples."
        )
    warnings.warn(message, UserWarning, stacklevel=3)


def _advise_workers(num_workers: int) -> None:
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


def _dataset_for_decode(dataset: Any, decode_on: str, device: torch.device) -> tuple[Any, bool]:
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


def _shutdown_workers(source: Iterator[Any]) -> None:
    """Stop torch's workers: in the producer thread, after the consumer has the end of the epoch
    (or its error), since joining a stuck worker takes torch up to 5 s."""
    shutdown = getattr(source, "_shutdown_workers", None)
    if callable(shutdown):
        shutdown()
