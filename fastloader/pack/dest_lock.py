"""One writer per pack destination: the lock every ``fastloader pack`` run holds for its whole run.

Two runs into one destination would share its temporary files and progress record, adopt each other's
work and commit a pack that mixes two sources, so :func:`destination_lock` is taken by the engine's door
(:func:`fastloader.pack.engine.pack`, in the driver for ``--engine ray``) before anything is written,
and a second run fails at once with :class:`~fastloader.errors.DestinationLocked`, naming the holder.

The lock is the file ``<DST>.pack.lock`` beside the destination (as ``<DST>.skipped.tsv``; symbolic
links resolved, so two spellings of one directory share it; for an ``s3://`` DST, beside this machine's
staging directory). The run holds an exclusive ``flock`` on it, kept open for the run, and writes its
holder into it: pid, host, when the lock was taken, the process's own start time and its command line.

* ``flock`` is taken atomically and the kernel frees it when its holder dies, even by SIGKILL: a lock
  that cannot be taken is held by a live process, whose record names it.
* A lock taken whose file still names a holder was left by a run that ended without releasing it. On
  this host, a holder whose pid is gone (or is another process now: its start time differs) is taken
  over with a message on stderr. A holder on another host cannot be checked from here (file systems
  shared over the network do not always carry ``flock`` between machines): it is respected unless the
  caller passes ``break_lock=True`` (``--break-lock``), for a run known to be gone.
* Released by removing the file while still locked, then closing it. A run that opened the file just
  before it was removed finds, once it holds the lock, that the path no longer names its file, and
  opens the path again: two runs never both hold a lock on what the path names.

Forked reader processes inherit the open file (``flock`` belongs to the open file, not the process):
the lock stays held until they are gone too, which they are at once when the pack dies
(:mod:`fastloader.pack.orphans`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from fastloader.errors import DestinationLocked

LOCK_SUFFIX = ".pack.lock"
_START_SLACK_S = 1.0  # process start times read twice may differ by rounding
_RECORD_BYTES = 1 << 16  # a record is a few hundred bytes; never read more than this


@dataclass(frozen=True)
class Holder:
    """Who holds a destination's lock (the record in its lock file)."""

    pid: int
    host: str
    since: float  # time.time() when the lock was taken
    process_started: float  # the holder process's start time (psutil), to tell a reused pid
    command: str

    @classmethod
    def this_process(cls) -> Holder:
        pid = os.getpid()
        return cls(pid, socket.gethostname(), time.time(), psutil.Process(pid).create_time(), " ".join(sys.argv))

    def describe(self) -> str:
        since = datetime.datetime.fromtimestamp(self.since).astimezone().isoformat(timespec="seconds")
        return f"pid {self.pid} on host {self.host}, since {since} ({self.command or 'no command line'})"

    def on_this_host(self) -> bool:
        return self.host == socket.gethostname()

    def alive(self) -> bool:
        """Whether the holder process runs on this host (its pid, with its start time: not a reused pid)."""
        try:
            process = psutil.Process(self.pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                return False
            return abs(process.create_time() - self.process_started) <= _START_SLACK_S
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied:  # another user's live process: not ours to judge gone
            return True


def lock_path(target: str | os.PathLike[str]) -> Path:
    """The lock file of the destination ``target`` (a local path): ``<target>.pack.lock`` beside it."""
    resolved = os.path.realpath(os.fspath(target).rstrip(os.sep) or os.sep)
    return Path(resolved + LOCK_SUFFIX)


@contextlib.contextmanager
def destination_lock(target: str | os.PathLike[str], *, break_lock: bool = False) -> Iterator[Path]:
    """Hold the lock of the destination ``target`` for the block (see the module docstring); the lock file.

    Raises :class:`~fastloader.errors.DestinationLocked` naming the holder when another run holds it.
    """
    path = lock_path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _acquire(path, os.fspath(target), break_lock)
    try:
        yield path
    finally:
        _release(path, fd)


def _acquire(path: Path, target: str, break_lock: bool) -> int:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise DestinationLocked(_held_message(target, path, holder)) from None
        except BaseException:
            os.close(fd)
            raise
        if _names(path, fd):
            break
        os.close(fd)  # a run released (removed) the file we opened before we locked it: open the path anew
    try:
        previous = _read(fd)
        if previous is not None:
            _take_over(target, path, previous, break_lock)
        _write(fd, Holder.this_process())
    except BaseException:
        os.close(fd)
        raise
    return fd


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the open file ``fd``."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _held_message(target: str, path: Path, holder: Holder | None) -> str:
    who = holder.describe() if holder is not None else "a process that has not written its record yet"
    text = f"{target}: another fastloader pack is writing into it: {who} (lock {path})."
    if holder is not None and holder.on_this_host() and not holder.alive():
        text += " That process is gone, but a process it started still holds the lock: wait for it to end."
    return text + " Wait for it to finish, or pack into another destination."


def _take_over(target: str, path: Path, previous: Holder, break_lock: bool) -> None:
    """The lock is ours, but its file names an earlier holder: take it over, or refuse (module docstring)."""
    if previous.on_this_host() and not previous.alive():
        _say(f"{target}: taking over the lock of a pack that is gone: {previous.describe()} (lock {path})")
        return
    if break_lock:
        _say(f"{target}: breaking the lock of {previous.describe()} (lock {path}), as asked")
        return
    if previous.on_this_host():
        why = "that process still runs (on a file system whose flock did not stop this run)"
    else:
        why = "a lock of another host cannot be checked from here"
    raise DestinationLocked(
        f"{target}: another fastloader pack holds its lock: {previous.describe()} (lock {path}); {why}. If that"
        " run is gone, run again with --break-lock (break_lock=True)."
    )


def _say(message: str) -> None:
    print(f"fastloader pack: {message}", file=sys.stderr, flush=True)


def _read(fd: int) -> Holder | None:
    """The record of the lock file ``fd``; None when it holds none (new, released, or cut short by a crash)."""
    raw = os.pread(fd, _RECORD_BYTES, 0)
    if not raw.strip():
        return None
    try:
        fields = json.loads(raw)
        return Holder(
            int(fields["pid"]),
            str(fields["host"]),
            float(fields["since"]),
            float(fields["process_started"]),
            str(fields.get("command", "")),
        )
    except (ValueError, TypeError, KeyError):
        return None  # a record cut short by a crash while writing it: nobody to name


def _write(fd: int, holder: Holder) -> None:
    data = json.dumps(dataclasses.asdict(holder)).encode() + b"\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def _release(path: Path, fd: int) -> None:
    try:
        if _names(path, fd):  # else someone removed or replaced it by hand: leave theirs alone
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    finally:
        os.close(fd)
