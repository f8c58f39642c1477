"""Handles a process opens for itself: one, lazily (:class:`ProcessLocal`), or many, bounded (:class:`OpenHandles`).

Handles (files, memory maps, LMDB environments) must never cross a fork: two processes sharing one
file offset or LMDB environment corrupt each other's reads. So every source opens them in the process
that reads, on its first read, and a pickled source (for a spawned worker) carries none.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")
H = TypeVar("H")


class ProcessLocal(Generic[T]):
    """A handle (file, mmap, LMDB environment) opened lazily, once per process.

    The handle is reopened whenever the pid changes, and dropped when the owner is pickled for a
    spawned worker.
    """

    def __init__(self, opener: Callable[[], T]) -> None:
        self._opener = opener
        self._pid: int | None = None
        self._value: T | None = None

    def get(self) -> T:
        pid = os.getpid()
        if self._value is None or self._pid != pid:
            self._value = self._opener()
            self._pid = pid
        return self._value

    def __getstate__(self) -> dict[str, Any]:
        return {"_opener": self._opener, "_pid": None, "_value": None}


class OpenHandles(Generic[H]):
    """At most ``limit`` handles open at once, one per key (a shard, a file), the least recently used
    closed first: a dataset of thousands of shards must not exhaust a worker's descriptors (often 1024).

    ``opener(key)`` opens the handle of ``key`` when it is asked for and not open; ``closer(handle)``
    closes one that is evicted (or every one, :meth:`close_all`). Not shared between processes: hold
    it in a :class:`ProcessLocal`.
    """

    def __init__(self, opener: Callable[[int], H], closer: Callable[[H], None], limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1 open handle, got {limit!r}")
        self._open, self._close, self._limit = opener, closer, limit
        self._handles: OrderedDict[int, H] = OrderedDict()

    def get(self, key: int) -> H:
        """The open handle of ``key``, opened now when it is not (closing the least recently used one)."""
        handle = self._handles.get(key)
        if handle is not None:
            self._handles.move_to_end(key)
            return handle
        handle = self._handles[key] = self._open(key)
        if len(self._handles) > self._limit:
            self._close(self._handles.popitem(last=False)[1])
        return handle

    def __len__(self) -> int:
        return len(self._handles)

    def close_all(self) -> None:
        """Close every open handle (an error closing one does not keep the others open)."""
        while self._handles:
            try:
                self._close(self._handles.popitem(last=False)[1])
            except OSError:
                pass
