"""The delivery ledger, written: ``DataLoaderX(ledger=PATH)`` records what each rank's training loop received.

Per rank, one file (``fastloader.formats.ledger``: the layout, and why a crash leaves it readable):
``PATH`` with ``{rank}`` replaced by the rank, else ``PATH`` on a single process and ``PATH.rank{r}`` with
several (the rank and world size of ``fastloader.world``, read when the loader first iterates). Each
iteration writes where it begins (the epoch, and the position it resumes at: a loaded state's samples, or
batches for an IterableDataset); each batch, when the training loop receives it (where the resume cursor
counts it received, ``fastloader.loader.prefetch_iterator``), one block: the sampler's indices of its samples,
the CRC32C of each sample's encoded bytes as the worker read them (fastloader's datasets:
``fastloader.read_digests``, carried by the batch's ``Delivery``), and the key of each index seen for the
first time by this process. A dataset of the user's is recorded by its indices, without digests; an
IterableDataset, which has no indices, by its batches' positions.

What is recorded is what was delivered: under an error policy (``on_error`` "skip" / "replace") the worker
reports each sample of the batch it left out or replaced (``fastloader.read_digests``: the batch's
``Delivery.outcomes``), and the block holds the delivered ids, each substitute's own digest, and the asked
samples apart (a skipped one absent from the ids, a replaced one named where its substitute stands). A
batch without a bad sample costs nothing more.

Reading it back (``fastloader.ledger``) replays the file: an iteration that begins at position n cuts its
epoch's deliveries to the first n before the new ones follow, so a run resumed from a state compares equal
to an uninterrupted one exactly when the resume was exact (what the interrupted process delivered after the
state it resumed from was delivered again, and the training that resumed did not see it twice).
"""

from __future__ import annotations

import operator
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import IterableDataset

from fastloader.formats import ledger as layout
from fastloader.read_digests import SKIPPED
from fastloader.world import World

if TYPE_CHECKING:
    from fastloader.loader.worker_state import Delivery


def ledger_path(path: str, world: World) -> str:
    """This rank's ledger file for the loader's ``ledger=`` path."""
    if "{rank}" in path:
        return path.replace("{rank}", str(world.rank))
    return path if world.world_size <= 1 else f"{path}.rank{world.rank}"


class LedgerWriter:
    """One rank's ledger file, opened for appending at the loader's first ``iter()`` (one per loader)."""

    def __init__(self, path: str, dataset: Any) -> None:
        world = World.current()
        self.path = ledger_path(path, world)
        self.iterable = isinstance(dataset, IterableDataset)
        key = getattr(getattr(dataset, "source", None), "key", None)
        # fastloader's datasets name their samples (a path, an LMDB record): resolved here, in the training
        # process, once per index and process (most sources keep their keys in a memory-mapped index).
        self.key_of: Callable[[int], str] | None = key if callable(key) and not self.iterable else None
        self._seen = _Seen(len(dataset) if self.key_of is not None else 0)
        self._others: dict[Any, int] = {}  # sampler keys that are no ints (a dict-like dataset): their ids
        self._lock = threading.Lock()  # one write at a time (another epoch's producer may still be closing)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)  # as the user named it, e.g. in checkpoints/
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            self._check_or_write_header(world)
        except BaseException:
            os.close(self._fd)
            raise

    def _check_or_write_header(self, world: World) -> None:
        if os.fstat(self._fd).st_size == 0:
            os.write(self._fd, layout.header(world.rank, world.world_size))
            return
        with open(self.path, "rb") as file:
            head = layout.read_header(file.read(layout.HEADER_SIZE), self.path)
        if head.rank != world.rank:
            raise ValueError(f"{self.path}: ledger of rank {head.rank}, but this process is rank {world.rank}")

    def begin(self, epoch: int, start: int) -> None:
        self._write(layout.epoch_record(epoch, start))

    def samples(self, epoch: int, indices: Any, digests: np.ndarray | None, outcomes: np.ndarray | None = None) -> None:
        keys: list[bytes] = []
        ids = self._ids(indices, keys)
        asked = None
        if outcomes is not None and len(outcomes):
            ids, asked = _delivered(ids, outcomes)
        crcs, present = _matched(ids, digests)
        if self.key_of is not None:
            named = ids if asked is None else np.concatenate([ids, asked[0]])
            for id_ in self._seen.new(named):
                keys.append(layout.key_record(id_, self.key_of(id_)))
        keys.append(layout.samples_record(epoch, ids, crcs, present, asked=asked))
        self._write(b"".join(keys))

    def batch(self, epoch: int, position: int) -> None:
        self._write(layout.samples_record(epoch, np.array([position], np.int64), None, None, positions=True))

    def _ids(self, indices: Any, keys: list[bytes]) -> np.ndarray:
        ids = np.asarray(indices)
        if ids.ndim == 1 and ids.dtype.kind in "iu":
            return ids.astype(np.int64, copy=False)
        if ids.ndim == 0 and ids.dtype.kind in "iu":
            return ids.reshape(1).astype(np.int64)
        out = []
        for index in indices if ids.ndim else [indices]:
            try:
                out.append(operator.index(index))
            except TypeError:  # a key of a dict-like dataset: negative ids, named by a key record
                id_ = self._others.get(index)
                if id_ is None:
                    id_ = self._others[index] = -1 - len(self._others)
                    keys.append(layout.key_record(id_, str(index)))
                out.append(id_)
        return np.array(out, np.int64)

    def _write(self, payload: bytes) -> None:
        data = layout.block(payload)
        with self._lock:
            if self._fd < 0:
                return
            written = os.write(self._fd, data)  # one write: a crash loses at most this block
            while written < len(data):  # a short write (signals, full disk) goes on where it stopped
                written += os.write(self._fd, data[written:])

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from __del__
            pass


class _Seen:
    """The indices whose key this process wrote already: one bit each (10M samples: 1.25 MB)."""

    def __init__(self, size: int) -> None:
        self.bits = np.zeros((size + 7) // 8, np.uint8)
        self.size = size
        self.others: set[int] = set()  # outside 0..size (a sampler beyond len(dataset)): rare

    def new(self, ids: np.ndarray) -> list[int]:
        inside = (ids >= 0) & (ids < self.size)
        fresh: list[int] = []
        if inside.any():
            valid = ids[inside]
            byte, bit = valid >> 3, (valid & 7).astype(np.uint8)
            unseen = (self.bits[byte] & (1 << bit)) == 0
            if unseen.any():
                for id_ in dict.fromkeys(valid[unseen].tolist()):  # each once, in order
                    self.bits[id_ >> 3] |= np.uint8(1 << (id_ & 7))
                    fresh.append(id_)
        for id_ in ids[~inside].tolist():
            if id_ >= 0 and id_ not in self.others:
                self.others.add(id_)
                fresh.append(id_)
        return fresh


def _delivered(asked: np.ndarray, outcomes: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """The ids delivered for the batch ``asked`` given the worker's outcomes (``read_digests.OUTCOME``), and
    the samples not delivered as asked with where their substitute is (``-1 - k``: skipped, k delivered before)."""
    given = dict(zip(outcomes["asked"].tolist(), outcomes["given"].tolist()))
    ids: list[int] = []
    missed: list[int] = []
    slots: list[int] = []
    for id_ in asked.tolist():
        instead = given.get(id_, id_)
        if instead != id_:
            missed.append(id_)
            slots.append(-1 - len(ids) if instead == SKIPPED else len(ids))
        if instead != SKIPPED:
            ids.append(instead)
    return np.array(ids, np.int64), (np.array(missed, np.int64), np.array(slots, np.int32))


def _matched(ids: np.ndarray, digests: np.ndarray | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Each delivered sample's CRC from the worker's digests (``fastloader.read_digests.DIGEST``), and which
    have one (None: all). The worker read the batch's indices in order, unless a policy replaced one or a
    cache served one: then by index."""
    if digests is None or len(digests) == 0:
        return None, None
    if len(digests) == len(ids) and np.array_equal(digests["index"], ids):
        return digests["crc"], None
    by_index = dict(zip(digests["index"].tolist(), digests["crc"].tolist()))
    crcs = np.array([by_index.get(id_, 0) for id_ in ids.tolist()], np.uint32)
    present = np.array([id_ in by_index for id_ in ids.tolist()], bool)
    return crcs, (None if present.all() else present)


class EpochLedger:
    """One iteration's side of the ledger: the batches of indices asked for (producer thread, ahead of the
    loop), written when the loop receives each (its thread)."""

    def __init__(self, writer: LedgerWriter, epoch: int, start: int) -> None:
        self.writer = writer
        self.epoch = epoch
        self.position = start  # IterableDataset: the next batch's position in the epoch
        self._asked: dict[int, Any] = {}  # the batch's place in the order -> its indices, until received
        self._lock = threading.Lock()  # the producer thread adds, the training loop's takes
        writer.begin(epoch, start)

    def asked(self, ordinal: int, indices: Any) -> None:
        with self._lock:
            self._asked[ordinal] = indices

    def delivered(self, delivery: Delivery | None) -> None:
        """The training loop received the batch ``delivery`` made (None: untracked, the oldest one asked)."""
        if self.writer.iterable:
            self.writer.batch(self.epoch, self.position)
            self.position += 1
            return
        indices = self._pop(None if delivery is None else delivery.task)
        if indices is not None:
            if delivery is None:
                self.writer.samples(self.epoch, indices, None)
            else:
                self.writer.samples(self.epoch, indices, delivery.digests, delivery.outcomes)

    def failed(self) -> None:
        """A batch raised instead of arriving: nothing of it was delivered."""
        if not self.writer.iterable:
            self._pop(None)

    def _pop(self, task: int | None) -> Any:
        with self._lock:
            asked = self._asked
            if task is None:
                task = next(iter(asked), None)  # in order: the first still awaited
                if task is None:
                    return None
            return asked.pop(task, None)
