"""DataLoaderX: torch's DataLoader, with batches prefetched in a thread and copied to the GPU on a side stream.

Data flow of one epoch::

    torch iterator (workers, pin-memory thread)
        └─► producer thread (background.py): next(batch) ─► CudaCopier.send on the side stream (device.py)
              └─► bounded queue ─► consumer: CudaCopier.receive (wait event, record_stream) ─► training loop

The loader is made of parts: ``__init__`` checks the arguments and makes what torch's ``__init__`` gets in place
of the user's (arguments.py, default_sampler.py, autotune.py's "auto" placeholders), then one frozen plan of
what the loader does (plan.py); each ``iter()`` wires an epoch from it (epoch.py: torch_iter.py's iterator,
prefetch_iterator.py's producer thread and delivery). What lasts across epochs is in two owned objects: the
resume cursor (resume.py) and the runtime (runtime.py: the stage clock's totals, the copier, ...). Every use of
torch's private internals goes through ``fastloader.torch_internals``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from fastloader.loader.arguments import (
    advise_workers,
    check_extras,
    check_ledger,
    check_ray,
    collate_for,
    dataset_for_decode,
)
from fastloader.loader.autotune import Auto, provisional, tune
from fastloader.loader.default_sampler import choose_sampler, rebuilt_with
from fastloader.loader.device import DeviceLike, resolve_device
from fastloader.loader.epoch import open_epoch
from fastloader.loader.normalize import NormalizeSpec
from fastloader.loader.plain_prepare import read_prepared_flag, write_prepared_flag
from fastloader.loader.plan import PLANNED, LoaderPlan
from fastloader.loader.prefetch_iterator import PrefetchIterator
from fastloader.loader.report import loader_stats
from fastloader.loader.resume import ResumeCursor
from fastloader.loader.runtime import LoaderRuntime
from fastloader.loader.stage_stats import StageStats
from fastloader.loader.torch_iter import make_iterator
from fastloader.loader.workers import check_worker_method
from fastloader.loader.workers.ray_options import RayWorkers, ray_workers
from fastloader.torch_internals import drop_persistent_iterator, persistent_iterator

T_co = TypeVar("T_co", covariant=True)


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
        random_flip: probability of flipping each image horizontally, on the device; drawn from a
            generator of the loader's own, seeded each epoch from torch's worker seed (so
            ``torch.manual_seed`` or ``generator`` make it reproducible), never from the training loop's;
            with ``seed=``, from (seed, epoch, sample index).
        decode_on: "cuda" decodes JPEGs with nvJPEG in this process, on the side stream (through
            torchcodec when installed, else torchvision: ``stats()["gpu_decoder"]`` says which); the
            dataset (a fastloader dataset with a ``fastloader.transforms`` transform) then sends
            encoded bytes and crop plans. Without CUDA it falls back to "cpu" with a warning. The
            dataset's error policy applies to images no decoder can read; fallbacks to the CPU are
            counted in ``stats()["gpu_decode"]`` (see ``fastloader.image.gpu_decode``).
        distributed: split a map-style dataset over the ranks (a ``fastloader.samplers.DistributedSampler``,
            a subclass of torch's, with ``shuffle``, ``seed`` and ``drop_last``) when neither ``sampler``
            nor ``batch_sampler`` is given. None (default): only when ``local_rank`` is given and more
            than one rank runs (never under an initialised accelerate, which shards by itself); frameworks
            that split the data themselves then see torch's behaviour. See ``fastloader.loader.default_sampler``.
        num_workers: torch's, or ``"auto"``: measured at the first ``iter()`` on this pipeline, raising workers
            within the cores this rank may use and keeping the knee (``fastloader.loader.autotune``; the
            choice is logged and in ``stats()["autotune"]``). ``prefetch_factor="auto"`` likewise.
        seed: orders are a function of (seed, epoch), from numpy, and each sample's random draws (fastloader's
            transforms, ``random_flip``, the global generators a transform of yours draws from) a function of
            (seed, epoch, sample index), whichever worker makes it (``fastloader.sample_seeds``): the same
            pixels at any ``num_workers``. None keeps torch's orders and draws exactly (the same batches as
            torch's loader for the same ``torch.manual_seed`` or ``generator``), still resumable by
            ``load_state_dict``.
        stall_warning: seconds without a batch after which the ``fastloader`` logger warns with the
            Python stacks of every worker and of this process, naming the worker that holds the awaited
            batch (repeated every ``stall_warning`` seconds while the wait lasts); None: never. ``timeout``
            still raises as in torch.
        report_every: log the verdict (is training waiting for data, the slowest stage, what to do) on
            the ``fastloader`` logger every N batches; None (default): never. ``stats()`` has it any time.
        snapshot_every_n_steps: torchdata StatefulDataLoader's argument, accepted for drop-in use (an int
            >= 0 or None) and otherwise without effect: each worker's state travels with every batch it
            makes (the dataset's own ``state_dict`` and the worker's random generators, a few KB), so
            ``state_dict()`` is exact after any batch.
        ledger: a path: record, per rank and epoch, the key of every sample the training loop receives, in order,
            with the CRC32C of its encoded bytes as the worker read them (fastloader's datasets), to compare
            two runs with ``fastloader ledger diff`` (a resumed run against an uninterrupted one). ``{rank}`` in
            the path is replaced by the rank; without it, several ranks write ``PATH.rank{r}``. A resumed run
            appends to the same file. See ``fastloader.loader.ledger_writer`` and ``fastloader.ledger``.
        worker_method: where the batches are made: ``"process"`` (default), torch's worker processes;
            ``"thread"``, threads of the training process, with torch's thread-worker semantics
            (``get_worker_info()`` per thread, ``worker_method="thread"``, its ``rng`` for
            ``torch.random.thread_safe_generator()``); ``multiprocessing_context`` must then be None. A thread
            cannot survive a crash of its sample (SIGKILL, segfault): it is the training process.
            ``"subprocess"``: those threads, the collate and the batch ring's writes in one child process
            (started by ``multiprocessing_context``, default ``"forkserver"``); only finished batches cross into
            the training process, for launch-bound GPU training. A killed child raises
            ``fastloader.errors.PipelineLost``. ``"ray"``: ``num_workers`` Ray actors placed across the Ray
            cluster this process is connected to (``ray.init`` by you, else ``address="auto"``), each making whole
            batches, every sample exactly once and in order, with the state of ``"process"``
            (``pip install fastloader[ray]``); a :class:`~fastloader.loader.RayWorkers` to set where and how. See
            ``fastloader.loader.workers`` and the guide, "Batches from other machines".

    Epochs advance by themselves: each ``iter()`` after the first calls ``set_epoch(previous + 1)``
    unless ``set_epoch`` was called since the last ``iter()`` (an explicit epoch wins).
    ``state_dict()`` / ``load_state_dict()`` resume mid-epoch; see ``fastloader.loader.resume``.
    The extras and ``local_rank`` are read once, in ``__init__``: setting one afterwards raises ValueError,
    as torch's loader does for ``batch_size`` or ``sampler``.
    """

    def __init__(
        self,
        dataset: Dataset[T_co],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: Sampler[list[Any]] | Iterable[list[Any]] | None = None,
        num_workers: int | str = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | str | None = None,
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
        report_every: int | None = None,
        stall_warning: float | None = 300.0,
        snapshot_every_n_steps: int | None = 1,
        ledger: str | os.PathLike[str] | None = None,
        worker_method: str | RayWorkers = "process",
    ) -> None:
        check_worker_method(worker_method, multiprocessing_context)
        ray = ray_workers(worker_method)
        if ray is not None:
            check_ray(dataset, num_workers, batch_size, batch_sampler, worker_init_fn, decode_on, ledger)
        check_extras(max_prefetch, decode_on, distributed, seed, report_every, stall_warning, snapshot_every_n_steps)
        check_ledger(ledger)
        num_workers, prefetch_factor = provisional(num_workers, prefetch_factor)
        ours = choose_sampler(
            dataset, shuffle, sampler, batch_sampler, drop_last, distributed, local_rank, seed, generator
        )
        normalize_spec = NormalizeSpec.create(normalize, normalize_dtype, channels_last, random_flip)
        target = resolve_device(local_rank, device)
        dataset, gpu_decode = dataset_for_decode(dataset, decode_on, target)
        super().__init__(
            dataset,
            batch_size,
            None if ours is not None or rebuilt_with(shuffle, sampler) else shuffle,  # torch: no shuffle with a sampler
            ours if ours is not None else sampler,
            batch_sampler,
            num_workers,
            collate_for(collate_fn, batch_size, batch_sampler, normalize_spec, target),
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
        # Every argument under its own name (torch keeps its own): Lightning and accelerate read them.
        self.shuffle = shuffle
        self.local_rank = local_rank
        self.device = target
        self.max_prefetch = max_prefetch
        self.non_blocking = non_blocking
        self.normalize = normalize
        self.normalize_dtype = normalize_dtype
        self.channels_last = channels_last
        self.random_flip = random_flip
        self.decode_on = decode_on
        if ray is None:
            advise_workers(num_workers)  # Ray's actors run on the cluster's cores, not this rank's
        self.distributed = distributed
        self.seed = seed
        self.report_every = report_every
        self.stall_warning = stall_warning
        self.snapshot_every_n_steps = snapshot_every_n_steps
        self.ledger = ledger
        self.worker_method = worker_method
        self._plan = LoaderPlan(
            device=target,
            max_prefetch=max_prefetch,
            non_blocking=non_blocking,
            normalize=normalize_spec,
            gpu_decode=gpu_decode,
            stall_warning=stall_warning,
            report_every=report_every,
            autotune=isinstance(num_workers, Auto) or isinstance(prefetch_factor, Auto),
            user_batch_sampler=batch_sampler is not None,
            ledger=None if ledger is None else os.fspath(ledger),
            worker_method="ray" if ray is not None else str(worker_method),
            ray=ray,
        )
        self._cursor = ResumeCursor(self)  # the epoch and resume state (fastloader.loader.resume)
        self._runtime = LoaderRuntime()  # what the epochs make and keep (fastloader.loader.runtime)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in PLANNED and "_plan" in self.__dict__:
            raise ValueError(
                f"{name} attribute should not be set after {type(self).__name__} is initialized"
                " (the loader's plan is made of it: build another loader)"
            )
        super().__setattr__(name, value)

    @property
    def _is_accelerate_prepared(self) -> bool:
        """Read by accelerate's ``accelerator.prepare`` before it rebuilds the loader: warns that the
        DataLoaderX will not run (``fastloader.loader.plain_prepare``)."""
        return read_prepared_flag(self)

    @_is_accelerate_prepared.setter
    def _is_accelerate_prepared(self, value: bool) -> None:
        write_prepared_flag(self, value)

    def __iter__(self) -> PrefetchIterator:  # type: ignore[override]
        if self._plan.autotune and self._runtime.autotune is None:
            self._measure_auto()
        return open_epoch(self)  # fastloader.loader.epoch

    def _measure_auto(self) -> None:
        """Measure ``"auto"`` num_workers / prefetch_factor now (``fastloader.loader.autotune``). The measured
        numbers take the place of the ``"auto"`` placeholders, where torch, Lightning and accelerate read them."""
        choice = tune(self)
        if choice is not None:
            self.num_workers, self.prefetch_factor = choice.num_workers, choice.prefetch_factor
            self._runtime.autotune = choice

    def _get_iterator(self) -> Any:
        return make_iterator(self)  # torch's, from a view of this loader (fastloader.loader.torch_iter)

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
        self._cursor.set_epoch(epoch)

    def stats(self) -> dict[str, Any]:
        """Where the loader is and where its time goes.

        * ``epoch``, ``batches_yielded`` (this epoch) and the bad samples its dataset met in every worker
          process (``dataset.set_error_policy``: ``bad_samples``, ``by_reason``, ...);
        * since the loader was made: ``batches``, ``images``, ``images_per_s`` (the training loop's rate),
          ``wait_fraction`` (its share of time waiting for data), ``stages`` (each stage's total seconds,
          ms per image, per-batch p50 / p90 / p99 and where it runs: see ``fastloader.loader.stage_clock``),
          ``queues`` (mean batches ready ahead of the loop and in the workers' queue), ``timeline``;
        * ``verdict``: the grade, the slowest stage and the next step (``fastloader.loader.verdict``);
        * ``batch_ring``: the reused batch buffers (``slots``, ``bytes``, ``reused``: batches written into a slot,
          ``fresh``: batches that found every slot in use, ``in_use``, ``pinned``), None without a ring
          (``fastloader.image.batch_ring``);
        * ``gpu_decode``: with ``decode_on="cuda"``, what the GPU decoder did (images on the GPU and the CPU,
          retried batches, bad images), and ``gpu_decoder`` the JPEG decoder it runs ("torchcodec 0.17.0" or
          "torchvision 0.29.1"); both None otherwise (``fastloader.image.gpu_decode``).
        """
        return loader_stats(self)

    @property
    def _stage_stats(self) -> StageStats:
        return self._runtime.stats  # the stage clock's totals (read by fastloader.doctor)

    def state_dict(self) -> dict[str, Any]:
        """Where the training loop is, as plain data (JSON-serializable when the dataset's and sampler's own
        states are); see ``fastloader.loader.resume`` and ``fastloader.loader.resume_state``."""
        return self._cursor.state()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state_dict()``'s output; applies to the next ``iter()`` (persistent workers are
        restarted for it). ValueError for a foreign state or one this loader cannot resume exactly (a
        ``RandomSampler`` without a generator: use ``shuffle=True``, a generator or ``seed=``; another
        ``batch_size`` where the rest of the epoch would not be the same samples). Another ``batch_size``
        resumes at the sample reached."""
        self._cursor.load(state)
        # The iteration in progress is over (torchdata's convention): its producer thread must not go on
        # fetching (with num_workers=0 its dataset may draw from the random state the load puts back).
        self._runtime.close_live()
        if persistent_iterator(self) is not None:
            drop_persistent_iterator(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._cursor.bind(self)
