"""DataLoaderX: torch's DataLoader, with batches prefetched in a thread and copied to the GPU on a side stream.

Data flow of one epoch::

    torch iterator (workers, pin-memory thread)
        └─► producer thread (background.py): next(batch) ─► CudaCopier.send on the side stream (device.py)
              └─► bounded queue ─► consumer: CudaCopier.receive (wait event, record_stream) ─► training loop
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_convert

from fastloader.image.gpu_decode import GpuDecoder
from fastloader.loader.autotune import Auto, Choice, candidates, choose
from fastloader.loader.background import BackgroundGenerator
from fastloader.loader.default_sampler import choose_sampler, rebuilt_with
from fastloader.loader.device import CudaCopier, DeviceLike, on_device, resolve_device
from fastloader.loader.epoch_progress import Progress
from fastloader.loader.nested import iter_tensors
from fastloader.loader.normalize import Normalizer, NormalizeSpec, NormalizingCollate
from fastloader.loader.resume import ResumeCursor
from fastloader.loader.stage_clock import TimedBatch
from fastloader.loader.stage_stats import Mark, StageStats
from fastloader.loader.torch_iter import make_iterator
from fastloader.loader.verdict import Setting, judge
from fastloader.loader.watchdog import StackDir, report_stall
from fastloader.loader.worker_state import Delivery
from fastloader.samplers._epoch import check_nonnegative_int
from fastloader.timing import labelled

T_co = TypeVar("T_co", covariant=True)
_QUICK_JOIN_S = 0.5  # how long the training loop waits for a finished producer thread to end
log = logging.getLogger("fastloader")


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
            ``torch.manual_seed`` or ``generator`` make it reproducible), never from the training loop's.
        decode_on: "cuda" decodes JPEGs with nvJPEG in this process, on the side stream; the
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
        seed: the shuffle seed; orders are a function of (seed, epoch), from numpy. None keeps torch's
            orders exactly (the same batches as torch's loader for the same ``torch.manual_seed`` or
            ``generator``), still resumable by ``load_state_dict``.
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

    Epochs advance by themselves: each ``iter()`` after the first calls ``set_epoch(previous + 1)``
    unless ``set_epoch`` was called since the last ``iter()`` (an explicit epoch wins).
    ``state_dict()`` / ``load_state_dict()`` resume mid-epoch; see ``fastloader.loader.resume``.
    """

    _stage_clock = True  # the loader's side of the stage clock; off only to measure its cost (benchmarks)

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
    ) -> None:
        if isinstance(max_prefetch, bool) or not isinstance(max_prefetch, int) or max_prefetch < 1:
            raise ValueError(f"max_prefetch must be an int >= 1, got {max_prefetch!r}")
        if decode_on not in ("cpu", "cuda"):
            raise ValueError(f"decode_on must be 'cpu' or 'cuda', got {decode_on!r}")
        if distributed is not None and not isinstance(distributed, bool):
            raise ValueError(f"distributed must be True, False or None, got {distributed!r}")
        if seed is not None:
            check_nonnegative_int(seed, "seed")
        num_workers, prefetch_factor = _provisional(num_workers, prefetch_factor)
        if report_every is not None and (
            isinstance(report_every, bool) or not isinstance(report_every, int) or report_every < 1
        ):
            raise ValueError(f"report_every must be None or an int >= 1, got {report_every!r}")
        if stall_warning is not None and (isinstance(stall_warning, bool) or not stall_warning > 0):
            raise ValueError(f"stall_warning must be None or > 0 seconds, got {stall_warning!r}")
        if snapshot_every_n_steps is not None:
            check_nonnegative_int(snapshot_every_n_steps, "snapshot_every_n_steps")
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
        self.report_every = report_every
        self._autotune: Choice | None = None
        self.stall_warning = stall_warning
        self.snapshot_every_n_steps = snapshot_every_n_steps
        self._stack_dir: StackDir | None = None  # where workers dump their stacks (watchdog), made on demand
        self._stage_stats = StageStats()
        self._report_mark: Mark | None = None  # where the last report_every verdict ended
        self._cpu_meter: Any = None  # a CpuMeter from the first iter(): how busy the cores were
        self._user_batch_sampler = batch_sampler is not None
        self._cursor = ResumeCursor(self)  # the epoch and resume state (fastloader.loader.resume)
        self._normalize_spec = normalize_spec
        self._gpu_decode = gpu_decode
        self._copier: CudaCopier | None = None  # one side stream per loader, made on the first iter()
        self._decoder: GpuDecoder | None = None  # decode_on="cuda": made with the copier
        self._live: weakref.ref[_PrefetchIterator] | None = None

    def __iter__(self) -> _PrefetchIterator:  # type: ignore[override]
        if isinstance(self.num_workers, Auto) or isinstance(self.prefetch_factor, Auto):
            self._tune()
        cursor = self._cursor
        plan = cursor.next_plan()
        persistent = self.persistent_workers and self.num_workers > 0
        if persistent:
            # Torch hands out one shared iterator and resets it here: the previous epoch's producer
            # thread must stop pulling from it first.
            previous = self._live() if self._live is not None else None
            if previous is not None:
                previous.close()
            if self._iterator is not None and not cursor.reuses_workers(plan):
                self._drop_workers()  # their processes hold another run's state: start them anew
        fresh = not cursor.reuses_workers(plan)
        progress = cursor.begin(plan, fresh)
        if self._cpu_meter is None:
            from fastloader.loader.cpu_use import CpuMeter

            self._cpu_meter = CpuMeter()
        if self.stall_warning is not None and self.num_workers > 0 and self._stack_dir is None:
            self._stack_dir = StackDir()
        with on_device(self.device):  # torch's pin-memory thread pins for the current device
            source = super().__iter__()
        cursor.started_workers(progress, int(getattr(source, "_base_seed", 0)), fresh)
        copier = self._get_copier()
        self._reseed_flips(_flip_seed(progress.base_seed or 0))
        if self._decoder is not None and self.device.type == "cuda":
            self._decoder.avoid(torch.cuda.current_stream(self.device))  # the training loop's stream
        iterator = _PrefetchIterator(
            source,
            copier,
            self.max_prefetch,
            owns_workers=not persistent,
            progress=progress,
            stats=self._stage_stats,
            report=functools.partial(_report, weakref.ref(self)) if self.report_every else None,
            report_every=self.report_every,
            stall_warning=self.stall_warning,
            stack_dir=self._stack_dir,
            context=functools.partial(on_device, self.device),
        )
        self._live = weakref.ref(iterator)
        return iterator

    def _get_iterator(self) -> Any:
        return make_iterator(self)  # torch's, from a view of this loader (fastloader.loader.torch_iter)

    def _torch_index_sampler(self) -> Any:
        return super()._index_sampler

    def _drop_workers(self) -> None:
        """Shut torch's persistent iterator and its workers down; the next iter() starts new ones."""
        iterator, self._iterator = self._iterator, None
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()

    def _tune(self) -> None:
        """Measure ``"auto"`` num_workers / prefetch_factor now (see ``fastloader.loader.autotune``)."""
        from fastloader import world

        counts = candidates(world.cores_per_rank()) if isinstance(self.num_workers, Auto) else [self.num_workers]
        choice = choose(self, counts, prefetch_auto=isinstance(self.prefetch_factor, Auto))
        self.num_workers, self.prefetch_factor = choice.num_workers, choice.prefetch_factor
        self._autotune = choice

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
            if self._gpu_decode:
                self._decoder = GpuDecoder(self.device, self.dataset, self.collate_fn)
            self._copier = CudaCopier(self.device, self.non_blocking, self._decoder, finish)
        return self._copier

    def _reseed_flips(self, seed: int) -> None:
        """Seed this epoch's ``random_flip`` draws, wherever they are made (see ``fastloader.loader.normalize``)."""
        finish = self._copier.finish if self._copier is not None else None
        if isinstance(finish, Normalizer):
            finish.reseed(seed)
        if isinstance(self.collate_fn, NormalizingCollate):
            self.collate_fn.reseed(seed)

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
        * ``verdict``: the grade, the slowest stage and the next step (``fastloader.loader.verdict``).
        """
        error_stats = getattr(self.dataset, "error_stats", None)
        stats: dict[str, Any] = dict(error_stats()) if callable(error_stats) else {}
        progress = self._cursor.current
        stats["epoch"] = self._cursor.epoch
        stats["batches_yielded"] = progress.batches if progress is not None else 0
        stats["num_workers"] = int(self.num_workers)
        stats["autotune"] = self._autotune.to_dict() if self._autotune is not None else None
        stats["gpu_decode"] = self._decoder.counts.to_dict() if self._decoder is not None else None
        stats.update(self._stage_stats.summary())
        stats["verdict"] = judge(stats, self._setting()).to_dict()
        return stats

    def _setting(self) -> Setting:
        from fastloader import world
        from fastloader.loader.cpu_use import mean

        busy = mean(self._cpu_meter.read()) if self._cpu_meter is not None else None
        source = type(getattr(self.dataset, "source", None)).__name__
        return Setting(
            num_workers=self.num_workers,
            usable_cores=world.cores_per_rank(),
            pin_memory=self.pin_memory,
            to_gpu=self.device.type == "cuda",
            cores_busy=busy,
            small_files=source in ("FolderSource", "FileListSource"),
            gpu_decode=self._decoder.counts.to_dict() if self._decoder is not None else None,
        )

    def state_dict(self) -> dict[str, Any]:
        """Where the training loop is, as plain data (JSON-serializable when the dataset's and sampler's own
        states are); see ``fastloader.loader.resume`` and ``fastloader.loader.resume_state``."""
        return self._cursor.state()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state_dict()``'s output; applies to the next ``iter()`` (persistent workers are
        restarted for it). ValueError for a foreign state or one this loader cannot resume exactly (a
        ``RandomSampler`` without a generator: use ``shuffle=True``, a generator or ``seed=``)."""
        self._cursor.load(state)
        # The iteration in progress is over (torchdata's convention): its producer thread must not go on
        # fetching (with num_workers=0 its dataset may draw from the random state the load puts back).
        live = self._live() if self._live is not None else None
        if live is not None:
            live.close()
        if self._iterator is not None:
            self._drop_workers()

    def __getstate__(self) -> dict[str, Any]:
        # Streams and weak references cannot be pickled or deep-copied; a copy makes its own.
        state = self.__dict__.copy()
        state["_copier"] = None
        state["_decoder"] = None
        state["_live"] = None
        state["_cpu_meter"] = None
        state["_stack_dir"] = None
        state["_report_mark"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._cursor.bind(self)


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
        stats: StageStats | None = None,
        report: Callable[[], None] | None = None,
        report_every: int | None = None,
        stall_warning: float | None = None,
        stack_dir: StackDir | None = None,
        context: Callable[[], Any] | None = None,
    ) -> None:
        self._source = source
        self._progress = progress
        self._reported_length = _take_length_check(source)
        self._copier = copier
        self._stats = stats if stats is not None else StageStats()
        self._report, self._report_every = report, report_every
        self._delivered_at: float | None = None  # when the training loop got the previous batch
        consumer = torch.cuda.current_stream(copier.device) if copier is not None else None
        produced = map(functools.partial(_arrive, copier=copier, consumer=consumer, stats=self._stats), source)
        self._background: BackgroundGenerator[Any] = BackgroundGenerator(
            produced,
            max_prefetch,
            name="fastloader-dataloaderx",
            on_exit=functools.partial(_shutdown_workers, source) if owns_workers else None,
            stall_after=stall_warning,
            on_stall=functools.partial(_stalled, weakref.ref(source), stack_dir) if stall_warning else None,
            context=context,
        )

    def __iter__(self) -> _PrefetchIterator:
        return self

    def __next__(self) -> Any:
        asked = time.perf_counter()
        progress = self._progress
        while True:
            try:
                with labelled("wait"):
                    item, delivery = next(self._background)
            except StopIteration:
                if progress is not None:
                    progress.done = True
                # The producer has handed over its last word; it stops the workers on its own, which
                # may take torch 5 s for a stuck worker: the training loop does not wait for that.
                self._background.close(timeout=_QUICK_JOIN_S)
                raise
            except Exception:
                # An error from a worker / collate / the copy: as with torch's iterator, the next next()
                # continues the epoch (with the next batch: this one counts as received). A traceback kept
                # by the caller must not keep this epoch (its thread and workers) alive: dropping the
                # iterator stops them.
                if progress is not None:
                    progress.failed()
                del self, progress
                raise
            if progress is not None:
                progress.record(delivery)  # here, in the consumer: the producer thread runs ahead
            if delivery is None or not delivery.end:
                break  # (a worker's end of data comes as a batch-less delivery: its state only)
        if self._copier is not None:
            item = self._copier.receive(item)
        self._delivered(item, asked)
        count = progress.batches if progress is not None else 0
        if self._reported_length is not None and count > self._reported_length:
            _warn_past_length(self._source, self._reported_length, count)
        return item

    def _delivered(self, item: Any, asked: float) -> None:
        now = time.perf_counter()
        step = asked - self._delivered_at if self._delivered_at is not None else None
        self._delivered_at = now
        stats = self._stats
        stats.add_delivery(now - asked, step, _batch_size(item), self._background.ready(), _in_workers(self._source))
        every = self._report_every
        if self._report is not None and every and stats.delivered % every == 0:
            self._report()

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


def _arrive(item: Any, copier: CudaCopier | None, consumer: Any, stats: StageStats) -> tuple[Any, Delivery | None]:
    """Producer thread, per batch: unwrap the timed batch, queue its copy to the GPU, record its times;
    the batch goes on with its worker's state (None when it has none)."""
    timing = delivery = None
    if isinstance(item, TimedBatch):
        item, timing, delivery = item.batch, item.timing, item.state
        if delivery is not None and delivery.end:
            return None, delivery
        if timing is not None:
            timing.images = _batch_size(item)  # counted as the training loop counts them
    if copier is not None:
        start = time.perf_counter()
        with labelled("h2d"):
            item = copier.send(item, consumer=consumer)
        if timing is not None:
            timing.h2d = time.perf_counter() - start
    if timing is not None:
        stats.add_batch(timing)
    return item, delivery


def _flip_seed(base: int) -> int:
    """This epoch's ``random_flip`` seed: derived from the workers' base seed (torch's iterator draws it
    from ``generator`` or the global generator, once per epoch, as torch's loader does; a resumed epoch
    has the interrupted one's), so no extra draw shifts the training loop's random stream."""
    return (base * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % 2**63  # another stream than the workers' seeds


def _provisional(num_workers: int | str, prefetch_factor: int | str | None) -> tuple[int, int | None]:
    """``"auto"`` stands in as :class:`Auto` ints until the first ``iter()`` measures: as many workers as
    this rank's cores, torch's default prefetch."""
    from fastloader import world

    if num_workers == "auto" or isinstance(num_workers, Auto):
        num_workers = Auto(world.cores_per_rank())
    elif isinstance(num_workers, str):
        raise ValueError(f"num_workers must be an int or 'auto', got {num_workers!r}")
    if prefetch_factor == "auto" or isinstance(prefetch_factor, Auto):
        if num_workers == 0:
            raise ValueError("prefetch_factor='auto' needs worker processes: num_workers > 0 or 'auto'")
        prefetch_factor = Auto(2)
    elif isinstance(prefetch_factor, str):
        raise ValueError(f"prefetch_factor must be an int, None or 'auto', got {prefetch_factor!r}")
    return num_workers, prefetch_factor


def _stalled(source: weakref.ref[Any], stacks: StackDir | None, waited: float) -> None:
    """The watchdog's alarm, in the waiting training loop (see ``fastloader.loader.watchdog``)."""
    iterator = source()
    if iterator is None:
        return
    try:
        report_stall(iterator, stacks, waited)
    except Exception as error:  # noqa: BLE001 - a failed report must not break the epoch
        log.warning("no batch for %.0f s (and the stall report failed: %r)", waited, error)


def _batch_size(batch: Any) -> int:
    """Images in a delivered batch, for the stage clock: the leading size of its first tensor, the length
    of a list without one, else 1. Never raises: timing must not fail a batch it cannot count (a nested
    tensor has no sizes; a sparse or custom tensor may refuse what a strided one answers)."""
    for tensor in iter_tensors(batch):
        try:
            return int(tensor.size(0)) if tensor.dim() > 0 else 1
        except (RuntimeError, TypeError, ValueError, NotImplementedError):
            return 1
    return len(batch) if isinstance(batch, list) else 1


def _in_workers(source: Any) -> int:
    """Batches done by the workers and not yet taken by the producer thread (torch's result queue)."""
    queue = getattr(source, "_data_queue", None)
    try:
        return int(queue.qsize()) if queue is not None else 0
    except (NotImplementedError, OSError):  # macOS has no sem_getvalue
        return 0


def _report(loader: weakref.ref[DataLoaderX[Any]]) -> None:
    """Log the verdict of the loader's last batches (``report_every``)."""
    owner = loader()
    if owner is None:
        return
    clock = owner._stage_stats
    window = clock.summary(since=owner._report_mark)
    owner._report_mark = clock.mark()
    verdict = judge(window, owner._setting())
    advice = "; ".join(verdict.advice)
    rate = window["images_per_s"]
    log.info(
        "%s (%s images/s over the last %d batches)%s",
        verdict.summary,
        f"{rate:.0f}" if rate else "?",
        window["batches"],
        f" -> {advice}" if advice else "",
    )


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
