"""With ``seed=``, every random draw of a sample is a function of (seed, epoch, sample index).

Then a sample's pixels do not depend on which worker made it, how many workers there are or how they run
(processes, threads, a subprocess): two runs with the same ``seed=`` give the same batches, and a resume at
another ``num_workers`` gives the uninterrupted run's pixels. Without ``seed=`` nothing here runs: the draws
are torch's loader's (each worker's generators, seeded from the workers' base seed).

Each sample gets a 63-bit key, :func:`sample_key` (a splitmix64 chain over seed, epoch, index and a stream
number, so different uses of one sample draw independently), from which:

* fastloader's transforms draw their crop plans (:func:`generator`: a ``torch.Generator`` of this thread,
  seeded from the sample's key, handed to ``FusedTransform.plan``), image by image in a batch too;
* ``random_flip`` draws one uniform number per sample (:func:`flip_draws`), wherever the flip is applied;
* user transforms that draw from the global generators (torchvision's, numpy's, ``random``'s) find them
  seeded for the sample (:func:`seed_sample`) before the dataset is asked for it.

The loader says which fetch runs in this thread, with which (seed, epoch) and indices (:func:`begin` /
:func:`end`, called by ``fastloader.loader`` where a fetch starts and ends); the datasets read it with
:func:`current`. Thread-local: worker threads fetch side by side in one process.

For other worker modes: before each sample's fetch, call ``seed_sample(seed, epoch, index)`` in the thread
that fetches it. In one of torch's thread workers (``WorkerInfo.worker_method == "thread"``) it seeds that
thread's own generators (``WorkerInfo.rng``), else the process's global ones. It costs 20-60 µs per sample
on a loaded 2-core x86 machine, under 2% of a train-pipeline image (``benchmarks/bench_sample_seeds.py``).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
# Streams: independent draws of one sample.
TRANSFORMS, GLOBALS, FLIP = 0, 1, 2


def _mix(value: int) -> int:
    """splitmix64's finalizer: a bijection of 64-bit integers whose output bits each depend on every input bit."""
    value = (value + _GAMMA) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def sample_key(seed: int, epoch: int, index: int, stream: int = TRANSFORMS) -> int:
    """The key of sample ``index`` in ``epoch`` of a loader with ``seed=seed``: a 63-bit integer, the same in
    every process, thread and mode. ``stream`` separates the draws of one sample (transforms, the global
    generators, ``random_flip``)."""
    key = _mix(seed & _MASK)
    for value in (epoch, index, stream):
        key = _mix(key ^ (value & _MASK))
    return key >> 1


def sample_keys(seed: int, epoch: int, indices: Sequence[int], stream: int) -> np.ndarray:
    """:func:`sample_key` of each of ``indices`` (uint64; the same values, vectorized for a batch)."""
    key = np.full(len(indices), _mix(seed & _MASK), dtype=np.uint64)
    for value in (np.uint64(epoch & _MASK), np.asarray(indices, dtype=np.int64).view(np.uint64), np.uint64(stream)):
        key = _mix_array(key ^ value)
    return key >> np.uint64(1)


def _mix_array(value: np.ndarray) -> np.ndarray:
    # uint64 arithmetic wraps modulo 2**64, as _mix masks.
    value = value + np.uint64(_GAMMA)
    value = (value ^ (value >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    value = (value ^ (value >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return value ^ (value >> np.uint64(31))


@dataclass(frozen=True)
class Fetch:
    """The fetch running in this thread under ``seed=``: the loader's seed, the epoch and the batch's indices
    (as the sampler gave them: the flips follow them, one per sample)."""

    seed: int
    epoch: int
    indices: Any

    def key(self, index: int, stream: int = TRANSFORMS) -> int:
        return sample_key(self.seed, self.epoch, int(index), stream)


class _Local(threading.local):
    def __init__(self) -> None:
        self.fetch: Fetch | None = None
        self.generator: torch.Generator | None = None


_LOCAL = _Local()


def begin(seed: int | None, epoch: int, indices: Any) -> None:
    """A fetch of ``indices`` starts in this thread (``seed`` None: no ``seed=``, nothing is drawn per sample)."""
    _LOCAL.fetch = None if seed is None else Fetch(seed, epoch, indices)


def end() -> None:
    """The fetch of this thread is over."""
    _LOCAL.fetch = None


def current() -> Fetch | None:
    """The fetch running in this thread under ``seed=``, or None."""
    return _LOCAL.fetch


def generator(index: int) -> torch.Generator | None:
    """The generator sample ``index``'s fastloader transforms draw from: this thread's, seeded from the sample's
    key; None without ``seed=`` (the worker's generator, as torch's loader: ``FusedTransform.plan``). Valid until
    the next call."""
    fetch = _LOCAL.fetch
    if fetch is None:
        return None
    own = _LOCAL.generator
    if own is None:
        own = _LOCAL.generator = torch.Generator()
    return own.manual_seed(fetch.key(index))


def seed_sample(seed: int, epoch: int, index: int) -> None:
    """Seed the generators user transforms draw from, for sample ``index`` of ``epoch``: in a thread worker of
    torch's, the thread's own (``WorkerInfo.rng``); else the process's torch (CPU), numpy (legacy global) and
    ``random`` generators. Call it in the thread that fetches the sample, right before the dataset is asked."""
    key = sample_key(seed, epoch, index, GLOBALS)
    words = [key & 0xFFFFFFFF, key >> 32]
    info = get_worker_info()
    own = getattr(info, "rng", None) if getattr(info, "worker_method", None) == "thread" else None
    if own is not None:
        own.random_generator.seed(key)
        own.torch_generator.manual_seed(key)
        _seed_numpy(own.numpy_generator, words)
        return
    random.seed(key)
    torch.default_generator.manual_seed(key)  # not torch.manual_seed: CUDA's generators are the training loop's
    np.random.seed(words)


def _seed_numpy(numpy_generator: Any, words: list[int]) -> None:
    if isinstance(numpy_generator, np.random.RandomState):
        numpy_generator.seed(words)
    elif isinstance(numpy_generator, np.random.Generator):
        bits = numpy_generator.bit_generator
        bits.state = type(bits)(np.random.SeedSequence(words)).state


def seed_for(index: int) -> None:
    """:func:`seed_sample` for sample ``index`` of this thread's fetch; nothing without ``seed=``."""
    fetch = _LOCAL.fetch
    if fetch is not None:
        seed_sample(fetch.seed, fetch.epoch, int(index))


def flip_draws() -> np.ndarray | None:
    """One uniform number in [0, 1) per sample of this thread's fetch, from its key (``random_flip`` flips
    where it is below ``p``); None without ``seed=`` or when the fetch's indices are not a list of indices."""
    fetch = _LOCAL.fetch
    if fetch is None:
        return None
    try:
        indices = [int(index) for index in fetch.indices]
    except TypeError:  # one index (batch_size=None) or something else
        return None
    keys = sample_keys(fetch.seed, fetch.epoch, indices, FLIP)
    return (keys >> np.uint64(10)).astype(np.float64) * 2.0**-53
