"""What every fastloader sampler shares: epoch orders as numpy arrays, and a resumable cursor over them.

An epoch's order is a pure function of ``(seed, epoch)`` (and the sampler's sizes), computed in the
main process with numpy's PCG64, never torch's global RNG, so it is the same in every process and for
any ``num_workers``. Orders are numpy arrays (int32 while every index fits, else int64), never Python
lists: a list of 10M ints costs ~360 MB of objects, the int32 array 40 MB.

Resume protocol (``state_dict`` / ``load_state_dict``)::

    state = {"epoch": int, "seed": int, "offset": int}   # offset = indices already yielded this epoch

``load_state_dict`` applies to the next ``iter()``: that iteration starts at ``offset`` of the
epoch's order; later iterations start at 0. ``set_epoch`` with the loaded epoch keeps the pending
offset (a training loop calls ``set_epoch(epoch)`` before each epoch, also right after a resume);
``set_epoch`` with another epoch drops it. The offset counts indices the *sampler* has handed out:
a DataLoader fetches indices ahead of the batches it delivers, so loader-level resume must count the
samples it delivered and slice ``epoch_indices(epoch)`` (or load that count as the offset).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence, Sized
from typing import Any

import numpy as np
from torch.utils.data import Sampler

# Indices are converted to Python ints a chunk at a time: ``tolist()`` is ~10x cheaper per item
# than indexing the array item by item, and a chunk keeps the transient list small (~2.5 MB).
_CHUNK = 1 << 16
_INT32_LIMIT = 1 << 31

Order = np.ndarray | range


def index_dtype(max_length: int) -> type[np.signedinteger[Any]]:
    """The smallest dtype that holds every index of ``range(max_length)``: int32 halves memory."""
    return np.int32 if max_length <= _INT32_LIMIT else np.int64


def length_of(data_source_or_length: Sized | int, name: str = "data_source_or_length") -> int:
    """``len(dataset)``, or the int itself; a clear ValueError for anything else."""
    source: Any = data_source_or_length
    if isinstance(source, bool):
        raise ValueError(f"{name} must be a dataset or an int length, got {source!r}")
    if isinstance(source, (int, np.integer)):
        length = int(source)
    elif isinstance(source, Sized):
        length = len(source)
    else:
        raise ValueError(f"{name} must be a dataset with len() or an int length, got {type(source).__name__}")
    if length < 0:
        raise ValueError(f"{name} must not be negative, got {length}")
    return length


def check_nonnegative_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return int(value)


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """The generator of one epoch: PCG64 seeded by the pair, so epochs are independent streams."""
    return np.random.Generator(np.random.PCG64([seed, epoch]))


def permutation(rng: np.random.Generator, length: int) -> np.ndarray:
    """``rng.permutation(length)`` built in place in the index dtype.

    ``rng.permutation`` would allocate int64 (80 MB at 10M) and a cast would hold both arrays; the
    in-place shuffle draws the same random numbers, so the order is identical whatever the dtype.
    """
    order = np.arange(length, dtype=index_dtype(length))
    rng.shuffle(order)
    return order


@dataclasses.dataclass(frozen=True)
class SamplerState:
    """A sampler's resume point: plain data, so it pickles, serializes to JSON and compares."""

    epoch: int
    seed: int
    offset: int

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> SamplerState:
        if not isinstance(state, Mapping):
            raise ValueError(f"state must be a mapping, got {type(state).__name__}")
        expected = {field.name for field in dataclasses.fields(cls)}
        if set(state) != expected:
            raise ValueError(f"state must have exactly the keys {sorted(expected)}, got {sorted(state)}")
        values = {key: check_nonnegative_int(state[key], f"state[{key!r}]") for key in sorted(expected)}
        return cls(**values)


class _Progress:
    """How far one iteration has got. Each ``iter()`` gets its own, so a stale iterator cannot move
    the state of the current one.

    Items are handed out by ``yield from`` a list iterator (C speed, ~4x less per item than a Python
    loop that counts); the position inside the current chunk is read back from that iterator's
    remaining length when a state is asked for, which is rare.
    """

    def __init__(self, epoch: int, offset: int) -> None:
        self.epoch = epoch
        self._chunk_end = offset
        self._chunk: Iterator[int] | None = None

    @property
    def offset(self) -> int:
        if self._chunk is None:
            return self._chunk_end
        return self._chunk_end - operator.length_hint(self._chunk)

    def enter(self, items: Sequence[int], end: int) -> Iterator[int]:
        self._chunk, self._chunk_end = iter(items), end
        return self._chunk


class EpochCursor:
    """Epoch, seed and resume offset of one sampler; walks an epoch's order from the right offset.

    :class:`EpochSampler` holds one and delegates ``set_epoch``, ``state_dict``, ``load_state_dict``
    and ``__iter__`` to it.
    """

    def __init__(self, seed: int) -> None:
        self.seed = check_nonnegative_int(seed, "seed")
        self.epoch = 0
        self._pending: int | None = None  # loaded offset, for the next iter()
        self._current: _Progress | None = None

    def set_epoch(self, epoch: int) -> None:
        epoch = check_nonnegative_int(epoch, "epoch")
        if epoch != self.epoch:
            self.epoch = epoch
            self._pending = None
            self._current = None

    def state(self) -> SamplerState:
        if self._pending is not None:
            offset = self._pending
        elif self._current is not None and self._current.epoch == self.epoch:
            offset = self._current.offset
        else:
            offset = 0
        return SamplerState(epoch=self.epoch, seed=self.seed, offset=offset)

    def load(self, state: Mapping[str, Any], length: int) -> None:
        loaded = SamplerState.from_dict(state)
        if loaded.offset > length:
            raise ValueError(f"state['offset'] is {loaded.offset}, but an epoch of this sampler has {length} indices")
        self.epoch, self.seed = loaded.epoch, loaded.seed
        self._pending = loaded.offset
        self._current = None

    def iterate(self, order_of: Callable[[int], Order]) -> Iterator[int]:
        """Start one iteration now (epoch and start offset are fixed at ``iter()`` time, as the
        torchdata convention has it); the order itself is computed on the first ``next()``."""
        start = self._pending if self._pending is not None else 0
        self._pending = None
        progress = _Progress(self.epoch, start)
        self._current = progress
        return _walk(order_of, progress)


def _walk(order_of: Callable[[int], Order], progress: _Progress) -> Iterator[int]:
    order = order_of(progress.epoch)
    for begin in range(progress.offset, len(order), _CHUNK):
        chunk = order[begin : begin + _CHUNK]
        items = chunk.tolist() if isinstance(chunk, np.ndarray) else chunk
        yield from progress.enter(items, begin + len(items))


class EpochSampler(Sampler[int]):
    """What every fastloader sampler shares: an :class:`EpochCursor` (epoch, seed, resume offset)
    walking ``epoch_indices(epoch)``, ``num_samples`` items an epoch. Subclasses set ``_cursor`` and
    ``num_samples`` and define ``epoch_indices``."""

    num_samples: int
    _cursor: EpochCursor

    @property
    def seed(self) -> int:
        return self._cursor.seed

    @property
    def epoch(self) -> int:
        return self._cursor.epoch

    def epoch_indices(self, epoch: int) -> np.ndarray:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        self._cursor.set_epoch(epoch)

    def state_dict(self) -> dict[str, int]:
        return self._cursor.state().to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._cursor.load(state, self.num_samples)

    def __iter__(self) -> Iterator[int]:
        return self._cursor.iterate(self.epoch_indices)

    def __len__(self) -> int:
        return self.num_samples
