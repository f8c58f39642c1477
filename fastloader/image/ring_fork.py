"""Batches held across ``os.fork()``: a slot a forked child can still see is not written again while the child
(or any process it forked without exec) lives.

A batch ring is a ``MAP_SHARED`` mapping, and a forked child inherits it as it is: the child's copy of a held
batch views the very pages the loader's workers write. torch's loader never writes a batch's memory again, so
a child that saves a batch in the background (``multiprocessing.Process(target=save, args=(images,))`` under
fork, or ``os.fork()``) sees it unchanged; so must a DataLoaderX's child.

Copying the held slots into the child's private memory would cost every forked child (each DataLoader worker
of any loader included) a copy of every held batch and that much more memory; instead the parent stops reusing
the slots the child can see, until the child is gone:

* *before the fork* (the forking thread of the loader's process): each ring's book is locked, so no view can
  be made or let go while the process is copied, and asked which slots have views (:meth:`Shared.fork_begins`).
  If any has, a pipe is made (close-on-exec).
* *in the parent*: its write end is closed; each book keeps the slots it named booked with a :class:`ChildGuard`
  over the read end, then unlocks (:meth:`Shared.fork_parent`). A slot so booked goes back to the free ones only
  once the guard reads end-of-file: every process holding the write end has exited or exec'd (an exec'd program
  cannot see the mapping). The book polls its guards when it looks for a free slot, without waiting.
* *in the child*: the books unlock (:meth:`Shared.fork_child`), the inherited read ends are closed and the write
  end stays open for the child's whole life (it passes on to the child's own forks). A DataLoaderX worker,
  which never reads the batches its parent held, lets go of them as it starts (:func:`let_go_inherited`), so a
  loader's own worker start pins nothing for longer than that.

No pipe is made where no slot has a view; nothing runs on the path of a batch.
"""

from __future__ import annotations

import os
import select
import weakref
from collections.abc import Iterable
from typing import Protocol


class ChildGuard:
    """The read end of one fork's pipe: :meth:`gone` once no process that inherited the write end is left."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._gone = False
        self._close = weakref.finalize(self, os.close, fd)

    def gone(self) -> bool:
        """True once every process that holds the write end has exited or exec'd (never blocks)."""
        if not self._gone:
            readable, _, _ = select.select([self.fd], [], [], 0)
            self._gone = bool(readable)  # nothing is ever written: readable means end-of-file
        return self._gone

    def forget(self) -> None:
        """In a forked child: close this inherited read end now (and never again)."""
        if self._close.detach() is not None:
            os.close(self.fd)
        self._gone = True


def gone(guards: Iterable[ChildGuard]) -> list[ChildGuard]:
    """The guards of ``guards`` whose children are gone, in one system call."""
    guards = list(guards)
    waiting = [guard for guard in guards if not guard._gone]
    if waiting:
        readable, _, _ = select.select([guard.fd for guard in waiting], [], [], 0)
        for guard in waiting:
            guard._gone = guard.fd in readable
    return [guard for guard in guards if guard._gone]


class Shared(Protocol):
    """A ring's bookkeeping as a fork sees it (``fastloader.loader.batch_slots.SlotBook``)."""

    def fork_begins(self) -> frozenset[int]:
        """Lock the book (until :meth:`fork_parent` / :meth:`fork_child`); the slots that have views now."""

    def fork_parent(self, slots: frozenset[int], guard: ChildGuard | None) -> None:
        """In the parent: keep ``slots`` out of use until ``guard`` is gone (when given); unlock."""

    def fork_child(self) -> None:
        """In the child: unlock (the child never dispatches its parent's slots)."""


_WATCHED: list[tuple[int, weakref.ref[Shared]]] = []  # (the pid of the book's process, the book)
_FORKING: list[tuple[Shared, frozenset[int]]] = []  # the books locked by the fork under way, and their slots
_PIPE: list[int] = []  # the fork's pipe (read end, write end) while it is under way
_INHERITED: list[int] = []  # in a child: the write ends it holds for its ancestors' slots
_GUARDS: weakref.WeakSet[ChildGuard] = weakref.WeakSet()  # this process's read ends (closed in a child)
_registered = False


def watch(book: Shared) -> None:
    """Keep ``book``'s held slots from being reused while a forked child can see them (its ring's lifetime)."""
    global _registered
    if not _registered:  # once, with the first ring: importing fastloader registers nothing
        os.register_at_fork(before=_before, after_in_parent=_after_in_parent, after_in_child=_after_in_child)
        _registered = True
    pid = os.getpid()
    _WATCHED[:] = [(owner, ref) for owner, ref in _WATCHED if owner == pid and ref() is not None]
    _WATCHED.append((pid, weakref.ref(book)))


def let_go_inherited() -> None:
    """This process (a DataLoaderX worker) never reads the batches its parent held: their slots may be reused."""
    while _INHERITED:
        os.close(_INHERITED.pop())


def _before() -> None:
    pid = os.getpid()
    for owner, ref in _WATCHED:
        book = ref()
        if owner == pid and book is not None:
            _FORKING.append((book, book.fork_begins()))
    if any(slots for _, slots in _FORKING):
        _PIPE.extend(os.pipe2(os.O_CLOEXEC))


def _after_in_parent() -> None:
    guard = None
    if _PIPE:
        read, write = _PIPE
        os.close(write)
        guard = ChildGuard(read)
        _GUARDS.add(guard)
    for book, slots in _FORKING:
        book.fork_parent(slots, guard if slots else None)
    _FORKING.clear()
    _PIPE.clear()


def _after_in_child() -> None:
    for book, _ in _FORKING:
        book.fork_child()
    _FORKING.clear()
    for guard in list(_GUARDS):  # the parent's read ends: never read here
        guard.forget()
    _GUARDS.clear()
    if _PIPE:
        read, write = _PIPE
        os.close(read)
        _INHERITED.append(write)
    _PIPE.clear()
