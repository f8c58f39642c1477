"""A worker's random generators (torch's, Python's ``random``, numpy's legacy one), taken and put back: a
process's global ones, or in a thread worker the thread's own (``get_worker_info().rng``, seeded as a worker
process's globals: a state moves between the two modes).

Every state the interpreter can hold round-trips, byte for byte: Python's ``random`` caches the second value
of each ``random.gauss()`` pair in its state (timm's RandAugment with ``mstd`` draws one per image, so half
the time a worker's state holds a float there), and numpy's legacy generator caches a normal deviate the
same way (``has_gauss`` / ``cached_gaussian``). A state is bytes and numbers only: nothing to unpickle
(``fastloader.loader.resume_state`` writes it as base64 and JSON numbers).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np
import torch

from fastloader.torch_internals import thread_worker

_RANDOM_VERSION = 3  # random.getstate()'s layout since Python 3.2 (the only one CPython has)
RANDOM_WORDS = 625  # Mersenne Twister's 624 words and its position
NUMPY_KEYS = 624


@dataclasses.dataclass(frozen=True)
class RngState:
    """The three global generators of one process."""

    torch: bytes  # torch.get_rng_state()'s bytes
    random_words: bytes  # random.getstate()[1], 625 uint32
    random_gauss: float | None  # random.getstate()[2]: the cached second value of a random.gauss() pair
    numpy_keys: bytes  # np.random.get_state()'s 624 uint32 keys
    numpy_pos: int
    numpy_has_gauss: int
    numpy_cached: float


def _generators() -> tuple[Any, Any, Any]:
    """This worker's (``random``, torch, numpy) generators: a thread worker's own, else the process's."""
    info = thread_worker()[0]
    if info is None or info.rng is None:
        return random, torch.default_generator, np.random
    return info.rng.random_generator, info.rng.torch_generator, info.rng.numpy_generator


def capture() -> RngState:
    """This worker's generators now."""
    python, torch_generator, numpy = _generators()
    version, words, gauss = python.getstate()
    if version != _RANDOM_VERSION:  # a Python whose Mersenne Twister state is laid out otherwise
        raise ValueError(f"random.getstate() has version {version}; fastloader knows version {_RANDOM_VERSION}")
    _name, keys, pos, has_gauss, cached = numpy.get_state(legacy=True)
    return RngState(
        torch=torch_generator.get_state().numpy().tobytes(),
        random_words=np.asarray(words, dtype=np.uint32).tobytes(),
        random_gauss=None if gauss is None else float(gauss),
        numpy_keys=np.asarray(keys, dtype=np.uint32).tobytes(),
        numpy_pos=int(pos),
        numpy_has_gauss=int(has_gauss),
        numpy_cached=float(cached),
    )


def restore(state: RngState) -> None:
    """Put this worker's generators back to ``state``."""
    python, torch_generator, numpy = _generators()
    torch_generator.set_state(torch.frombuffer(bytearray(state.torch), dtype=torch.uint8))
    words = tuple(int(word) for word in np.frombuffer(state.random_words, dtype=np.uint32))
    python.setstate((_RANDOM_VERSION, words, state.random_gauss))
    keys = np.frombuffer(state.numpy_keys, dtype=np.uint32).copy()
    numpy.set_state(("MT19937", keys, state.numpy_pos, state.numpy_has_gauss, state.numpy_cached))
