"""A process's global random generators (torch's, Python's ``random``, numpy's legacy one), taken and put back.

Every state the interpreter can hold round-trips, byte for byte: Python's ``random`` caches the second value
of each ``random.gauss()`` pair in its state (timm's RandAugment with ``mstd`` draws one per image, so half
the time a worker's state holds a float there), and numpy's legacy generator caches a normal deviate the
same way (``has_gauss`` / ``cached_gaussian``). A state is bytes and numbers only: nothing to unpickle
(``fastloader.loader.resume_state`` writes it as base64 and JSON numbers).
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import torch

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


def capture() -> RngState:
    """This process's generators now."""
    version, words, gauss = random.getstate()
    if version != _RANDOM_VERSION:  # a Python whose Mersenne Twister state is laid out otherwise
        raise ValueError(f"random.getstate() has version {version}; fastloader knows version {_RANDOM_VERSION}")
    _name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return RngState(
        torch=torch.get_rng_state().numpy().tobytes(),
        random_words=np.asarray(words, dtype=np.uint32).tobytes(),
        random_gauss=None if gauss is None else float(gauss),
        numpy_keys=np.asarray(keys, dtype=np.uint32).tobytes(),
        numpy_pos=int(pos),
        numpy_has_gauss=int(has_gauss),
        numpy_cached=float(cached),
    )


def restore(state: RngState) -> None:
    """Put this process's generators back to ``state``."""
    torch.set_rng_state(torch.frombuffer(bytearray(state.torch), dtype=torch.uint8))
    words = tuple(int(word) for word in np.frombuffer(state.random_words, dtype=np.uint32))
    random.setstate((_RANDOM_VERSION, words, state.random_gauss))
    keys = np.frombuffer(state.numpy_keys, dtype=np.uint32).copy()
    np.random.set_state(("MT19937", keys, state.numpy_pos, state.numpy_has_gauss, state.numpy_cached))
