"""Each worker's results through a pipe of its own, read whole messages at a time without ever blocking on a part.

torch's workers all write into one ``multiprocessing.Queue``: one pipe, under one lock shared by every process. A
worker killed while it writes (the OOM killer's usual victim: when training is slower than loading, a worker is
always blocked there) keeps that lock forever, and every other worker blocks on it; the reader, told by ``poll``
that a message is there, waits for the rest of a message that never comes, past any ``timeout=``.

Where dead workers are restarted (``fastloader.loader.worker_restart``) each worker writes instead into a pipe
only it writes to (no lock: one writer), each message as a frame (its length, then its pickle). The loader's
process reads every pipe with ``multiprocessing.connection.wait`` and non-blocking reads, and hands out a result
only once its frame is whole: a message a dead worker left half written is dropped with its pipe, never waited
for. :class:`ResultReader` takes the place of torch's result queue (its ``get``, ``put``, ``qsize``), for the
pin-memory thread too, which reads it.

:meth:`ResultReader.drain` is what the restart protocol's marker rests on: once a worker is dead nothing more
comes into its pipe, so what is in it is everything it wrote; its whole frames come out, then the marker.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing
import os
import queue
import struct
import threading
import time
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler
from typing import Any

log = logging.getLogger("fastloader")

_HEADER = struct.Struct("!Q")  # a frame: the pickle's length, then the pickle
_READ = 1 << 20  # the most read from one pipe at a time (a pipe holds 64 KiB unless resized)


def result_pipe() -> tuple[Connection, Connection]:
    """A new (read end, write end) for one worker's results."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    return reader, writer


class ResultWriter:
    """A worker's side: ``put`` takes the place of its result queue's (``torch_internals.send_results_with``).
    It blocks only on its own pipe, holding no lock another process waits for. (Should the loader's process die,
    the write fails: only that process, and workers it started later, which exit when it is gone, hold the
    pipe's read end.)"""

    def __init__(self, writer: Connection) -> None:
        self._writer = writer  # the fd lives as long as the connection

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        payload = ForkingPickler.dumps(obj)
        data = memoryview(_HEADER.pack(len(payload)) + payload)
        fd = self._writer.fileno()
        while data:
            data = data[os.write(fd, data) :]


class _Pipe:
    """One worker's read end and the bytes read from it that make no whole frame yet."""

    def __init__(self, reader: Connection) -> None:
        self.reader = reader
        os.set_blocking(reader.fileno(), False)
        self.buffer = bytearray()
        self.ended = False  # every write end is closed

    def read(self, frames: collections.deque[Any]) -> bool:
        """Read what is there now (once), append the whole frames to ``frames``; False if nothing was there."""
        try:
            chunk = os.read(self.reader.fileno(), _READ)
        except BlockingIOError:
            return False
        if not chunk:
            self.ended = True
            return False
        self.buffer += chunk
        while len(self.buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self.buffer)
            end = _HEADER.size + size
            if len(self.buffer) < end:
                break
            frames.append(bytes(self.buffer[_HEADER.size : end]))
            del self.buffer[:end]
        return True


class ResultReader:
    """The results of one iterator's workers, as torch's result queue hands them out.

    ``get`` runs in one thread at a time (torch's pin-memory thread, or the iterator's); ``put``, :meth:`drain`
    and :meth:`replace` come from the iterator's thread and are carried out by the reading thread, in order,
    woken through a pipe of its own."""

    def __init__(self, readers: list[Connection]) -> None:
        self._pipes = {worker: _Pipe(reader) for worker, reader in enumerate(readers)}
        self._ready: collections.deque[Any] = collections.deque()  # frames (bytes) and objects put here
        self._orders: collections.deque[tuple[str, int, Any]] = collections.deque()
        self._wake_reader, self._wake_writer = multiprocessing.Pipe(duplex=False)
        os.set_blocking(self._wake_reader.fileno(), False)
        os.set_blocking(self._wake_writer.fileno(), False)
        self._lock = threading.Lock()  # one reading thread at a time

    # --- the iterator's thread ----------------------------------------------------------------------------

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        """``obj`` comes out after the results read so far (torch wakes its pin-memory thread so)."""
        self._order("put", -1, obj)

    def drain(self, worker: int, marker: Any) -> None:
        """Worker ``worker`` is dead: every whole result in its pipe comes out, then ``marker``; what is left (a
        message it did not finish) is dropped with the pipe."""
        self._order("drain", worker, marker)

    def replace(self, worker: int, reader: Connection) -> None:
        """The new worker ``worker`` writes into the pipe ``reader`` reads."""
        self._order("replace", worker, reader)

    def qsize(self) -> int:
        """Whole results read and not taken yet (results still in the pipes are not counted)."""
        return len(self._ready)

    def _order(self, what: str, worker: int, arg: Any) -> None:
        self._orders.append((what, worker, arg))
        try:
            os.write(self._wake_writer.fileno(), b"\0")
        except BlockingIOError:  # the wake pipe is full: the reader is awake already
            pass

    # --- the reading thread -------------------------------------------------------------------------------

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """The next whole result (unpickled); ``queue.Empty`` when none is whole within ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                self._carry_out()
                if self._ready:
                    item = self._ready.popleft()
                    return ForkingPickler.loads(item) if isinstance(item, bytes) else item
                left = None if deadline is None else deadline - time.monotonic()
                if not block or (left is not None and left <= 0):
                    raise queue.Empty
                live = {pipe.reader: pipe for pipe in self._pipes.values() if not pipe.ended}
                for reader in wait([self._wake_reader, *live], left):
                    if reader is self._wake_reader:
                        _empty(self._wake_reader)
                    else:
                        live[reader].read(self._ready)  # type: ignore[index]

    def _carry_out(self) -> None:
        while self._orders:
            what, worker, arg = self._orders.popleft()
            if what == "put":
                self._ready.append(arg)
            elif what == "replace":
                self._pipes[worker] = _Pipe(arg)
            else:
                pipe = self._pipes.pop(worker)
                while pipe.read(self._ready):  # the worker is dead: what is in its pipe is all it wrote
                    pass
                if pipe.buffer:
                    log.debug("worker %d died writing a result: %d bytes of it dropped", worker, len(pipe.buffer))
                pipe.reader.close()
                self._ready.append(arg)

    def close(self) -> None:
        for pipe in self._pipes.values():
            pipe.reader.close()
        self._pipes.clear()
        self._wake_reader.close()
        self._wake_writer.close()


def _empty(reader: Connection) -> None:
    try:
        while os.read(reader.fileno(), 4096):
            pass
    except BlockingIOError:
        pass
